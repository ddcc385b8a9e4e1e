// tools/attention_meters.h — how far each approximate attention mode is from exact
// attention on a model's own q, k, v, per head (tools/attn_meter; ALGORITHMS.md §2.2,
// §7.7).
//
// One layer's qkv (1, T, 3C) of one validation window (tools/qkv_capture.h), head h,
// row i, n_i = i + 1 causal keys:
//   reference  O_i: the key-list softmax (sparse_attention_forward) over every causal
//              key, slots 0..i; the same kernel the modes use, so what is measured is
//              the approximation alone, not two kernels' rounding (it equals
//              attention_forward to fp32 rounding; test_attention_meters checks it)
//   error      |Ô_i - O_i| / |O_i| for each mode at each k, Ô_i from the model's own
//              dispatch (attention_layer_forward: knn, knn-tail with m samples, gumbel,
//              kmv with m light samples and heavy budget k); rows with O_i = 0 are
//              left out and counted
//   mass       the softmax mass of the top-k set S_i, exp(L̂_i - L_i) from the two
//              forwards' log normalisers (§2.2: ρ_i = 1 - mass)
//   bound      §2.2's bound on knn's error, relative: 2 ρ_i max_{j <= i} |v_j| / |O_i|
//   kmv        measure_kmv_heavy (kernels/cpu/kmv_attention.h) at K = k + m: heavy keys
//              among all causal keys and in kmv's lists, their fraction and mass
//   c          measure_assumption_a (§7.7): c^ of the causal kernel matrix, n = T
// Statistics are pooled over windows: mean and max (mass: min) over every row i of
// every window. Work per (layer, window): O(T^2 D NH) for the reference, then per k
// one causal top-k search and each mode's forward; kmv's heavy tally O(T^2 D NH) per k.
// CPU build only: measure_kmv_heavy and measure_assumption_a are diagnostics of
// kernels/cpu/kmv_attention.h, with no CUDA twin.
#pragma once
#include <cmath>
#include <limits>
#include <vector>

#include "model/attention.h"
#include "model/backend.h"

namespace knngpt {

// mean, min and max of values added one row at a time
struct RowStats {
    double rows = 0, sum = 0;
    double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
    void add(double x) {
        rows++, sum += x;
        min = std::min(min, x), max = std::max(max, x);
    }
    double mean() const { return rows > 0 ? sum / rows : NAN; }
};

struct MeterSpec {
    std::vector<int> ks;                 // each 1 <= k <= T
    std::vector<AttnMode> modes = {AttnMode::Knn};  // knn is always measured (it gives the mass)
    int tail = 8;                        // m of knn-tail and kmv
    int gumbel_groups = 3, gumbel_samples = 8;
    float kmv_alpha = kKmvDefaultAlpha;
    KmvThreshold kmv_threshold = KmvThreshold::Absolute;
    int kmv_levels = 1;                  // kmv's LSH width levels
    uint64_t seed = 0;                   // the draws of knn-tail, gumbel and kmv
};

// One (layer, head), pooled over windows; the vectors are indexed [mode][k] or [k].
struct HeadMeter {
    std::vector<std::vector<RowStats>> error;
    std::vector<RowStats> mass, bound;
    std::vector<ops::KmvHeavyTally> kmv;
    long long zero_rows = 0;  // rows with O_i = 0, left out of the errors
};

inline std::vector<HeadMeter> new_head_meters(int NH, const MeterSpec& spec) {
    HeadMeter m;
    m.error.assign(spec.modes.size(), std::vector<RowStats>(spec.ks.size()));
    m.mass.resize(spec.ks.size());
    m.bound.resize(spec.ks.size());
    m.kmv.resize(spec.ks.size());
    return std::vector<HeadMeter>(NH, m);
}

// Adds window `window` of layer `layer` (qkv (1, T, 3C)) to heads[0..NH). The draws
// are those of batch row `window` at step 0 (every window its own samples).
inline void meter_attention_layer(std::vector<HeadMeter>& heads, const float* qkv, int T, int C, int NH, int layer,
                                  int window, const MeterSpec& spec) {
    const int HS = C / NH, C3 = 3 * C;
    const uint32_t step = 0;
    // the reference: every causal key in the list
    std::vector<int> full((size_t)NH * T * T);
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < T; i++)
            for (int t = 0; t < T; t++) full[((size_t)h * T + i) * T + t] = t <= i ? t : -1;
    std::vector<float> ref((size_t)T * C), ref_lse((size_t)NH * T);
    ops::sparse_attention_forward(ref.data(), ref_lse.data(), qkv, full.data(), nullptr, 1, T, C, NH, T);
    full = {};
    auto norm = [&](const float* x) {
        double s = 0;
        for (int c = 0; c < HS; c++) s += (double)x[c] * x[c];
        return std::sqrt(s);
    };
    std::vector<double> ref_norm((size_t)NH * T), value_max((size_t)NH * T);  // |O_i|, max_{j <= i} |v_j|
    for (int h = 0; h < NH; h++) {
        double largest = 0;
        for (int i = 0; i < T; i++) {
            largest = std::max(largest, norm(qkv + (size_t)i * C3 + 2 * C + h * HS));
            value_max[(size_t)h * T + i] = largest;
            ref_norm[(size_t)h * T + i] = norm(ref.data() + (size_t)i * C + h * HS);
        }
    }
    std::vector<float> out((size_t)T * C), lse((size_t)NH * T);
    for (size_t ki = 0; ki < spec.ks.size(); ki++) {
        const int k = spec.ks[ki];
        for (size_t mi = 0; mi < spec.modes.size(); mi++) {
            AttnConfig a;
            a.mode = spec.modes[mi];
            a.k = k;
            a.tail = a.mode == AttnMode::KnnTail || a.mode == AttnMode::Kmv ? spec.tail : 0;
            a.gumbel_groups = spec.gumbel_groups, a.gumbel_samples = spec.gumbel_samples;
            if (a.mode == AttnMode::Kmv) {
                a.kmv_threshold = spec.kmv_threshold;
                a.kmv_levels = spec.kmv_levels;
                a.kmv_alpha = spec.kmv_alpha;
            }
            a.seed = spec.seed;
            const int K = a.list_size();
            std::vector<int> idx((size_t)NH * T * K), topk((size_t)NH * T * k);
            std::vector<float> logw(idx.size());
            const AttnLayerCall call{a, step, window, layer, {idx.data(), logw.data(), K}, {topk.data()}};
            attention_layer_forward(call, out.data(), lse.data(), qkv, 1, T, C, NH);
            for (int h = 0; h < NH; h++) {
                HeadMeter& m = heads[h];
                for (int i = 0; i < T; i++) {
                    const size_t r = (size_t)h * T + i;
                    double diff2 = 0;
                    for (int c = 0; c < HS; c++) {
                        const double d = (double)out[(size_t)i * C + h * HS + c] - ref[(size_t)i * C + h * HS + c];
                        diff2 += d * d;
                    }
                    if (ref_norm[r] > 0) m.error[mi][ki].add(std::sqrt(diff2) / ref_norm[r]);
                    else if (mi == 0 && ki == 0) m.zero_rows++;
                    if (a.mode != AttnMode::Knn) continue;
                    const double mass = std::exp((double)lse[r] - (double)ref_lse[r]);
                    m.mass[ki].add(mass);
                    if (ref_norm[r] > 0) m.bound[ki].add(2.0 * std::max(1.0 - mass, 0.0) * value_max[r] / ref_norm[r]);
                }
            }
        }
        for (AttnMode mode : spec.modes) {
            if (mode != AttnMode::Kmv) continue;
            ops::KmvParams p;
            p.light_samples = spec.tail;
            p.heavy_alpha = spec.kmv_alpha;
            p.width_levels = spec.kmv_levels;
            p.seed = spec.seed;
            p.step = step;
            p.layer = layer;
            p.batch0 = window;
            std::vector<ops::KmvHeavyTally> tally(NH);
            ops::measure_kmv_heavy(tally.data(), qkv, 1, T, C, NH, k + spec.tail, p);
            for (int h = 0; h < NH; h++) heads[h].kmv[ki].add(tally[h]);
        }
    }
}

// c^ of assumption A per head of one layer's qkv (B, T, 3C), the mean over the B rows.
inline std::vector<ops::AssumptionA> assumption_a_of_layer(const float* qkv, int B, int T, int C, int NH) {
    std::vector<ops::AssumptionA> c(NH, ops::AssumptionA{0, 0, 0});
    for (int h = 0; h < NH; h++) {
        for (int b = 0; b < B; b++) {
            const ops::AssumptionA a = ops::measure_assumption_a(qkv, b, h, T, C, NH);
            c[h].c_kernel += a.c_kernel / B, c[h].c_raw += a.c_raw / B, c[h].c_causal_radius += a.c_causal_radius / B;
        }
    }
    return c;
}

}  // namespace knngpt
