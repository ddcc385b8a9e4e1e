// kernels/cuda/bf16_activations.cuh — bf16 copies of the activations that are
// matmul inputs, written by the ops that write the activations.
//
//   copy[i] = bf16(act[i])   round to nearest, ties to even (__float2bfloat16)
//
// The model registers the activations that are matmul inputs (model/gpt.h: ln1,
// atty, ln2, fch_gelu, lnf, each its whole (L, B, T, C)-like range); from then on
// this file keeps a bf16 copy of each range, and the op that writes a registered
// activation writes its copy too:
//   layernorm_forward    in the same kernel (layernorm.cuh)
//   gelu_forward         in the same kernel (gelu.cuh)
//   matmul_forward_gelu  a conversion after the library's fused GELU epilogue,
//                        which writes fp32 (matmul.cuh)
//   anything else        refresh_activation_copy(p, count) after the write
//                        (the model calls it after attention, whose many
//                        kernels write fp32)
// A bf16 matmul whose input lies inside a registered range reads the copy
// (bf16_operand in matmul.cuh) instead of converting it, in the forward and again
// in the backward's dweight GEMM; its weights come from bf16_parameters.cuh.
//
// Invariant: after a registered activation is written, copy == bf16(act) on the
// written range (a write across a range's edge, or ranges that overlap, are refused:
// activation_copy_to_write, register_activation_copy), so reading the copy gives bit
// for bit what converting would: the bf16 build's steps are the same with or without
// copies (test_cuda_model checks it). The fp32 values stay: the attention backward
// reads atty, the non-finite search and the tests read all of them. There is no CPU
// twin: the CPU build is fp32 throughout.
//
// Cost and saving: 2 bytes a value more memory (7C values a row and layer); they
// save 50C of the 138C bytes a row and layer that per-call conversions would move.
//
// The fp32 build (-DKNNGPT_FP32) keeps no copies (its matmuls read fp32), and
// bf16_activation_copies() = false (tests) makes registration a no-op, so the
// matmuls convert per call. Unregister a range before its memory is
// freed, so a later allocation at the same address is never taken for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/bf16_parameters.cuh"
#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

// Whether register_activation_copy keeps a copy (the build's default: yes in the
// bf16 build, no with -DKNNGPT_FP32). Tests assign it to compare both ways.
inline bool& bf16_activation_copies() {
#if defined(KNNGPT_FP32)
    static bool enabled = false;
#else
    static bool enabled = true;
#endif
    return enabled;
}

struct Bf16ActivationCopy {
    const float* begin = nullptr;  // the registered fp32 range
    size_t count = 0;
    __nv_bfloat16* copy = nullptr;  // (count) bf16 of the range, as last written
};

inline std::vector<Bf16ActivationCopy>& bf16_activation_registry() {
    static std::vector<Bf16ActivationCopy> registered;
    return registered;
}

namespace detail {
// Whether [p, p + count) and the registered range r share an element.
inline bool overlaps(const Bf16ActivationCopy& r, const float* p, size_t count) {
    const uintptr_t begin = (uintptr_t)r.begin, end = begin + r.count * sizeof(float), at = (uintptr_t)p;
    return at < end && begin < at + count * sizeof(float);
}
}  // namespace detail

// Forgets the copy of the range starting at begin (if any) and frees it.
inline void unregister_activation_copy(const float* begin) {
    auto& registry = bf16_activation_registry();
    for (size_t i = 0; i < registry.size(); i++) {
        if (registry[i].begin != begin) continue;
        CUDA_CHECK(cudaFree(registry[i].copy));
        registry.erase(registry.begin() + (std::ptrdiff_t)i);
        return;
    }
}

// Keeps a bf16 copy of the activation range [begin, begin + count) from now on
// (its contents are written by the next op that writes the range).
inline void register_activation_copy(const float* begin, size_t count) {
    if (!bf16_activation_copies() || begin == nullptr || count == 0) return;
    unregister_activation_copy(begin);
    for (const Bf16ActivationCopy& r : bf16_activation_registry())  // one copy per value
        if (detail::overlaps(r, begin, count))
            throw std::logic_error("bf16 activation copies: a range of " + std::to_string(count) +
                                   " values overlaps a registered one of " + std::to_string(r.count));
    Bf16ActivationCopy entry;
    entry.begin = begin;
    entry.count = count;
    CUDA_CHECK(cudaMalloc(&entry.copy, count * sizeof(__nv_bfloat16)));
    bf16_activation_registry().push_back(entry);
}

// The bf16 copy of [p, p + count) when that range lies inside a registered
// activation, else nullptr.
inline __nv_bfloat16* activation_copy_of(const float* p, size_t count) {
    if (p == nullptr) return nullptr;
    for (const Bf16ActivationCopy& r : bf16_activation_registry()) {
        // compared as addresses: p may belong to another allocation
        const uintptr_t begin = (uintptr_t)r.begin, end = begin + r.count * sizeof(float), at = (uintptr_t)p;
        if (at >= begin && at + count * sizeof(float) <= end) return r.copy + (p - r.begin);
    }
    return nullptr;
}

// The copy that a write of [p, p + count) must keep up to date: activation_copy_of's,
// and nullptr when the write touches no registered range. A write across a range's
// edge would leave part of that range's copy stale (a matmul reading it later would
// see old values), so it stops instead.
inline __nv_bfloat16* activation_copy_to_write(const float* p, size_t count) {
    if (p == nullptr || count == 0) return nullptr;
    if (__nv_bfloat16* copy = activation_copy_of(p, count)) return copy;
    for (const Bf16ActivationCopy& r : bf16_activation_registry())
        if (detail::overlaps(r, p, count))
            throw std::logic_error("bf16 activation copies: a write of " + std::to_string(count) +
                                   " values crosses the edge of a registered activation of " + std::to_string(r.count));
    return nullptr;
}

// Writes the copy of [p, p + count) again from the fp32 values, after an op that
// writes only those; nothing outside a registered range.
inline void refresh_activation_copy(const float* p, size_t count) {
    if (__nv_bfloat16* copy = activation_copy_to_write(p, count)) convert_to_bf16(copy, p, count);
}

}  // namespace knngpt::cuda
