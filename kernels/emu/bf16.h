// kernels/emu/bf16.h — __nv_bfloat16 for the CUDA emulator.
//
// A bf16 is the top half of an fp32: 1 sign, 8 exponent and 7 mantissa bits.
// float -> bf16 rounds to nearest, ties to even: add 0x7FFF plus the lowest
// kept bit to the fp32 bits, then drop the low 16. A NaN is kept a (quiet)
// NaN rather than rounded, since the carry could turn it into infinity.
// bf16 -> float is exact (append 16 zero bits).
//
// Like cuda_bf16.h, the struct converts implicitly from and to float and has
// no arithmetic of its own here: convert, compute in fp32, convert back.
#pragma once
#include <cstdint>
#include <cstring>

namespace knngpt::emu {

inline uint16_t float_to_bf16_bits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x0040u);  // quiet NaN
    uint32_t round_to_even = 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)((bits + round_to_even) >> 16);
}

inline float bf16_bits_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

}  // namespace knngpt::emu

struct alignas(2) __nv_bfloat16 {
    unsigned short __x;

    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(knngpt::emu::float_to_bf16_bits(f)) {}
    operator float() const { return knngpt::emu::bf16_bits_to_float(__x); }
};

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) {
    __nv_bfloat16 h;
    h.__x = bits;
    return h;
}
