// kernels/cpu/topk_panel.h — key panels and their 8-lane scores: the inner loop of
// every CPU top-k index (ALGORITHMS.md §6; the score of §2.1).
//
//   panel  the keys of one (b, h) in chunks of 8: (chunks, HS, 8), chunks = ceil(T / 8),
//          chunk c, lane l holds key j = 8c + l (zero for j >= T); all heads (B, NH, chunks, HS, 8)
//   score  out[8u + l] = attention_dot(q, key in lane l of chunk u, HS):
//          acc = 0; for d = 0..HS-1: acc = fmaf(q_d, k_jd, acc)   (kernels/common/attention_score.h)
//
// A chunk's 8 scores are 8 independent fma chains over contiguous loads, one key per
// vector lane, and each lane repeats attention_dot's chain exactly. Two lane backends
// share the routines' bodies (topk_panel_scores.h): 256-bit AVX/FMA intrinsics, and a
// per-lane std::fma loop (one correctly rounded fma, on any CPU). A build with FMA
// (-march=native on an FMA CPU) uses the intrinsics; a build without (ARCHFLAGS=, x86-64
// g++) compiles them under target("avx,fma") and uses them where the CPU has both, else
// the loop; other builds use the loop. The routines differ only in how many chains they keep in
// flight, never in a lane's operations, so every score is attention_dot's bit for bit in
// every build and on every CPU (padded lanes score 0). That is what makes an index that
// scores every key equal the brute force and the CPU lists equal the CUDA kernel's
// (kernels/cuda/topk_index.cuh); tests/test_topk_index.cpp checks both backends for
// HS = 1..130.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

// KNNGPT_TOPK_LANES_FMA: the AVX/FMA backend is compiled; KNNGPT_TOPK_LANES_DISPATCH:
// under target options, chosen at run time (a build without FMA, x86-64, g++)
#if defined(__AVX__) && defined(__FMA__)
#define KNNGPT_TOPK_LANES_FMA 1
#define KNNGPT_TOPK_LANES_DISPATCH 0
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define KNNGPT_TOPK_LANES_FMA 1
#define KNNGPT_TOPK_LANES_DISPATCH 1
#else
#define KNNGPT_TOPK_LANES_FMA 0
#define KNNGPT_TOPK_LANES_DISPATCH 0
#endif

#if KNNGPT_TOPK_LANES_FMA
#include <immintrin.h>
#endif

#include "kernels/common/attention_score.h"

namespace knngpt::cpu {

constexpr int kTopkLanes = 8;  // keys per panel chunk: one vector of fp32 scores

inline int topk_num_chunks(int T) { return (T + kTopkLanes - 1) / kTopkLanes; }

// n keys into panel chunks (ceil(n / 8), HS, 8), key u = key_of(u) in chunk u / 8, lane
// u % 8, zero lanes after the last key
template <class KeyOf>
inline void topk_pack_chunks(float* panel, int n, int HS, KeyOf key_of) {
    const std::vector<float> zeros((size_t)HS, 0.0f);
    for (int c = 0; c < topk_num_chunks(n); c++) {
        float* chunk = panel + (size_t)c * HS * kTopkLanes;
        const float* key[kTopkLanes];
        for (int l = 0; l < kTopkLanes; l++) {
            const int u = c * kTopkLanes + l;
            key[l] = u < n ? key_of(u) : zeros.data();
        }
        // the chunk in the order it is stored: contiguous writes, strided reads
        for (int d = 0; d < HS; d++)
            for (int l = 0; l < kTopkLanes; l++) chunk[d * kTopkLanes + l] = key[l][d];
    }
}

// one head: panel (chunks, HS, 8) from the keys k_head[j * key_stride + d], j < T
inline void topk_pack_head_keys(float* panel, const float* k_head, size_t key_stride, int T, int HS) {
    topk_pack_chunks(panel, T, HS, [=](int j) { return k_head + (size_t)j * key_stride; });
}

// every head: panels (B, NH, chunks, HS, 8)
inline void topk_pack_keys(float* panels, const float* qkv, int B, int T, int C, int NH) {
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const size_t head_size = (size_t)topk_num_chunks(T) * HS * kTopkLanes;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            topk_pack_head_keys(panels + ((size_t)b * NH + h) * head_size, qkv + (size_t)b * T * C3 + C + (size_t)h * HS,
                                C3, T, HS);
}

// ----------------------------------------------------------------------------
// lane backends: 8 fp32 lanes, one key each, a lane's fma exactly attention_dot's fmaf

// portable, in every build: a per-lane std::fma loop (g++ does not reliably vectorise it);
// the fallback on a CPU without AVX/FMA, and what tests compare the fast backend with
namespace topk_lanes_portable {
struct TopkLaneVec {
    float x[kTopkLanes];
};
inline TopkLaneVec topk_lanes_zero() { return TopkLaneVec{}; }
inline TopkLaneVec topk_lanes_load(const float* p) {
    TopkLaneVec v;
    for (int l = 0; l < kTopkLanes; l++) v.x[l] = p[l];
    return v;
}
inline void topk_lanes_store(float* p, TopkLaneVec v) {
    for (int l = 0; l < kTopkLanes; l++) p[l] = v.x[l];
}
inline TopkLaneVec topk_lanes_fma(float a, TopkLaneVec b, TopkLaneVec acc) {
    for (int l = 0; l < kTopkLanes; l++) acc.x[l] = std::fma(a, b.x[l], acc.x[l]);
    return acc;
}
#include "kernels/cpu/topk_panel_scores.h"
}  // namespace topk_lanes_portable

#if KNNGPT_TOPK_LANES_FMA
// AVX/FMA intrinsics: a build for an FMA CPU uses only these; a build without FMA
// (x86-64, g++) compiles them under the avx,fma target and chooses at run time
#if KNNGPT_TOPK_LANES_DISPATCH
#pragma GCC push_options
#pragma GCC target("avx,fma")
#endif
namespace topk_lanes_fma {
using TopkLaneVec = __m256;
inline TopkLaneVec topk_lanes_zero() { return _mm256_setzero_ps(); }
inline TopkLaneVec topk_lanes_load(const float* p) { return _mm256_loadu_ps(p); }
inline void topk_lanes_store(float* p, TopkLaneVec v) { _mm256_storeu_ps(p, v); }
inline TopkLaneVec topk_lanes_fma(float a, TopkLaneVec b, TopkLaneVec acc) {
    return _mm256_fmadd_ps(_mm256_set1_ps(a), b, acc);
}
#include "kernels/cpu/topk_panel_scores.h"
}  // namespace topk_lanes_fma
#if KNNGPT_TOPK_LANES_DISPATCH
#pragma GCC pop_options
#endif
#endif

// whether this process scores with the AVX/FMA backend (the CPU has both, and the OS
// saves the 256-bit registers: libgcc's cpu model checks that)
inline bool topk_lanes_use_fma() {
#if KNNGPT_TOPK_LANES_DISPATCH
    static const bool supported = (__builtin_cpu_init(), __builtin_cpu_supports("avx") && __builtin_cpu_supports("fma"));
    return supported;
#else
    return KNNGPT_TOPK_LANES_FMA;
#endif
}

// ----------------------------------------------------------------------------
// the score routines (topk_panel_scores.h) of the backend in use

// scores of one query q against chunks [c0, c1) of a panel: out[(c - c0) * 8 + l]
inline void topk_score_chunks(float* out, const float* q, const float* panel, int c0, int c1, int HS) {
#if KNNGPT_TOPK_LANES_FMA
    if (topk_lanes_use_fma()) return topk_lanes_fma::topk_score_chunks(out, q, panel, c0, c1, HS);
#endif
    topk_lanes_portable::topk_score_chunks(out, q, panel, c0, c1, HS);
}

// q4[4 d + r] = q[r][d]: four queries interleaved, the layout of topk_score_chunks_4q
inline void topk_interleave_queries(float* q4, const float* const* q, int HS) {
    for (int r = 0; r < 4; r++)
        for (int d = 0; d < HS; d++) q4[4 * d + r] = q[r][d];
}

// scores of four queries against chunks [0, c1): row r at out + r * ld_out. q4 holds
// the queries interleaved, q4[d * 4 + r] = q_r[d] (topk_interleave_queries)
inline void topk_score_chunks_4q(float* out, size_t ld_out, const float* q4, const float* panel, int c1, int HS) {
#if KNNGPT_TOPK_LANES_FMA
    if (topk_lanes_use_fma()) return topk_lanes_fma::topk_score_chunks_4q(out, ld_out, q4, panel, c1, HS);
#endif
    topk_lanes_portable::topk_score_chunks_4q(out, ld_out, q4, panel, c1, HS);
}

// scores of one query against a list of chunks of a panel: out[u * 8 + l] for chunk chunk_ids[u]
inline void topk_score_chunk_list(float* out, const float* q, const float* panel, const int* chunk_ids, int n,
                                  int HS) {
#if KNNGPT_TOPK_LANES_FMA
    if (topk_lanes_use_fma()) return topk_lanes_fma::topk_score_chunk_list(out, q, panel, chunk_ids, n, HS);
#endif
    topk_lanes_portable::topk_score_chunk_list(out, q, panel, chunk_ids, n, HS);
}

// scores of one query against chunks given by address: out[u * 8 + l] for chunk[u]
inline void topk_score_chunk_ptrs(float* out, const float* q, const float* const* chunk, int n, int HS) {
#if KNNGPT_TOPK_LANES_FMA
    if (topk_lanes_use_fma()) return topk_lanes_fma::topk_score_chunk_ptrs(out, q, chunk, n, HS);
#endif
    topk_lanes_portable::topk_score_chunk_ptrs(out, q, chunk, n, HS);
}

}  // namespace knngpt::cpu
