// model/lr_schedule.h — the learning rate at each optimizer step.
//
//   warmup (step < W):   lr · (step + 1) / W
//   then, with r = (step − W) / max(1, S − W) in [0, 1] and lr_min = lr · final_frac:
//     cosine:    lr_min + ½ (1 + cos(π r)) (lr − lr_min)
//     linear:    lr − r (lr − lr_min)
//     constant:  lr
// S is the total number of steps, W the warmup steps.
#pragma once
#include <cmath>
#include <stdexcept>
#include <string>

namespace knngpt {

enum class LrSchedule { Cosine, Linear, Constant };

inline LrSchedule parse_lr_schedule(const std::string& name) {
    if (name == "cosine") return LrSchedule::Cosine;
    if (name == "linear") return LrSchedule::Linear;
    if (name == "constant") return LrSchedule::Constant;
    throw std::runtime_error("-k: unknown learning-rate schedule '" + name + "' (known: cosine, linear, constant)");
}

inline const char* lr_schedule_name(LrSchedule s) {
    switch (s) {
        case LrSchedule::Cosine: return "cosine";
        case LrSchedule::Linear: return "linear";
        case LrSchedule::Constant: return "constant";
    }
    return "?";
}

inline float learning_rate_at(LrSchedule schedule, float lr, int step, int warmup, int total, float final_frac) {
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (schedule == LrSchedule::Constant) return lr;
    double r = (double)(step - warmup) / (double)(total - warmup > 1 ? total - warmup : 1);
    if (r > 1.0) r = 1.0;
    double lr_min = (double)lr * final_frac;
    if (schedule == LrSchedule::Linear) return (float)(lr - r * (lr - lr_min));
    return (float)(lr_min + 0.5 * (1.0 + std::cos(M_PI * r)) * (lr - lr_min));
}

}  // namespace knngpt
