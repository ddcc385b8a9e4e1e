// kernels/common/rng.h — the host random number generator of knngpt.
//
// xorshift64* (Marsaglia / Vigna): one 64-bit word of state, so the whole
// generator is saved in a training-state file and restored exactly. Used for
// parameter initialisation, batch shuffling and sampling text. (The
// attention estimators use the counter-based Philox stream instead.)
#pragma once
#include <cmath>
#include <cstdint>

namespace knngpt {

struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed = 1337) { seed_with(seed); }

    void seed_with(uint64_t seed) {
        // splitmix64 of the seed, so that small seeds give well-mixed states;
        // the state must never be 0.
        uint64_t z = seed + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        state = z ? z : 0x2545F4914F6CDD1Dull;
    }

    uint64_t next_u64() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return state * 0x2545F4914F6CDD1Dull;
    }
    uint32_t next_u32() { return (uint32_t)(next_u64() >> 32); }

    // uniform in [0, 1) with 24 bits, as a float
    float uniform() { return (next_u32() >> 8) * (1.0f / 16777216.0f); }

    // uniform integer in [0, n) (multiply-shift; bias <= n / 2^32)
    uint32_t below(uint32_t n) { return (uint32_t)(((uint64_t)next_u32() * n) >> 32); }

    // standard normal by Box-Muller (one value per call, the second is dropped
    // so that the state advance per value is fixed)
    double normal() {
        double u1 = ((next_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
        double u2 = (next_u64() >> 11) * (1.0 / 9007199254740992.0);          // [0, 1)
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
};

}  // namespace knngpt
