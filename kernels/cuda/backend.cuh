// kernels/cuda/backend.cuh — the CUDA backend: every op the model calls, plus
// the memory functions that let model/ stay backend-neutral. Twin of
// kernels/cpu/backend.h, with the same names and argument order; model/backend.h
// selects it when KNNGPT_CUDA is defined.
//
// Built two ways (kernels/cuda/common.cuh): with nvcc for a GPU (train_gpt), or
// with g++ and -DKNNGPT_CUDA_EMU for the CPU emulator (build/train_gpt_emu, the
// whole-model test). Pointers the model hands to these ops are device pointers.
//
// Precision. Parameters, gradients, AdamW state and activations are fp32 in
// every build but the logits, bf16 by default (Logit, below); our own kernels
// compute in fp32 but one: exact attention, which the
// default build runs on tensor cores where the head size allows (attention_exact.cuh). The matmuls (kernels/cuda/matmul.cuh)
// run bf16 operands with fp32 accumulation by default, the weights read from a
// bf16 copy of the parameters that AdamW keeps (register_parameters,
// bf16_parameters.cuh) and the activations that are matmul inputs from bf16
// copies that the ops writing them keep (register_activation_copy,
// bf16_activations.cuh); a build with -DKNNGPT_FP32 keeps them fp32 too, so its
// steps equal train_gpt_cpu's up to summation order (which test_cuda_trainer
// checks to 1e-5).
//
// Which attention modes and top-k indexes this build has is model/attention_registry.h;
// the trainer stops a run asking for one it lacks at start-up, with one line.
#pragma once
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/common/attention_params.h"
#include "kernels/cuda/common.cuh"

#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/attention_exact.cuh"
#include "kernels/cuda/bf16_parameters.cuh"
#include "kernels/cuda/classifier.cuh"
#include "kernels/cuda/encoder.cuh"
#include "kernels/cuda/forced_keys.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/global_norm.cuh"
#include "kernels/cuda/gumbel_attention.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/residual.cuh"
#include "kernels/cuda/sampled_grad.cuh"
#include "kernels/cuda/sparse_attention.cuh"
#include "kernels/cuda/tail_sampling.cuh"
#include "kernels/cuda/topk_index.cuh"

namespace knngpt::cuda {

using knngpt::GradSampleSource;
using knngpt::KmvParams;
using knngpt::LshParams;
using knngpt::TopkIndex;
using knngpt::TopkStats;

#if defined(KNNGPT_FP32)
#define KNNGPT_MATMUL_PRECISION "fp32"
#else
#define KNNGPT_MATMUL_PRECISION "bf16 matmuls and logits, fp32 rest"
#endif
// The type of the logits buffer: fp32, or bf16 in the bf16 build, where the logits GEMM
// stores its result rounded to bf16 and the classifier reads it and writes dlogits back in
// bf16 (classifier.cuh: the loss within 2^-7 max |logit| of the fp32 logits'), halving the
// largest activation; logit_value (classifier.cuh) reads one as a float, on the host too.
#if defined(KNNGPT_FP32)
using Logit = float;
#else
using Logit = __nv_bfloat16;
#endif

#if defined(KNNGPT_CUDA_EMU)
constexpr const char* BACKEND_NAME = "cuda (" KNNGPT_MATMUL_PRECISION ") under the CPU emulator";
#else
constexpr const char* BACKEND_NAME = "cuda (" KNNGPT_MATMUL_PRECISION ", cuBLASLt)";
#endif

// ---- memory -------------------------------------------------------------------

template <class Tp>
Tp* device_alloc(size_t count) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, count ? count * sizeof(Tp) : sizeof(Tp)));
    return static_cast<Tp*>(p);
}
inline void device_free(void* p) { CUDA_CHECK(cudaFree(p)); }
inline void device_zero(void* p, size_t bytes) { CUDA_CHECK(cudaMemset(p, 0, bytes)); }
inline void copy_to_device(void* dst, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
inline void copy_to_host(void* dst, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
inline void copy_device_to_device(void* dst, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

// Copies `width` ints from each of `rows` rows of src (row stride src_stride)
// into the rows of dst (row stride dst_stride), device to device.
inline void copy_columns(int* dst, size_t dst_stride, const int* src, size_t src_stride, int width, size_t rows) {
    CUDA_CHECK(cudaMemcpy2D(dst, dst_stride * sizeof(int), src, src_stride * sizeof(int), width * sizeof(int), rows,
                            cudaMemcpyDeviceToDevice));
}

// ---- MFU ------------------------------------------------------------------------

// Dense peak FLOP/s of the current device, from its name, for the precision
// the matmuls (nearly all the FLOPs) run in: bf16 tensor cores with fp32
// accumulation, or plain fp32 in the -DKNNGPT_FP32 build. 0 when the device is
// not in the table (no MFU is printed then).
inline double device_peak_flops() {
    static double peak = -1.0;
    if (peak >= 0.0) return peak;
    int device = 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    struct Entry {
        const char* name;
        double bf16_tflops, fp32_tflops;  // dense; bf16 with fp32 accumulation
    };
    // first match wins, so the more specific names come first
    const Entry table[] = {{"H200", 989.4, 66.9}, {"GH200", 989.4, 66.9}, {"H100 PCIe", 756.0, 51.2},
                           {"H100", 989.4, 66.9}, {"A100", 312.0, 19.5},  {"L40S", 362.1, 91.6}};
    peak = 0.0;
    for (const Entry& e : table)
        if (std::strstr(prop.name, e.name)) {
#if defined(KNNGPT_FP32)
            peak = e.fp32_tflops * 1e12;
#else
            peak = e.bf16_tflops * 1e12;
#endif
            break;
        }
    return peak;
}

// ---- attention ---------------------------------------------------------------------

// The limits of this build's attention kernels (model/attention_registry.h says which
// modes and indexes it has).
inline AttnCapabilities attention_capabilities() {
    AttnCapabilities c;
    c.build = "the CUDA build";
    c.max_gumbel_groups = kGumbelMaxGroups;
    return c;
}

inline void device_synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

// The brute index's entry (TopkSearchFn): the CPU's lists, bit for bit; no statistics.
inline void topk_search_brute(int* idx, const float* qkv, int B, int T, int C, int NH, int k, const LshParams&,
                              TopkStats*) {
    causal_topk_brute(idx, qkv, B, T, C, NH, k);
}

// kmv is refused before a run starts (it has no CUDA row in the registry); this
// definition only lets the shared dispatch in model/attention.h compile.
inline void kmv_select_keys(int*, float*, const float*, int, int, int, int, int, const KmvParams&) {
    throw std::runtime_error("kmv_select_keys: kmv has no CUDA kernel yet");
}

}  // namespace knngpt::cuda
