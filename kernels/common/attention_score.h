// kernels/common/attention_score.h — the attention score, defined once for every
// top-k index and every sampler of both backends (ALGORITHMS.md §2.1, §9.3).
//
//   attention_dot(q, k, HS)          acc = 0; for d = 0..HS-1: acc = fmaf(q_d, k_d, acc)
//   attention_tau(HS)                tau = 1 / sqrt(HS)   (fp32 sqrt and division, both correctly rounded)
//   attention_score(q, k, HS, tau)   s = tau * attention_dot(q, k, HS)
//   attention_scores<W>(s, q, keys, count, HS, tau)
//                                    count <= W of them at once: the same chains, run
//                                    side by side so that the fma latency overlaps
//
// The top-k indexes rank keys by attention_dot (an fp32 multiply by tau > 0 never
// reverses the order, though it can merge two dot products into one score; the
// unscaled chain is also what the vectorised CPU search computes lane by lane);
// the samplers use attention_score. Every rounding is fixed: fmaf is one correctly
// rounded operation in every build (the FMA instruction, or glibc's exact fmaf on a
// CPU without one), and an explicit fma cannot be contracted or split differently by
// either compiler, as `acc += a * b` can. So wherever two kernels must choose the
// same keys bit for bit (CPU and CUDA, brute and block index), they call these.
#pragma once
#include <cmath>

#include "kernels/common/hd.h"

// tau and every score must be the correctly rounded operations the host computes;
// --use_fast_math would replace sqrtf and the division by approximations
#if defined(__CUDACC__) && defined(__USE_FAST_MATH__)
#error "kernels/common/attention_score.h: build without --use_fast_math (the scores must equal the CPU's bit for bit)"
#endif

namespace knngpt {

KNNGPT_HD float attention_dot(const float* q, const float* k, int HS) {
    float acc = 0.0f;
    for (int d = 0; d < HS; d++) acc = fmaf(q[d], k[d], acc);
    return acc;
}

KNNGPT_HD float attention_tau(int HS) { return 1.0f / sqrtf((float)HS); }

KNNGPT_HD float attention_score(const float* q, const float* k, int HS, float tau) {
    return tau * attention_dot(q, k, HS);
}

// out[w] = attention_score(q, keys[w], HS, tau) for w < count <= W, bit for bit: each
// lane is attention_dot's chain; interleaving W of them only hides the latency of
// each fma behind the others (one chain waits ~4 cycles per step).
template <int W>
KNNGPT_HD void attention_scores(float* out, const float* q, const float* const* keys, int count, int HS, float tau) {
    float acc[W];
    const float* k[W];
    for (int w = 0; w < W; w++) {
        acc[w] = 0.0f;
        k[w] = keys[w < count ? w : 0];  // unused lanes repeat lane 0 (count >= 1)
    }
    for (int d = 0; d < HS; d++) {
        const float qd = q[d];
        for (int w = 0; w < W; w++) acc[w] = fmaf(qd, k[w][d], acc[w]);
    }
    for (int w = 0; w < count; w++) out[w] = tau * acc[w];
}

}  // namespace knngpt
