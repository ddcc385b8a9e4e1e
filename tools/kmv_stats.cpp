// tools/kmv_stats.cpp — how much of each attention row kmv's heavy keys hold
// on a trained model (ALGORITHMS.md §7.4, §7.7).
//
// Runs the model's forward with exact attention on validation batches and, per
// layer and head, over the rows kmv estimates (n_i = i + 1 > K = k + m), with
// p_ij the exact softmax of row i and s_ij = q_i . k_j / sqrt(D):
//   absolute  heavy: log K_ij >= -alpha log n_i, log K_ij = s_ij - (|q_i|^2 + R_i^2) / (2 sqrt(D))
//             ([P2]'s threshold, §7.3's kernel with the causal radius R_i)
//   relative  heavy: s_ij >= max_{j' <= i} s_ij' - alpha log n_i (the threshold taken
//             from the row's largest entry, here over all keys, not only LSH candidates)
// prints the mean number of heavy keys per row, the fraction of rows with none,
// and the mean fraction sum_{j heavy} p_ij of the row's mass they hold; then
// for kmv's lists as the model would use them (kmv_select_keys, both thresholds:
// LSH recall and the heavy budget of k included) the mass of the heavy slots and
// the LSH candidates per row; and ĉ of assumption A (measure_assumption_a) of the
// kernel matrix per head, averaged over the batch rows.
//
//   build/kmv_stats -e MODEL_FILE -j VAL_TOKENS [-b 12] [-t 64] [-m BATCHES] [--attn-k 8] [--attn-tail 8]
//                   [--alpha 0.3333] [--attn-seed 0] [--attn-kmv-levels 1]
// -m: validation batches (default 10; -1 = all). --attn-kmv-levels: the LSH width
// levels of kmv's lists (KmvParams::width_levels, the trainer's flag of that name).
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "model/checkpoint.h"
#include "model/gpt.h"

using namespace knngpt;

namespace {

// one head's kmv tally (kernels/cpu/kmv_attention.h) and its assumption-A c^, summed over batches
struct Tally {
    ops::KmvHeavyTally kmv;
    double c_kernel = 0, heads = 0;
    void add(const Tally& o) { kmv.add(o.kmv), c_kernel += o.c_kernel, heads += o.heads; }
    void print(const char* label) const {
        const ops::KmvHeavyTally& t = kmv;
        const double r = t.rows;
        std::printf("%-8s %7.2f %6.3f %6.3f   %7.2f %6.3f %6.3f   %6.2f %6.3f %6.1f   %6.2f %6.3f %6.1f   %8.3f\n", label,
                    t.heavy_abs / r, t.empty_abs / r, t.mass_abs / r, t.heavy_rel / r, t.empty_rel / r, t.mass_rel / r,
                    t.list_heavy_abs / r, t.list_mass_abs / r, t.candidates_abs / r, t.list_heavy_rel / r,
                    t.list_mass_rel / r, t.candidates_rel / r, c_kernel / heads);
    }
};

[[noreturn]] void usage_error(const std::string& msg) {
    std::fprintf(stderr, "kmv_stats: %s\n", msg.c_str());
    std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path, val_path;
    int B = 12, T = 64, max_batches = 10, k = 8, m = 8, levels = 1;
    double alpha = 1.0 / 3;
    uint64_t attn_seed = 0;
    for (int a = 1; a < argc; a++) {
        const std::string flag = argv[a];
        if (a + 1 >= argc) usage_error("flag " + flag + " needs a value");
        const char* v = argv[++a];
        char* end = nullptr;
        auto number = [&]() {
            const double x = std::strtod(v, &end);
            if (end == v || *end) usage_error("flag " + flag + ": not a number: " + v);
            return x;
        };
        if (flag == "-e") model_path = v;
        else if (flag == "-j") val_path = v;
        else if (flag == "-b") B = (int)number();
        else if (flag == "-t") T = (int)number();
        else if (flag == "-m") max_batches = (int)number();
        else if (flag == "--attn-k") k = (int)number();
        else if (flag == "--attn-tail") m = (int)number();
        else if (flag == "--alpha") alpha = number();
        else if (flag == "--attn-seed") attn_seed = (uint64_t)number();
        else if (flag == "--attn-kmv-levels") levels = (int)number();
        else usage_error("unknown flag " + flag);
    }
    if (model_path.empty() || val_path.empty()) usage_error("usage: kmv_stats -e MODEL_FILE -j VAL_TOKENS [options]");
    if (B < 1 || T < 1 || k < 1 || m < 1 || !(alpha > 0)) usage_error("need -b, -t, --attn-k, --attn-tail >= 1, --alpha > 0");
    if (!kmv_width_levels_ok(levels)) usage_error("--attn-kmv-levels must be in 1..8");
    try {
        const ModelFile file = read_model_file(model_path);
        const GPTConfig& cfg = file.config;
        GPT model;
        gpt_build(model, cfg, file.params, B, T);
        DataLoader loader(val_path, B, T, 0, 1, false, 1, cfg.vocab_size);
        int batches = (int)loader.batches_per_epoch();
        if (max_batches >= 0) batches = std::min(batches, max_batches);
        const int L = cfg.num_layers, NH = cfg.num_heads, C = cfg.channels, K = k + m;
        if (T <= K) usage_error("-t must exceed k + m: no row is estimated");
        std::vector<Tally> tally((size_t)L * NH);
        std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
        std::vector<ops::KmvHeavyTally> layer_tally(NH);
        for (int batch = 0; batch < batches; batch++) {
            loader.next_batch(inputs.data(), targets.data());
            gpt_forward(model, inputs.data(), targets.data(), B, T, 0);
            for (int l = 0; l < L; l++) {
                const float* qkv = model.acts.qkv + (size_t)l * B * T * 3 * C;
                ops::KmvParams p;
                p.light_samples = m;
                p.heavy_alpha = (float)alpha;
                p.seed = attn_seed;
                p.width_levels = levels;
                p.step = (uint32_t)batch;
                p.layer = l;
                std::fill(layer_tally.begin(), layer_tally.end(), ops::KmvHeavyTally{});
                ops::measure_kmv_heavy(layer_tally.data(), qkv, B, T, C, NH, K, p);
                for (int h = 0; h < NH; h++) {
                    Tally& t = tally[(size_t)l * NH + h];
                    t.kmv.add(layer_tally[h]);
                    for (int b = 0; b < B; b++) t.c_kernel += ops::measure_assumption_a(qkv, b, h, T, C, NH).c_kernel;
                    t.heads += B;
                }
            }
        }
        std::printf("kmv_stats: %s, %d validation batches of %d x %d, k %d, m %d, alpha %.4f, %d width level%s; "
                    "rows with n_i > %d\n",
                    model_path.c_str(), batches, B, T, k, m, alpha, levels, levels > 1 ? "s" : "", K);
        std::printf("         |  absolute (all keys)    |  relative (all keys)    |  kmv lists, absolute |  kmv lists, relative |\n");
        std::printf("head     | heavy  none   mass      | heavy  none   mass      | heavy  mass  cand.   | heavy  mass  cand.   | c^ kernel\n");
        Tally all;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < NH; h++) {
                const std::string label = "L" + std::to_string(l) + " H" + std::to_string(h);
                tally[(size_t)l * NH + h].print(label.c_str());
                all.add(tally[(size_t)l * NH + h]);
            }
        all.print("all");
    } catch (const std::exception& e) {
        usage_error(e.what());
    }
    return 0;
}
