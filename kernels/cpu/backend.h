// kernels/cpu/backend.h — the CPU backend: every op the model calls, plus the
// memory functions that let model/ stay backend-neutral.
//
// On the CPU "device" memory is ordinary host memory, so the copies are
// memcpy. The CUDA backend (kernels/cuda/backend.cuh) provides the same names
// with cudaMalloc / cudaMemcpy behind them.
#pragma once
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "kernels/common/attention_params.h"

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/classifier.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/forced_keys.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/global_norm.h"
#include "kernels/cpu/gumbel_attention.h"
#include "kernels/cpu/kmv_attention.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/sampled_grad.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/tail_sampling.h"
#include "kernels/cpu/topk_index.h"

namespace knngpt::cpu {

constexpr const char* BACKEND_NAME = "cpu (fp32, OpenMP + OpenBLAS)";

// The type of the logits buffer (the CUDA bf16 build's is bf16) and a logit as a float.
using Logit = float;
inline float logit_value(float x) { return x; }

template <class Tp>
Tp* device_alloc(size_t count) {
    // 64-byte alignment for vector loads; aligned_alloc needs a multiple of it
    size_t bytes = ((count * sizeof(Tp) + 63) / 64) * 64;
    void* p = std::aligned_alloc(64, bytes ? bytes : 64);
    if (!p) throw std::bad_alloc();
    return static_cast<Tp*>(p);
}
inline void device_free(void* p) { std::free(p); }
inline void device_zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }
inline void copy_to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
inline void copy_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
inline void copy_device_to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

// Copies `width` ints from each of `rows` rows of src (row stride src_stride)
// into the rows of dst (row stride dst_stride).
inline void copy_columns(int* dst, size_t dst_stride, const int* src, size_t src_stride, int width, size_t rows) {
    for (size_t row = 0; row < rows; row++) std::memcpy(dst + row * dst_stride, src + row * src_stride, width * sizeof(int));
}

// The model's parameter buffer, for backends that keep derived copies of it
// (the CUDA build: a bf16 copy for its matmuls). The CPU keeps none.
inline void register_parameters(const float*, size_t) {}
inline void unregister_parameters(const float*) {}
inline void refresh_parameter_copy(const float*, size_t) {}

// Activations that are matmul inputs, for backends that keep derived copies of
// them (the CUDA bf16 build: a bf16 copy, written by the op that writes the
// activation). The CPU keeps none.
inline void register_activation_copy(const float*, size_t) {}
inline void unregister_activation_copy(const float*) {}
inline void refresh_activation_copy(const float*, size_t) {}

// Peak FLOP/s the MFU figure is measured against; 0: unknown, no MFU printed.
inline double device_peak_flops() { return 0.0; }

// The limits of this build's attention kernels: none (model/attention_registry.h says
// which modes and indexes it has).
inline AttnCapabilities attention_capabilities() { return AttnCapabilities{"train_gpt_cpu"}; }

// Waits for the device's queued work (timing); the CPU's ops are synchronous.
inline void device_synchronize() {}

}  // namespace knngpt::cpu
