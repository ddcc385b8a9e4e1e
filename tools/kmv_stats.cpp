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
//                   [--alpha 0.3333] [--attn-seed 0]
// -m: validation batches (default 10; -1 = all).
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

struct Tally {
    double rows = 0, heavy_abs = 0, heavy_rel = 0, empty_abs = 0, empty_rel = 0, mass_abs = 0, mass_rel = 0;
    double list_mass_abs = 0, list_mass_rel = 0, list_heavy_abs = 0, list_heavy_rel = 0;
    double candidates_abs = 0, candidates_rel = 0, c_kernel = 0, heads = 0;
    void add(const Tally& o) {
        rows += o.rows, heavy_abs += o.heavy_abs, heavy_rel += o.heavy_rel, empty_abs += o.empty_abs;
        empty_rel += o.empty_rel, mass_abs += o.mass_abs, mass_rel += o.mass_rel;
        list_mass_abs += o.list_mass_abs, list_mass_rel += o.list_mass_rel;
        list_heavy_abs += o.list_heavy_abs, list_heavy_rel += o.list_heavy_rel;
        candidates_abs += o.candidates_abs, candidates_rel += o.candidates_rel, c_kernel += o.c_kernel, heads += o.heads;
    }
    void print(const char* label) const {
        const double r = rows;
        std::printf("%-8s %7.2f %6.3f %6.3f   %7.2f %6.3f %6.3f   %6.2f %6.3f %6.1f   %6.2f %6.3f %6.1f   %8.3f\n", label,
                    heavy_abs / r, empty_abs / r, mass_abs / r, heavy_rel / r, empty_rel / r, mass_rel / r,
                    list_heavy_abs / r, list_mass_abs / r, candidates_abs / r, list_heavy_rel / r, list_mass_rel / r,
                    candidates_rel / r, c_kernel / heads);
    }
};

double dot(const float* a, const float* b, int n) {
    double sum = 0.0;
    for (int c = 0; c < n; c++) sum += (double)a[c] * (double)b[c];
    return sum;
}

[[noreturn]] void usage_error(const std::string& msg) {
    std::fprintf(stderr, "kmv_stats: %s\n", msg.c_str());
    std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path, val_path;
    int B = 12, T = 64, max_batches = 10, k = 8, m = 8;
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
        else usage_error("unknown flag " + flag);
    }
    if (model_path.empty() || val_path.empty()) usage_error("usage: kmv_stats -e MODEL_FILE -j VAL_TOKENS [options]");
    if (B < 1 || T < 1 || k < 1 || m < 1 || !(alpha > 0)) usage_error("need -b, -t, --attn-k, --attn-tail >= 1, --alpha > 0");
    try {
        const ModelFile file = read_model_file(model_path);
        const GPTConfig& cfg = file.config;
        GPT model;
        gpt_build(model, cfg, file.params, B, T);
        DataLoader loader(val_path, B, T, 0, 1, false, 1, cfg.vocab_size);
        int batches = (int)loader.batches_per_epoch();
        if (max_batches >= 0) batches = std::min(batches, max_batches);
        const int L = cfg.num_layers, NH = cfg.num_heads, C = cfg.channels, HS = C / NH, K = k + m;
        if (T <= K) usage_error("-t must exceed k + m: no row is estimated");
        const double sqrt_d = std::sqrt((double)HS);
        std::vector<Tally> tally((size_t)L * NH);
        std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
        std::vector<int> idx((size_t)B * NH * T * K);
        std::vector<float> logw(idx.size());
        for (int batch = 0; batch < batches; batch++) {
            loader.next_batch(inputs.data(), targets.data());
            gpt_forward(model, inputs.data(), targets.data(), B, T, 0);
            for (int l = 0; l < L; l++) {
                const float* qkv = model.acts.qkv + (size_t)l * B * T * 3 * C;
                // kmv's lists, both thresholds
                std::vector<int> list_heavy[2];
                ops::KmvStats stats[2];
                for (int mode = 0; mode < 2; mode++) {
                    ops::KmvParams p;
                    p.light_samples = m;
                    p.heavy_alpha = (float)alpha;
                    p.threshold = mode == 0 ? KmvThreshold::Absolute : KmvThreshold::Relative;
                    p.seed = attn_seed;
                    p.step = (uint32_t)batch;
                    p.layer = l;
                    ops::kmv_select_keys(idx.data(), logw.data(), qkv, B, T, C, NH, K, p, &stats[mode]);
                    list_heavy[mode].assign(idx.begin(), idx.end());
                    for (size_t e = 0; e < idx.size(); e++)  // heavy slots: logw 0 in an estimated row
                        if (logw[e] != 0.0f) list_heavy[mode][e] = -1;
                }
                for (int b = 0; b < B; b++) {
                    for (int h = 0; h < NH; h++) {
                        Tally& t = tally[(size_t)l * NH + h];
                        const ops::AttentionHeadOffsets at = ops::attention_head_offsets(b, h, T, C, HS);
                        const float* q = qkv + at.q;
                        const float* kk = qkv + at.k;
                        double radius2 = 0.0;
                        std::vector<double> s(T), prob(T);
                        for (int i = 0; i < T; i++) {
                            const float* q_i = q + (size_t)i * 3 * C;
                            radius2 = std::max(radius2, dot(kk + (size_t)i * 3 * C, kk + (size_t)i * 3 * C, HS));
                            if (i + 1 <= K) continue;
                            double largest = -HUGE_VAL, z = 0.0;
                            for (int j = 0; j <= i; j++) {
                                s[j] = dot(q_i, kk + (size_t)j * 3 * C, HS) / sqrt_d;
                                largest = std::max(largest, s[j]);
                            }
                            for (int j = 0; j <= i; j++) z += prob[j] = std::exp(s[j] - largest);
                            const double alpha_log_n = alpha * std::log((double)(i + 1));
                            const double row_offset = (dot(q_i, q_i, HS) + radius2) / (2.0 * sqrt_d);
                            int n_abs = 0, n_rel = 0;
                            double mass_abs = 0.0, mass_rel = 0.0;
                            for (int j = 0; j <= i; j++) {
                                if (s[j] - row_offset >= -alpha_log_n) n_abs++, mass_abs += prob[j] / z;
                                if (s[j] >= largest - alpha_log_n) n_rel++, mass_rel += prob[j] / z;
                            }
                            t.rows++;
                            t.heavy_abs += n_abs, t.heavy_rel += n_rel, t.mass_abs += mass_abs, t.mass_rel += mass_rel;
                            t.empty_abs += n_abs == 0, t.empty_rel += n_rel == 0;
                            const size_t row = (((size_t)b * NH + h) * T + i) * K;
                            for (int slot = 0; slot < K; slot++) {
                                const int ja = list_heavy[0][row + slot], jr = list_heavy[1][row + slot];
                                if (ja >= 0) t.list_heavy_abs++, t.list_mass_abs += prob[ja] / z;
                                if (jr >= 0) t.list_heavy_rel++, t.list_mass_rel += prob[jr] / z;
                            }
                        }
                        t.c_kernel += ops::measure_assumption_a(qkv, b, h, T, C, NH).c_kernel;
                        t.heads++;
                    }
                }
                // candidates: the stats are per layer, so every head gets the layer's mean
                for (int h = 0; h < NH; h++) {
                    tally[(size_t)l * NH + h].candidates_abs += (double)stats[0].candidates / NH;
                    tally[(size_t)l * NH + h].candidates_rel += (double)stats[1].candidates / NH;
                }
            }
        }
        std::printf("kmv_stats: %s, %d validation batches of %d x %d, k %d, m %d, alpha %.4f; rows with n_i > %d\n",
                    model_path.c_str(), batches, B, T, k, m, alpha, K);
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
