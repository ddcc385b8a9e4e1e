// kernels/cpu/topk_index.h — the CPU top-k indexes' entries, one per row of
// model/attention_registry.h, each with the one signature TopkSearchFn (ALGORITHMS.md §6;
// tie rule of §2.1).
//
//   For batch b, head h and query i, with causal keys C_i = {0, .., i}:
//     score(i, j) = attention_dot(q_i, k_j, HS)       (unscaled: 1/sqrt(HS) keeps the order)
//     S_i         = the k keys j in C_i ranked highest by (score desc, j asc)
//   An exact index returns S_i; an approximate one the k best of the keys it scores.
//
// Shapes: qkv (B, T, 3C) as in attention.h (q = channels [0, C), k = [C, 2C), head h at
// h*HS.., HS = C / NH). Output idx (B, NH, T, k): row i holds its keys in ascending order;
// rows with i + 1 <= k hold 0..i, then -1. Nothing is saved for a backward: the index is a
// discrete choice, the attention kernels differentiate through the chosen keys. Inputs
// must be finite. Every row is computed by one thread in a fixed order, so lists and
// statistics do not depend on the thread count.
//
// brute's entry picks its first pass: int8 where it pays (topk_int8_pays: AMX or AVX-512
// VNNI and T >= 2048), else sgemm (or the reference where OpenBLAS has only SSE kernels);
// the lists are the same bit for bit, only the speed differs. The CUDA build's entries are
// in kernels/cuda/backend.cuh.
#pragma once

#include "kernels/common/attention_params.h"
#include "kernels/cpu/topk_brute.h"
#include "kernels/cpu/topk_heavy.h"
#include "kernels/cpu/topk_int8.h"
#include "kernels/cpu/topk_ivf.h"
#include "kernels/cpu/topk_lsh.h"

namespace knngpt::cpu {

using knngpt::TopkIndex;

inline void topk_search_brute(int* idx, const float* qkv, int B, int T, int C, int NH, int k, const LshParams&,
                              TopkStats* stats) {
    if (topk_int8_pays(T)) causal_topk_int8(idx, qkv, B, T, C, NH, k, stats);
    else causal_topk_brute(idx, qkv, B, T, C, NH, k, stats);
}
inline void topk_search_lsh(int* idx, const float* qkv, int B, int T, int C, int NH, int k, const LshParams& lsh,
                            TopkStats* stats) {
    causal_topk_lsh(idx, qkv, B, T, C, NH, k, lsh, stats);
}
inline void topk_search_heavy(int* idx, const float* qkv, int B, int T, int C, int NH, int k, const LshParams&,
                              TopkStats* stats) {
    causal_topk_heavy(idx, qkv, B, T, C, NH, k, TopkHeavyParams(), stats);
}
inline void topk_search_ivf(int* idx, const float* qkv, int B, int T, int C, int NH, int k, const LshParams&,
                            TopkStats* stats) {
    causal_topk_ivf(idx, qkv, B, T, C, NH, k, TopkIvfParams(), stats);
}

}  // namespace knngpt::cpu
