// kernels/cpu/topk_panel.h — key panels and their 8-lane scores: the inner loop of
// every CPU top-k index (ALGORITHMS.md §6; the score of §2.1).
//
//   panel  the keys of one (b, h) in chunks of 8: (chunks, HS, 8), chunks = ceil(T / 8),
//          chunk c, lane l holds key j = 8c + l (zero for j >= T); all heads (B, NH, chunks, HS, 8)
//   score  out[8u + l] = attention_dot(q, key in lane l of chunk u, HS):
//          acc = 0; for d = 0..HS-1: acc = fmaf(q_d, k_jd, acc)   (kernels/common/attention_score.h)
//
// A chunk's 8 scores are 8 independent fma chains over contiguous loads, one key per
// vector lane, and each lane repeats attention_dot's chain exactly: AVX2/FMA intrinsics
// where the build has FMA, otherwise a per-lane std::fma (one correctly rounded fma, on
// any CPU). The routines differ only in how many chains they keep in flight, never in a
// lane's operations, so every score is attention_dot's bit for bit in every build (padded
// lanes score 0). That is what makes the block index equal the brute force and the CPU
// lists equal the CUDA kernel's; tests/test_topk_index.cpp checks it for HS = 1..130.
#pragma once

#include <cmath>
#include <cstddef>

#if defined(__AVX__) && defined(__FMA__)
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
    for (int c = 0; c < topk_num_chunks(n); c++) {
        float* chunk = panel + (size_t)c * HS * kTopkLanes;
        for (int l = 0; l < kTopkLanes; l++) {
            const int u = c * kTopkLanes + l;
            const float* key = u < n ? key_of(u) : nullptr;
            for (int d = 0; d < HS; d++) chunk[d * kTopkLanes + l] = key ? key[d] : 0.0f;
        }
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

// Eight fp32 lanes, one key each; a lane's fma is exactly attention_dot's fmaf. AVX2/FMA
// intrinsics where available (g++ does not reliably vectorise the lane loops),
// otherwise plain per-lane loops: the same operations, the same results.
#if defined(__AVX__) && defined(__FMA__)
using TopkLaneVec = __m256;
inline TopkLaneVec topk_lanes_zero() { return _mm256_setzero_ps(); }
inline TopkLaneVec topk_lanes_load(const float* p) { return _mm256_loadu_ps(p); }
inline void topk_lanes_store(float* p, TopkLaneVec v) { _mm256_storeu_ps(p, v); }
inline TopkLaneVec topk_lanes_fma(float a, TopkLaneVec b, TopkLaneVec acc) {
    return _mm256_fmadd_ps(_mm256_set1_ps(a), b, acc);
}
#else
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
#endif

// N independent chains (N chunks in flight keep both fma ports busy): the scores of the
// query q[d * q_step] against the 8 keys of each chunk[u] into out[u * 8 + l]
template <int N>
inline void topk_score_chunk_group(float* out, const float* q, int q_step, const float* const* chunk, int HS) {
    TopkLaneVec acc[N];
    for (int u = 0; u < N; u++) acc[u] = topk_lanes_zero();
    for (int d = 0; d < HS; d++) {
        const float qd = q[d * q_step];
        for (int u = 0; u < N; u++) acc[u] = topk_lanes_fma(qd, topk_lanes_load(chunk[u] + d * kTopkLanes), acc[u]);
    }
    for (int u = 0; u < N; u++) topk_lanes_store(out + u * kTopkLanes, acc[u]);
}

// scores of one query q against chunks [c0, c1) of a panel: out[(c - c0) * 8 + l];
// eight chunks (64 keys) at a time, then four, then one
inline void topk_score_chunks(float* out, const float* q, const float* panel, int c0, int c1, int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    const float* chunk[8];
    int c = c0;
    for (; c + 8 <= c1; c += 8) {
        for (int u = 0; u < 8; u++) chunk[u] = panel + (size_t)(c + u) * chunk_size;
        topk_score_chunk_group<8>(out + (size_t)(c - c0) * kTopkLanes, q, 1, chunk, HS);
    }
    for (; c + 4 <= c1; c += 4) {
        for (int u = 0; u < 4; u++) chunk[u] = panel + (size_t)(c + u) * chunk_size;
        topk_score_chunk_group<4>(out + (size_t)(c - c0) * kTopkLanes, q, 1, chunk, HS);
    }
    for (; c < c1; c++) {
        chunk[0] = panel + (size_t)c * chunk_size;
        topk_score_chunk_group<1>(out + (size_t)(c - c0) * kTopkLanes, q, 1, chunk, HS);
    }
}

// q4[4 d + r] = q[r][d]: four queries interleaved, the layout of topk_score_chunks_4q
inline void topk_interleave_queries(float* q4, const float* const* q, int HS) {
    for (int r = 0; r < 4; r++)
        for (int d = 0; d < HS; d++) q4[4 * d + r] = q[r][d];
}

// scores of four queries against chunks [0, c1): row r at out + r * ld_out. q4 holds
// the queries interleaved, q4[d * 4 + r] = q_r[d] (one pointer keeps the loop in registers).
inline void topk_score_chunks_4q(float* out, size_t ld_out, const float* q4, const float* panel, int c1, int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    int c = 0;
    // two chunks x four queries: eight independent chains
    for (; c + 2 <= c1; c += 2) {
        const float* k0 = panel + (size_t)c * chunk_size;
        TopkLaneVec a00 = topk_lanes_zero(), a10 = topk_lanes_zero(), a20 = topk_lanes_zero(), a30 = topk_lanes_zero();
        TopkLaneVec a01 = topk_lanes_zero(), a11 = topk_lanes_zero(), a21 = topk_lanes_zero(), a31 = topk_lanes_zero();
        for (int d = 0; d < HS; d++) {
            const float* qd = q4 + 4 * d;
            const TopkLaneVec x0 = topk_lanes_load(k0 + d * kTopkLanes);
            const TopkLaneVec x1 = topk_lanes_load(k0 + chunk_size + d * kTopkLanes);
            a00 = topk_lanes_fma(qd[0], x0, a00);
            a10 = topk_lanes_fma(qd[1], x0, a10);
            a20 = topk_lanes_fma(qd[2], x0, a20);
            a30 = topk_lanes_fma(qd[3], x0, a30);
            a01 = topk_lanes_fma(qd[0], x1, a01);
            a11 = topk_lanes_fma(qd[1], x1, a11);
            a21 = topk_lanes_fma(qd[2], x1, a21);
            a31 = topk_lanes_fma(qd[3], x1, a31);
        }
        const size_t o = (size_t)c * kTopkLanes;
        topk_lanes_store(out + o, a00);
        topk_lanes_store(out + ld_out + o, a10);
        topk_lanes_store(out + 2 * ld_out + o, a20);
        topk_lanes_store(out + 3 * ld_out + o, a30);
        topk_lanes_store(out + o + kTopkLanes, a01);
        topk_lanes_store(out + ld_out + o + kTopkLanes, a11);
        topk_lanes_store(out + 2 * ld_out + o + kTopkLanes, a21);
        topk_lanes_store(out + 3 * ld_out + o + kTopkLanes, a31);
    }
    if (c < c1) {  // an odd last chunk, one query at a time
        const float* chunk[1] = {panel + (size_t)c * chunk_size};
        for (int r = 0; r < 4; r++)
            topk_score_chunk_group<1>(out + r * ld_out + (size_t)c * kTopkLanes, q4 + r, 4, chunk, HS);
    }
}

// scores of one query against a list of chunks of a panel: out[u * 8 + l] for chunk
// chunk_ids[u], eight chunks at a time, then one at a time
inline void topk_score_chunk_list(float* out, const float* q, const float* panel, const int* chunk_ids, int n,
                                  int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    const float* chunk[8];
    int u = 0;
    for (; u + 8 <= n; u += 8) {
        for (int v = 0; v < 8; v++) chunk[v] = panel + (size_t)chunk_ids[u + v] * chunk_size;
        topk_score_chunk_group<8>(out + (size_t)u * kTopkLanes, q, 1, chunk, HS);
    }
    for (; u < n; u++) {
        chunk[0] = panel + (size_t)chunk_ids[u] * chunk_size;
        topk_score_chunk_group<1>(out + (size_t)u * kTopkLanes, q, 1, chunk, HS);
    }
}

}  // namespace knngpt::cpu
