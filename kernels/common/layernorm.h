// kernels/common/layernorm.h — the per-element formulas of layer normalisation and
// its constant, once for both backends (kernels/cpu/layernorm.h,
// kernels/cuda/layernorm.cuh); the backends differ in how they sum a row, and in
// where their compilers fuse a multiply and an add (nvcc always; g++ when the target
// has FMA), which only a tolerance sees.
//
//   mean  = (1/C) sum_c x_c,   rstd = 1 / sqrt((1/C) sum_c (x_c - mean)^2 + eps),  eps = 1e-5
//   y_c   = (x_c - mean) rstd w_c + b_c
//   with norm_c = (x_c - mean) rstd and dnorm_c = w_c dy_c:
//   dx_c  = rstd (dnorm_c - mean_c(dnorm) - norm_c mean_c(dnorm norm))
#pragma once
#include <cmath>

#include "kernels/common/hd.h"

namespace knngpt {

constexpr float kLayerNormEps = 1e-5f;

// rstd from the row's sum of squared deviations over C channels.
KNNGPT_HD float layernorm_rstd(float sum_squared_deviations, int C) {
    return 1.0f / sqrtf(sum_squared_deviations / (float)C + kLayerNormEps);
}

KNNGPT_HD float layernorm_normalised(float x, float mean, float rstd) { return (x - mean) * rstd; }

KNNGPT_HD float layernorm_output(float x, float mean, float rstd, float weight, float bias) {
    return layernorm_normalised(x, mean, rstd) * weight + bias;
}

// dx_c, given the row means dnorm_mean = mean_c(dnorm) and dnorm_norm_mean = mean_c(dnorm norm).
KNNGPT_HD float layernorm_input_gradient(float norm, float dnorm, float rstd, float dnorm_mean, float dnorm_norm_mean) {
    return rstd * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
}

}  // namespace knngpt
