// kernels/cuda/attention_exact.cuh — exact causal attention as the trainer runs it
// (ops::attention_forward / attention_backward, twins of kernels/cpu/attention.h):
// the math and shapes of attention.cuh; this header only chooses the kernels.
//   bf16 build (default): tensor cores, the register-level FlashAttention-2
//     kernels of attention_mma.cuh (Q, K, V, P and dS rounded to bf16 as GEMM
//     operands, fp32 accumulation and softmax; attention_bf16.cuh's wmma kernels
//     are their tested reference) where the head size is a multiple of 16 up to
//     128, B * NH fits the grid's y and the tiles the device's shared memory;
//   fp32 build (-DKNNGPT_FP32), and every other shape: the fp32 tiled kernels of
//     attention.cuh (the reference kernels beyond their head sizes).
// The forward's lse comes from the same path as the backward that reads it, so
// P = exp(S - lse) is consistent within each path.
#pragma once

#include "kernels/cuda/attention.cuh"
#if !defined(KNNGPT_FP32)
#include "kernels/cuda/attention_bf16.cuh"
#include "kernels/cuda/attention_mma.cuh"
#endif

namespace knngpt::cuda {

// Does exact attention on this shape run on the tensor-core kernels?
inline bool attention_on_tensor_cores(int B, int C, int NH) {
#if defined(KNNGPT_FP32)
    (void)B, (void)C, (void)NH;
    return false;
#else
    const int HS = C / NH;
    return HS >= kAttentionBf16HeadSizeStep && HS % kAttentionBf16HeadSizeStep == 0 && HS <= kAttentionBf16MaxHeadSize &&
           B * NH <= kAttentionMaxGridY && attention_mma_fits(HS);
#endif
}

// out (B, T, C), lse (B, NH, T) from qkv (B, T, 3C).
inline void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
#if !defined(KNNGPT_FP32)
    if (attention_on_tensor_cores(B, C, NH)) return attention_forward_mma(out, lse, qkv, B, T, C, NH);
#endif
    attention_forward_fp32(out, lse, qkv, B, T, C, NH);
}

// dqkv (B, T, 3C) += the gradient, given dout (B, T, C) and the forward's out and lse.
inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                               int B, int T, int C, int NH) {
#if !defined(KNNGPT_FP32)
    if (attention_on_tensor_cores(B, C, NH)) return attention_backward_mma(dqkv, dout, qkv, out, lse, B, T, C, NH);
#endif
    attention_backward_fp32(dqkv, dout, qkv, out, lse, B, T, C, NH);
}

}  // namespace knngpt::cuda
