// kernels/emu/types.h — CUDA's qualifiers and vector types for the emulator.
//
// Function qualifiers vanish: a __global__ kernel and a __device__ helper are
// ordinary C++ functions run by the fibers of kernels/emu/fibers.h.
//
// __shared__ becomes `static`. That is correct only because the emulator runs
// the blocks of a grid one after another on one OS thread: at any moment at
// most one block is alive, so one static copy per variable serves as the
// block's shared memory. Like real shared memory it is not cleared between
// blocks (a block sees whatever the previous one left).
//
// __restrict__ is GCC's own keyword and needs no definition; __noinline__ is
// left alone because glibc spells its attribute __attribute__((__noinline__)).
#pragma once

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

// The vector types kernels use for wide loads, with CUDA's alignments.
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };

inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// warpSize, as the built-in variable of device code
constexpr int warpSize = 32;
