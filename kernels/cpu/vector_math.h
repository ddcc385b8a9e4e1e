// kernels/cpu/vector_math.h — exp, tanh and a double dot product written so that the
// loops calling them vectorise. No CUDA twin: the CUDA kernels call the device's expf and
// tanhf. (The samplers' fp64 exp and log, which both backends share, are
// kernels/common/sampler_exp.h and sampler_log.h.)
//
//   exp_vectorizable(x): x = n ln2 + r with n = round(x / ln2), |r| <= ln2/2;
//     exp(r) by its degree-7 Taylor polynomial (truncation r^8/8! < 6e-9), and 2^n
//     built in the exponent bits. Relative error < 1e-7 (about 1 ulp) for
//     -87 <= x <= 88; returns 0 below -87 (exp(-87) ~ 1.6e-38, negligible next
//     to the largest term of a softmax); clamps at exp(88) above 88; NaN stays NaN.
//   tanh_vectorizable(u) = 1 - 2 / (1 + exp(2u)): absolute error ~1e-7, exactly
//     +-1 in the tails (fine inside GELU, where it is added to 1).
//   dot_f64_lanes(a, b, n) = sum_c a_c b_c in double for float inputs: the products
//     are exact in double; the sum runs as 8 interleaved partial sums (lane c % 8),
//     added in a fixed order, instead of one dependent chain of n adds. Its value
//     differs from the sequential sum by rounding only.
//
// Design: libm's expf and tanhf are scalar calls, which g++ does not replace by vector
// versions without -ffast-math; the softmaxes (attention, classifier) and GELU evaluate
// them on every element, so these plain-arithmetic versions, which g++ inlines and
// vectorises, stand in for them.
#pragma once

#include <cstdint>
#include <cstring>

namespace knngpt::cpu {

// c0 r^n + c1 r^(n-1) + ... + cn in Horner form (a multiply and an add a step, which the
// compiler may fuse where the target has FMA); a fold, so no loop to unroll
template <class... C>
inline float horner(float r, float c0, C... c) {
    float p = c0;
    ((p = p * r + c), ...);
    return p;
}

inline float exp_vectorizable(float x) {
    const float clamped = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);
    // n = round(x / ln2): adding 1.5 * 2^23 pushes the fraction out of the mantissa
    const float round_shift = 12582912.0f;
    const float shifted = clamped * 1.44269504088896341f + round_shift;
    const float n = shifted - round_shift;
    // r = x - n ln2, with ln2 split in two so that n * ln2_hi is exact
    const float ln2_hi = 0.693115234375f, ln2_lo = 3.194618494528623e-05f;
    const float r = (clamped - n * ln2_hi) - n * ln2_lo;
    // exp(r) = sum_{k<=7} r^k / k!
    const float p = horner(r, 1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f,
                           1.0f);
    // 2^n: n sits in the low mantissa bits of `shifted`; move it into the exponent field
    uint32_t shifted_bits;
    std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
    const uint32_t scale_bits = (shifted_bits - 0x4b400000u + 127u) << 23;
    float scale;
    std::memcpy(&scale, &scale_bits, sizeof scale);
    return x < -87.0f ? 0.0f : p * scale;
}

inline float tanh_vectorizable(float u) {
    return 1.0f - 2.0f / (1.0f + exp_vectorizable(2.0f * u));
}

inline double dot_f64_lanes(const float* a, const float* b, int n) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) lane[l] += (double)a[c + l] * (double)b[c + l];
    for (; c < n; c++) lane[c % 8] += (double)a[c] * (double)b[c];
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

}  // namespace knngpt::cpu
