// kernels/common/philox.h — Philox4x32-10, the counter-based random numbers of
// every stochastic attention estimator (Salmon et al., SC'11).
//
// A draw is a pure function of (key, counter): no state, so the CPU and the
// CUDA backends, forward and backward, regenerate identical samples. Which
// counter each draw of knngpt uses is kernels/common/draws.h; this file is the
// generator and the conversions of its 32-bit words to uniform numbers.
//
// Round (×10): with products M0·c0 = (hi0, lo0) and M1·c2 = (hi1, lo1),
//   c ← (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0), then k ← k + (W0, W1).
#pragma once
#include <cstdint>

#include "kernels/common/hd.h"

namespace knngpt {

struct Philox4 {
    uint32_t x[4];
};

KNNGPT_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
    uint64_t product = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(product >> 32);
    *lo = (uint32_t)product;
}

// Philox4x32 with 10 rounds of counter c under key (k0, k1).
KNNGPT_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int round = 0; round < 10; round++) {
        if (round > 0) { k0 += W0; k1 += W1; }
        uint32_t hi0, lo0, hi1, lo1;
        philox_mulhilo(M0, c.x[0], &hi0, &lo0);
        philox_mulhilo(M1, c.x[2], &hi1, &lo1);
        c = Philox4{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
    }
    return c;
}

// Uniform in (0, 1) from one word: (w >> 9) 2^-23 + 2^-24, in [2^-24, 1 - 2^-24],
// never 0 or 1, safe for log. (24 bits, (w >> 8) 2^-24 + 2^-25, would reach
// 1 - 2^-25, which rounds to exactly 1.0f; 23 bits keep every value
// representable; ALGORITHMS.md §9.3.)
KNNGPT_HD float uniform_open01(uint32_t w) {
    return (float)(w >> 9) * (1.0f / 8388608.0f) + (1.0f / 16777216.0f);
}

// Uniform in (0, 1) with 52 bits from two words, for fp64 sampling arithmetic:
// (b + 1/2) 2^-52, in [2^-53, 1 - 2^-53].
KNNGPT_HD double uniform_open01_f64(uint32_t w0, uint32_t w1) {
    uint64_t bits = (((uint64_t)w0 << 32) | w1) >> 12;  // 52 random bits
    return ((double)bits + 0.5) * (1.0 / 4503599627370496.0);
}

// Uniform integer in [0, n): (w · n) >> 32. The bias is at most n / 2^32,
// negligible for the n <= 2^20 keys of a row.
KNNGPT_HD uint32_t uniform_below(uint32_t w, uint32_t n) {
    return (uint32_t)(((uint64_t)w * (uint64_t)n) >> 32);
}

}  // namespace knngpt
