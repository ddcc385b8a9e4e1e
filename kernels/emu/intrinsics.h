// kernels/emu/intrinsics.h — what device code calls: barriers, warp shuffles
// and votes, atomics, fast math and bit tricks, on top of kernels/emu/fibers.h.
//
// Every barrier and warp primitive records its call site through default
// arguments (__builtin_FILE / __builtin_LINE are evaluated where the call is
// written), so deadlock reports can name the lines involved.
//
// Atomics are plain read-modify-writes: all fibers share one OS thread and
// switch only at barriers, so no other thread can run in the middle of one.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/emu/fibers.h"

namespace knngpt::emu {

template <typename T>
uint64_t to_lane_bits(T value) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move values of at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof value);
    return bits;
}

template <typename T>
T from_lane_bits(uint64_t bits) {
    T value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

template <typename T>
T shuffle(WarpOp op, const char* what, unsigned mask, T value, int lane_arg, int width, const char* file, int line) {
    return from_lane_bits<T>(warp_round(op, what, file, line, mask, to_lane_bits(value), lane_arg, width));
}

// Stores `desired` at address and returns what was there.
template <typename T>
T replace(T* address, T desired) {
    T old = *address;
    *address = desired;
    return old;
}

}  // namespace knngpt::emu

// ---- block barriers ---------------------------------------------------------

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    knngpt::emu::block_barrier("__syncthreads", file, line, false);
}

// Barrier, then the number of threads whose predicate was non-zero.
inline int __syncthreads_count(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return (int)(uint32_t)knngpt::emu::block_barrier("__syncthreads_count", file, line, predicate != 0);
}

inline int __syncthreads_and(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    uint64_t arrived_true = knngpt::emu::block_barrier("__syncthreads_and", file, line, predicate != 0);
    return (uint32_t)arrived_true == (uint32_t)(arrived_true >> 32);
}

inline int __syncthreads_or(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return (uint32_t)knngpt::emu::block_barrier("__syncthreads_or", file, line, predicate != 0) != 0;
}

// ---- warp primitives --------------------------------------------------------

inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    knngpt::emu::warp_round(knngpt::emu::WarpOp::syncwarp, "__syncwarp", file, line, mask, 0);
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
    return knngpt::emu::shuffle(knngpt::emu::WarpOp::shfl_idx, "__shfl_sync", mask, var, src_lane, width, file, line);
}

template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
    return knngpt::emu::shuffle(knngpt::emu::WarpOp::shfl_up, "__shfl_up_sync", mask, var, (int)delta, width, file,
                                line);
}

template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
    return knngpt::emu::shuffle(knngpt::emu::WarpOp::shfl_down, "__shfl_down_sync", mask, var, (int)delta, width,
                                file, line);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
    return knngpt::emu::shuffle(knngpt::emu::WarpOp::shfl_xor, "__shfl_xor_sync", mask, var, lane_mask, width, file,
                                line);
}

inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    return (unsigned)knngpt::emu::warp_round(knngpt::emu::WarpOp::ballot, "__ballot_sync", file, line, mask,
                                             predicate != 0);
}

inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return (int)knngpt::emu::warp_round(knngpt::emu::WarpOp::any, "__any_sync", file, line, mask, predicate != 0);
}

inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return (int)knngpt::emu::warp_round(knngpt::emu::WarpOp::all, "__all_sync", file, line, mask, predicate != 0);
}

// ---- atomics ----------------------------------------------------------------

inline int atomicAdd(int* address, int value) {
    return knngpt::emu::replace(address, (int)((unsigned)*address + (unsigned)value));  // wraps like the GPU
}
inline unsigned atomicAdd(unsigned* address, unsigned value) { return knngpt::emu::replace(address, *address + value); }
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
    return knngpt::emu::replace(address, *address + value);
}
inline float atomicAdd(float* address, float value) { return knngpt::emu::replace(address, *address + value); }
inline double atomicAdd(double* address, double value) { return knngpt::emu::replace(address, *address + value); }

inline int atomicSub(int* address, int value) {
    return knngpt::emu::replace(address, (int)((unsigned)*address - (unsigned)value));
}
inline unsigned atomicSub(unsigned* address, unsigned value) { return knngpt::emu::replace(address, *address - value); }

inline int atomicMax(int* address, int value) { return knngpt::emu::replace(address, *address > value ? *address : value); }
inline unsigned atomicMax(unsigned* address, unsigned value) {
    return knngpt::emu::replace(address, *address > value ? *address : value);
}
inline int atomicMin(int* address, int value) { return knngpt::emu::replace(address, *address < value ? *address : value); }
inline unsigned atomicMin(unsigned* address, unsigned value) {
    return knngpt::emu::replace(address, *address < value ? *address : value);
}

inline int atomicExch(int* address, int value) { return knngpt::emu::replace(address, value); }
inline unsigned atomicExch(unsigned* address, unsigned value) { return knngpt::emu::replace(address, value); }
inline unsigned long long atomicExch(unsigned long long* address, unsigned long long value) {
    return knngpt::emu::replace(address, value);
}
inline float atomicExch(float* address, float value) { return knngpt::emu::replace(address, value); }

inline int atomicCAS(int* address, int compare, int value) {
    return knngpt::emu::replace(address, *address == compare ? value : *address);
}
inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned value) {
    return knngpt::emu::replace(address, *address == compare ? value : *address);
}
inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare, unsigned long long value) {
    return knngpt::emu::replace(address, *address == compare ? value : *address);
}

inline int atomicAnd(int* address, int value) { return knngpt::emu::replace(address, *address & value); }
inline unsigned atomicAnd(unsigned* address, unsigned value) { return knngpt::emu::replace(address, *address & value); }
inline int atomicOr(int* address, int value) { return knngpt::emu::replace(address, *address | value); }
inline unsigned atomicOr(unsigned* address, unsigned value) { return knngpt::emu::replace(address, *address | value); }

// Memory fences order nothing here: fibers never run concurrently.
inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T>
T __ldg(const T* address) {
    return *address;
}

// ---- math -------------------------------------------------------------------
// expf, logf, tanhf, fmaxf, fminf, sqrtf, fabsf, ... come from <cmath>; these
// are CUDA's own names (its fast approximations are exact here).

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return std::fmin(std::fmax(x, 0.0f), 1.0f); }  // NaN -> 0

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// ---- bits -------------------------------------------------------------------

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

inline int __float_as_int(float x) { return knngpt::emu::from_lane_bits<int>(knngpt::emu::to_lane_bits(x)); }
inline unsigned __float_as_uint(float x) { return knngpt::emu::from_lane_bits<unsigned>(knngpt::emu::to_lane_bits(x)); }
inline float __int_as_float(int x) { return knngpt::emu::from_lane_bits<float>(knngpt::emu::to_lane_bits(x)); }
inline float __uint_as_float(unsigned x) { return knngpt::emu::from_lane_bits<float>(knngpt::emu::to_lane_bits(x)); }
