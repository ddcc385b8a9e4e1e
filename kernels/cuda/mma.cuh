// kernels/cuda/mma.cuh — the register-level tensor-core and copy instructions
// the FlashAttention-2 kernels (attention_mma.cuh) are built from, one name for
// the GPU (inline PTX) and the emulator (kernels/emu/mma.h):
//   mma_bf16_16816(d, a, b, c)   D (16 x 8) = C + A (16 x 16) B (16 x 8), bf16
//                                operands, fp32 accumulation (mma.sync.m16n8k16)
//   ldmatrix_x4(r, row)          four 8 x 8 bf16 matrices from shared memory,
//   ldmatrix_x4_trans(r, row)    lanes 8m..8m+7 giving the rows of matrix m
//   pack_bf16x2(lo, hi)          two floats rounded to bf16 in one register
//   cp_async_16(dst, src, valid) 16 bytes global -> shared without registers
//                                (zeros when !valid); cp_async_commit() ends a
//                                group, cp_async_wait<N>() waits until at most N
//                                groups are in flight. The emulator copies at once.
// Fragment layouts (which lane holds which element) are the PTX ISA's; the
// emulator's header lists them. Unlike wmma, they are fixed, which is what lets a
// kernel rescale an accumulator row by row in registers (the online softmax) and
// reuse an accumulator as the next product's operand (P = softmax(S) in P V).
// tests/test_cuda_mma.cpp checks each wrapper against plain matrix products.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

// Two floats rounded to bf16 (nearest even), lo in the lower 16 bits.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const uint32_t l = __bfloat16_as_ushort(__float2bfloat16(lo)), h = __bfloat16_as_ushort(__float2bfloat16(hi));
    return l | h << 16;
}

#if defined(KNNGPT_CUDA_EMU)

inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                           const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    ::knngpt::emu::mma_m16n8k16_bf16(d, a, b, c, file, line);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
    ::knngpt::emu::ldmatrix<4, false>(r, row, file, line);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    ::knngpt::emu::ldmatrix<4, true>(r, row, file, line);
}
inline void cp_async_16(void* dst, const void* src, bool valid) {
    if (valid) {
        std::memcpy(dst, src, 16);
    } else {
        std::memset(dst, 0, 16);
    }
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

#else

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                               const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const int src_bytes = valid ? 16 : 0;  // 0: nothing is read, the 16 bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#endif

}  // namespace knngpt::cuda
