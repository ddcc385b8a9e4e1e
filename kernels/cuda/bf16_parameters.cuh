// kernels/cuda/bf16_parameters.cuh — the bf16 copy of the parameters that the
// bf16 matmuls read, and the fp32 -> bf16 conversion kernel.
//
//   copy[i] = bf16(params[i])   round to nearest, ties to even (__float2bfloat16)
//
// The fp32 parameters stay the master weights (AdamW updates them in fp32).
// The model registers its parameter buffer once (register_parameters, called
// through ops:: from model/gpt.h); from then on this file keeps a bf16 copy of
// the whole buffer (count values, 2 bytes each): written at registration, and
// by every AdamW update of a range inside it (adamw.cuh writes the copy in the
// same pass as the parameters). A bf16 matmul whose weight lies inside the
// registered buffer reads the copy (bf16_copy_of) instead of converting the
// weight on each call (matmul.cuh). Activations are not in the buffer; those
// that are matmul inputs have bf16 copies of their own (bf16_activations.cuh).
//
// Invariant: while registered, copy == bf16(params) elementwise, so reading the
// copy gives bit for bit what converting would. Every write to the parameters
// therefore goes through adamw_update, or is followed by register_parameters
// again. The fp32 build (-DKNNGPT_FP32) keeps no copy, and there is no CPU twin:
// the CPU build is fp32 throughout.
//
// One buffer at a time: registering another replaces the first (whose
// matmuls then convert per call); unregister_parameters(params) forgets it,
// called before the buffer is freed, so a later allocation at the same
// address is never mistaken for parameters.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kConvertThreads = 256;
constexpr int kConvertMaxBlocks = 1024;  // larger arrays: the conversion grid-strides

// One value converted: float to bf16 rounded to nearest (ties to even), bf16 to float exactly.
__device__ __forceinline__ void convert_value(__nv_bfloat16* out, float x) { *out = __float2bfloat16(x); }
__device__ __forceinline__ void convert_value(float* out, __nv_bfloat16 x) { *out = __bfloat162float(x); }

// out[i] = inp[i] converted, grid-stride loop.
template <class Out, class In>
__global__ void convert_kernel(Out* out, const In* inp, size_t count) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) convert_value(out + i, inp[i]);
}

template <class Out, class In>
inline void convert(Out* out, const In* inp, size_t count) {
    if (count == 0) return;
    const size_t blocks = ceil_div(count, (size_t)kConvertThreads);
    const unsigned grid = (unsigned)(blocks < (size_t)kConvertMaxBlocks ? blocks : kConvertMaxBlocks);
    launch(convert_kernel<Out, In>, grid, kConvertThreads, 0, nullptr, out, inp, count);
}

// out = bf16(inp), count values, device pointers.
inline void convert_to_bf16(__nv_bfloat16* out, const float* inp, size_t count) { convert(out, inp, count); }

// out = float(inp), count values, device pointers.
inline void convert_from_bf16(float* out, const __nv_bfloat16* inp, size_t count) { convert(out, inp, count); }

struct Bf16ParameterCopy {
    const float* params = nullptr;  // the registered fp32 buffer
    size_t count = 0;
    __nv_bfloat16* copy = nullptr;  // (count) bf16(params)
};

inline Bf16ParameterCopy& bf16_parameter_copy() {
    static Bf16ParameterCopy registered;
    return registered;
}

inline void unregister_parameters(const float* params) {
    Bf16ParameterCopy& r = bf16_parameter_copy();
    if (params == nullptr || r.params != params) return;
    CUDA_CHECK(cudaFree(r.copy));
    r = Bf16ParameterCopy{};
}

// Registers the parameter buffer (count fp32 values) and writes its bf16 copy.
inline void register_parameters(const float* params, size_t count) {
#if defined(KNNGPT_FP32)
    (void)params, (void)count;  // fp32 matmuls: nothing reads a copy
#else
    Bf16ParameterCopy& r = bf16_parameter_copy();
    if (r.params) unregister_parameters(r.params);
    if (params == nullptr || count == 0) return;
    CUDA_CHECK(cudaMalloc(&r.copy, count * sizeof(__nv_bfloat16)));
    r.params = params;
    r.count = count;
    convert_to_bf16(r.copy, params, count);
#endif
}

// Writes the copy again for [params, params + count), a range of the registered
// buffer written by something other than adamw_update (ZeRO-1's all-gather of
// the other ranks' shards). Outside the registered buffer (or in the fp32
// build) there is no copy, and nothing to do.
inline void refresh_parameter_copy(const float* params, size_t count);

// The bf16 copy of [p, p + count) when that range lies inside the registered
// buffer, else nullptr.
inline __nv_bfloat16* bf16_copy_of(const float* p, size_t count) {
    const Bf16ParameterCopy& r = bf16_parameter_copy();
    if (r.params == nullptr || p == nullptr) return nullptr;
    // compared as addresses: p may belong to another allocation
    const uintptr_t begin = (uintptr_t)r.params, end = begin + r.count * sizeof(float), at = (uintptr_t)p;
    if (at < begin || at + count * sizeof(float) > end) return nullptr;
    return r.copy + (p - r.params);
}

inline void refresh_parameter_copy(const float* params, size_t count) {
    if (__nv_bfloat16* copy = bf16_copy_of(params, count)) convert_to_bf16(copy, params, count);
}

}  // namespace knngpt::cuda
