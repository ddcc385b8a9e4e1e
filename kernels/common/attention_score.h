// kernels/common/attention_score.h — the attention score, defined once for every
// top-k index and every sampler of both backends (ALGORITHMS.md §2.1, §9.3).
//
//   attention_dot(q, k, HS)          acc = 0; for d = 0..HS-1: acc = fmaf(q_d, k_d, acc)
//   attention_tau(HS)                tau = 1 / sqrt(HS)   (fp32 sqrt and division, both correctly rounded)
//   attention_score(q, k, HS, tau)   s = tau * attention_dot(q, k, HS)
//   attention_scores<W>(s, q, keys, count, HS, tau)
//                                    count <= W of them at once: the same chains, run
//                                    side by side so that the fma latency overlaps (on an
//                                    AVX2 host, W = 8, 16, 24, 32: one vector lane per key)
//
// The top-k indexes rank keys by attention_dot (an fp32 multiply by tau > 0 never
// reverses the order, though it can merge two dot products into one score; the
// unscaled chain is also what the vectorised CPU search computes lane by lane);
// the samplers use attention_score. Every rounding is fixed: fmaf is one correctly
// rounded operation in every build (the FMA instruction, or glibc's exact fmaf on a
// CPU without one), and an explicit fma cannot be contracted or split differently by
// either compiler, as `acc += a * b` can. So wherever two kernels must choose the
// same keys bit for bit (the CPU and CUDA searches of the exact index), they call these.
#pragma once
#include <cmath>

#include "kernels/common/hd.h"

// host code with AVX2 and FMA: attention_scores<8 g> loads 8 dimensions of each key at a
// time and transposes them in registers (the same chains, fewer shuffles than a gather)
#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#define KNNGPT_SCORES_AVX2 1
#else
#define KNNGPT_SCORES_AVX2 0
#endif

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
#if KNNGPT_SCORES_AVX2
// acc[g] lane w: the chain of key k[8g + w] over dimensions [0, HS - HS % 8), G groups of
// 8 keys in flight (one fma chain waits ~4 cycles a step: more groups hide it); per
// group, 8 rows of 8 floats (one per key) are transposed into 8 columns (one per
// dimension), each an fma step of the 8 chains
template <int G>
inline void attention_scores_avx2(__m256* acc, const float* q, const float* const* k, int HS) {
    for (int g = 0; g < G; g++) acc[g] = _mm256_setzero_ps();
    for (int d0 = 0; d0 + 8 <= HS; d0 += 8) {
        for (int g = 0; g < G; g++) {
            const float* const* kg = k + 8 * g;
            __m256 r[8];
            for (int w = 0; w < 8; w++) r[w] = _mm256_loadu_ps(kg[w] + d0);
            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            // column d0 + c: element c of every key, lanes in key order
            const __m256 col[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                                   _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                                   _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                                   _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
            for (int c = 0; c < 8; c++) acc[g] = _mm256_fmadd_ps(_mm256_set1_ps(q[d0 + c]), col[c], acc[g]);
        }
    }
}
#endif

// Asks the host's caches for a key that attention_scores will read soon (the samplers
// know their keys well before they score them); nothing on a device.
KNNGPT_HD void attention_prefetch_key(const float* k, int HS) {
#if !defined(__CUDA_ARCH__) && defined(__GNUC__)
    for (int d = 0; d < HS; d += 16) __builtin_prefetch(k + d);
#else
    (void)k, (void)HS;
#endif
}

template <int W>
KNNGPT_HD void attention_scores(float* out, const float* q, const float* const* keys, int count, int HS, float tau) {
    float acc[W];
    const float* k[W];
    for (int w = 0; w < W; w++) {
        acc[w] = 0.0f;
        k[w] = keys[w < count ? w : 0];  // unused lanes repeat lane 0 (count >= 1)
    }
    int d = 0;
#if KNNGPT_SCORES_AVX2
    if constexpr (W % 8 == 0 && W <= 32) {
        __m256 lanes[W / 8];
        attention_scores_avx2<W / 8>(lanes, q, k, HS);
        for (int g = 0; g < W / 8; g++) _mm256_storeu_ps(acc + 8 * g, lanes[g]);
        d = HS - HS % 8;
    }
#endif
    for (; d < HS; d++) {
        const float qd = q[d];
        for (int w = 0; w < W; w++) acc[w] = fmaf(qd, k[w][d], acc[w]);
    }
    for (int w = 0; w < count; w++) out[w] = tau * acc[w];
}

}  // namespace knngpt
