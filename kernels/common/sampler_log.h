// kernels/common/sampler_log.h — the natural logarithm of the samplers' draws
// (lazy Gumbel, kernels/common/lazy_gumbel.h), defined once so that every backend
// computes the same bits, and written without branches or tables so that a loop of
// them vectorises on the CPU.
//
//   sampler_log(x)    log x for x > 0 finite (subnormals included)
//   sampler_log1p(x)  log(1 + x) for x > -1 finite
//   sampler_gumbel(u) -log(-log u), a standard Gumbel, for u in (0, 1)
//
// Why not libm: glibc's log and CUDA's differ by an ulp here and there (the draw
// margins of draws.h exist for that), and neither vectorises in a loop over a batch of
// draws. These use only +, -, *, /, fma and bit operations, each correctly rounded by
// IEEE 754 on every device, with every multiply-add an explicit fma (nothing for a
// compiler to contract differently), so the CPU, its vector lanes and a GPU give the
// same bits.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/hd.h"

namespace knngpt {

KNNGPT_HD uint64_t sampler_bits_of(double x) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}
KNNGPT_HD double sampler_double_of(uint64_t b) {
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

// c0 x^n + c1 x^(n-1) + ... + cn, Horner's rule with one fma a step (a fold over the
// coefficients, expanded at compile time: no loop in the way of vectorising the caller's)
template <class... C>
KNNGPT_HD double sampler_horner(double x, double c0, C... c) {
    double p = c0;
    ((p = fma(p, x, c)), ...);
    return p;
}

// log: x = 2^e m with m in [sqrt(2)/2, sqrt(2)), then with f = m - 1 (exact) and
// s = f / (2 + f), |s| <= 0.1716:
//   log m = 2 atanh(s) = 2 s (1 + z/3 + z^2/5 + ... + z^11/23),  z = s^2 <= 0.0295,
// the series cut where the next term, z^11/25 < 6e-19, is below half an ulp; and
//   log x = e ln2_hi + (e ln2_lo + log m),  ln2_hi = ln 2 to 32 bits (e ln2_hi exact).
// |log m| <= 0.35 < ln 2, so the sum never cancels. Error: s carries at most ~1.5 ulps
// (one rounding in 2 + f, one in the division), so the result is within 2 ulps of
// log x (tests/test_gumbel_attention.cpp measures it against glibc on 2e6 inputs).
KNNGPT_HD double sampler_log(double x) {
    const double kLn2Hi = 0x1.62e42ffp-1, kLn2Lo = -0x1.718432a1b0e26p-35;
    const bool subnormal = x < 0x1p-1022;
    const uint64_t b = sampler_bits_of(subnormal ? x * 0x1p54 : x);
    int e = (int)(b >> 52) - 1023 - (subnormal ? 54 : 0);
    uint64_t m_bits = (b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // m in [1, 2)
    const bool above_sqrt2 = m_bits > 0x3FF6A09E667F3BCDull;                 // sqrt(2)'s bits
    m_bits = above_sqrt2 ? m_bits - 0x0010000000000000ull : m_bits;          // halve m
    e += above_sqrt2 ? 1 : 0;
    const double f = sampler_double_of(m_bits) - 1.0;
    const double s = f / (2.0 + f);
    const double z = s * s;
    const double p = sampler_horner(z, 1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11,
                                    1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3);
    const double two_s = 2.0 * s;
    const double log_m = fma(two_s * z, p, two_s);
    const double ed = (double)e;
    return fma(ed, kLn2Hi, fma(ed, kLn2Lo, log_m));
}

// log1p: u = 1 + x rounds; r = x - (u - 1) is what it lost (exact: u - 1 is exact for u
// in [1/2, 2], and x and u - 1 are then within a factor 2; for x < -1/2, u = 1 + x is
// itself exact and r = 0), and log(1 + x) = log(u + r) = log u + r / u + O((r/u)^2),
// the square below 2^-106: within 3 ulps of log1p x. No division by a value that can be
// 0 and no branch, so it vectorises as log does.
KNNGPT_HD double sampler_log1p(double x) {
    const double u = 1.0 + x;                  // > 0 for x > -1
    const double rounding = x - (u - 1.0);     // what u lost (both subtractions exact)
    return sampler_log(u) + rounding / u;      // log(u + rounding) to first order
}

// A standard Gumbel from a uniform in (0, 1): -log(-log u).
KNNGPT_HD double sampler_gumbel(double u) { return -sampler_log(-sampler_log(u)); }

}  // namespace knngpt
