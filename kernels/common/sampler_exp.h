// kernels/common/sampler_exp.h — the exponential of the exact-row sampler's weights
// (exp(s_ij - max) in kernels/cpu/sampled_grad.h and kernels/cuda/sampled_grad.cuh),
// defined once so that both backends compute the same bits, and written without
// branches or tables so that a loop of them vectorises on the CPU.
//
//   sampler_exp(x)   e^x for -708 <= x <= 709; 0 below -708 (e^-708 ~ 3e-308, nothing
//                    next to the row's largest weight, 1); 709's value above; NaN stays NaN
//
// Why not libm: glibc's exp and CUDA's differ by an ulp here and there, and neither
// vectorises in the loop over a row's keys. Like sampler_log it uses only +, -, *, fma and
// bit operations, every multiply-add an explicit fma, so the CPU, its vector lanes and
// a GPU give the same bits.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/sampler_log.h"

namespace knngpt {

// x = n ln2 + r with n = round(x / ln2) (the 1.5 * 2^52 shift), r = x - n ln2_hi -
// n ln2_lo by two fmas (ln2_hi = ln 2 to 32 bits, as sampler_log's, so n ln2_hi is
// exact), |r| <= ln2 / 2 + tiny; e^r by its degree-13 Taylor polynomial (the next term,
// r^14 / 14! < 5e-18, is below a twentieth of an ulp) in fma Horner form; 2^n placed in
// the exponent field (n in [-1021, 1023]: a normal scale). Error within 2 ulps of e^x
// (tests/test_sampled_grad.cpp measures it against the x87 exp).
KNNGPT_HD double sampler_exp(double x) {
    const double kLn2Hi = 0x1.62e42ffp-1, kLn2Lo = -0x1.718432a1b0e26p-35;
    const double kRoundShift = 0x1.8p52;  // adding it pushes the fraction out of the mantissa
    const double clamped = x > 709.0 ? 709.0 : (x < -708.0 ? -708.0 : x);
    const double shifted = fma(clamped, 0x1.71547652b82fep0, kRoundShift);  // x / ln2 + shift, rounded once
    const double n = shifted - kRoundShift;
    const double r = fma(-n, kLn2Lo, fma(-n, kLn2Hi, clamped));
    const double p = sampler_horner(r, 1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                                    1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0,
                                    1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0);  // sum_{k<=13} r^k / k!
    // n sits in the low mantissa bits of `shifted`: move it into the exponent field
    const double scale = sampler_double_of((sampler_bits_of(shifted) - sampler_bits_of(kRoundShift) + 1023) << 52);
    return x < -708.0 ? 0.0 : p * scale;
}

}  // namespace knngpt
