// kernels/cpu/vector_math.h — exp, tanh and a double dot product written so that loops
// calling them vectorise.
//
// libm's expf and tanhf are scalar calls (about 3 ns and 19 ns each here), and
// without -ffast-math g++ will not swap in vector versions. The softmaxes
// (attention, classifier) and GELU evaluate them on every element, so these
// plain-arithmetic versions, which g++ inlines and vectorises, matter.
//
//   exp_vectorizable(x): x = n ln2 + r with n = round(x / ln2), |r| <= ln2/2;
//     exp(r) by its degree-7 Taylor polynomial (truncation r^8/8! < 6e-9), and 2^n
//     built in the exponent bits. Relative error < 1e-7 (about 1 ulp) for
//     -87 <= x <= 88; returns 0 below -87 (exp(-87) ~ 1.6e-38, negligible next
//     to the largest term of a softmax); clamps at exp(88) above 88; NaN stays NaN.
//   tanh_vectorizable(u) = 1 - 2 / (1 + exp(2u)): absolute error ~1e-7, exactly
//     +-1 in the tails (fine inside GELU, where it is added to 1).
//   exp_f64_vectorizable(x): the same reduction in double (ln2 split as fdlibm's, so
//     that n * ln2_hi is exact), exp(r) by its degree-13 Taylor polynomial (truncation
//     r^14/14! < 5e-18), 2^n in the exponent bits. Relative error < 4e-16 (about 2 ulp)
//     for -708 <= x <= 709; 0 below -708 (exp(-708) ~ 3e-308); clamps above 709.
//   dot_f64_lanes(a, b, n) = sum_c a_c b_c in double for float inputs: the products
//     are exact in double; the sum runs as 8 interleaved partial sums (lane c % 8),
//     added in a fixed order, instead of one dependent chain of n adds (4 cycles
//     each). Its value differs from the sequential sum by rounding only.
#pragma once

#include <cstdint>
#include <cstring>

namespace knngpt::cpu {

// c[0] r^(N-1) + ... + c[N-1] in Horner form, highest power first
template <class F, int N>
inline F horner(F r, const F (&c)[N]) {
    F p = c[0];
    for (int k = 1; k < N; k++) p = p * r + c[k];
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
    static constexpr float kTaylor[] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                        1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
    const float p = horner(r, kTaylor);
    // 2^n: n sits in the low mantissa bits of `shifted`; move it into the exponent field
    uint32_t shifted_bits;
    std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
    const uint32_t scale_bits = (shifted_bits - 0x4b400000u + 127u) << 23;
    float scale;
    std::memcpy(&scale, &scale_bits, sizeof scale);
    return x < -87.0f ? 0.0f : p * scale;
}

inline double exp_f64_vectorizable(double x) {
    const double clamped = x > 709.0 ? 709.0 : (x < -708.0 ? -708.0 : x);
    // n = round(x / ln2): adding 1.5 * 2^52 pushes the fraction out of the mantissa
    const double round_shift = 6755399441055744.0;
    const double shifted = clamped * 1.4426950408889634074 + round_shift;
    const double n = shifted - round_shift;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double r = (clamped - n * ln2_hi) - n * ln2_lo;
    // exp(r) = sum_{k<=13} r^k / k!
    static constexpr double kTaylor[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                                         1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,
                                         1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,        0.5,
                                         1.0,                1.0};
    const double p = horner(r, kTaylor);
    // 2^n: n sits in the low mantissa bits of `shifted`; move it into the exponent field
    uint64_t shifted_bits;
    std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
    const uint64_t scale_bits = (shifted_bits - 0x4338000000000000ull + 1023ull) << 52;
    double scale;
    std::memcpy(&scale, &scale_bits, sizeof scale);
    return x < -708.0 ? 0.0 : p * scale;
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
