// kernels/cpu/sparse_attention.h — softmax attention over per-query key lists with
// log-weights: the one forward and backward behind every key-selecting mode, knn
// (ALGORITHMS.md §2), knn-tail (§3) and kmv (§7.4), in the key-list form of §9.2.
// Twin of kernels/cuda/sparse_attention.cuh.
//
//   For batch b, head h, query i and the K slots t of its list (tau = 1/sqrt(HS)):
//     j_t   = idx[b,h,i,t]                      a key j_t <= i, or -1: slot unused, skipped
//     a_t   = tau q_i . k_{j_t} + logw[b,h,i,t]  (logw == nullptr: all 0)
//     lse_i = log sum_t exp(a_t)
//     P_t   = exp(a_t - lse_i)
//     o_i   = sum_t P_t v_{j_t}
//   A key listed in two slots counts twice (a softmax over the multiset, §3.5).
//   A list with no valid slot gives o_i = 0, lse_i = -inf, and no gradient.
//
//   backward, given dO: the exact gradient of the function above with the lists
//   and log-weights held fixed (§2.3, §3.5); the selection is piecewise constant.
//     Delta_i = dO_i . o_i
//     dS_t    = P_t (dO_i . v_{j_t} - Delta_i)
//     dQ_i   += tau sum_t dS_t k_{j_t}
//     dK_j   += tau sum_{(i,t): j_t = j} dS_t q_i
//     dV_j   += sum_{(i,t): j_t = j} P_t dO_i
//
// Shapes: qkv/dqkv (B, T, 3C) laid out as in attention.h (q, k, v; head h owns
// channels h*HS.. of each); out/dout (B, T, C); lse (B, NH, T);
// idx and logw (B, NH, T, K).
// Saved for backward: out and lse (the caller keeps idx and logw). Backward
// recomputes P_t from lse and accumulates (+=) into dqkv.
// Design: one thread owns a (b, h): it packs the head's k and v rows (3C floats apart in
// qkv) into a contiguous (T, 2 HS) scratch, (T, 4 HS) with dK and dV in the backward, so
// that the gathers stay in its cache; in the backward it walks the queries and their slots
// in order and scatters into the packed dK and dV, added to dqkv at the end. The result
// therefore does not depend on the thread count (no atomics). Work O(T K HS) per head;
// nothing is T x T.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/vector_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define KNNGPT_SPARSE_AVX512 1
#else
#define KNNGPT_SPARSE_AVX512 0
#endif

namespace knngpt::cpu {

// out[w] = a . b[w] over n floats for w < W: each with 16 partial sums (one AVX-512 or
// two AVX2 registers), added pairwise at the end (vectorises without the serial chain
// of scalar adds that ends an omp simd reduction); W of them side by side, so that
// their loads and adds overlap. Every w gets the bits of a lone dot (W = 1).
constexpr int kSparseLanes = 16;
constexpr int kSparseSlots = 8;  // list slots scored side by side

#if KNNGPT_SPARSE_AVX512
// out[w] = the pairwise sum of p[w][0..16) for 8 slots: p[l] += p[l + 8], then p[l] += p[l + 4],
// p[l] += p[l + 2], out = p[0] + p[1], the additions of the plain reduction below (so the
// same bits), each instruction adding for two, four or eight slots
inline void sparse_reduce8_avx512(float* out, const float (*p)[kSparseLanes]) {
    // (the zero-masked shuffles: GCC 12 warns, wrongly, about the plain ones' undefined source)
    const __mmask16 all = 0xffff;
    __m512 s8[4], s4[2];
    for (int u = 0; u < 4; u++) {  // [slot 2u's 8 | slot 2u+1's 8]
        const __m512 x = _mm512_loadu_ps(p[2 * u]), y = _mm512_loadu_ps(p[2 * u + 1]);
        s8[u] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, x, y, 0x44), _mm512_maskz_shuffle_f32x4(all, x, y, 0xEE));
    }
    for (int u = 0; u < 2; u++)  // [slot 4u's 4 | 4u+1's | 4u+2's | 4u+3's]
        s4[u] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, s8[2 * u], s8[2 * u + 1], 0x88),
                              _mm512_maskz_shuffle_f32x4(all, s8[2 * u], s8[2 * u + 1], 0xDD));
    // 128-bit lane q: [slot q's 2 | slot q+4's 2], then [slot q, slot q+4, ..]
    const __m512 s2 = _mm512_add_ps(_mm512_maskz_shuffle_ps(all, s4[0], s4[1], 0x44),
                                    _mm512_maskz_shuffle_ps(all, s4[0], s4[1], 0xEE));
    const __m512 r = _mm512_add_ps(_mm512_maskz_shuffle_ps(all, s2, s2, 0x88), _mm512_maskz_shuffle_ps(all, s2, s2, 0xDD));
    float lanes[16];
    _mm512_storeu_ps(lanes, r);
    for (int q = 0; q < 4; q++) {
        out[q] = lanes[4 * q];
        out[q + 4] = lanes[4 * q + 1];
    }
}
#endif
template <int W>
inline void sparse_dots(float* out, const float* a, const float* const* b, int n) {
    float partial[W][kSparseLanes] = {};
    int c = 0;
    for (; c + kSparseLanes <= n; c += kSparseLanes)
        for (int w = 0; w < W; w++) {
            #pragma omp simd
            for (int l = 0; l < kSparseLanes; l++) partial[w][l] += a[c + l] * b[w][c + l];
        }
    for (int w = 0; w < W; w++)
        for (int l = 0; c + l < n; l++) partial[w][l] += a[c + l] * b[w][c + l];
#if KNNGPT_SPARSE_AVX512
    if constexpr (W == 8) {
        // the same pairwise adds for the eight slots at once, two to four slots a register
        sparse_reduce8_avx512(out, partial);
        return;
    }
#endif
    for (int w = 0; w < W; w++) {
        float* p = partial[w];
        for (int l = 0; l < 8; l++) p[l] += p[l + 8];
        for (int l = 0; l < 4; l++) p[l] += p[l + 4];
        for (int l = 0; l < 2; l++) p[l] += p[l + 2];
        out[w] = p[0] + p[1];
    }
}
inline float sparse_dot(const float* a, const float* b, int n) {
    float d;
    sparse_dots<1>(&d, a, &b, n);
    return d;
}

// out[t] = a . rows[t] for t < n (row pointers), kSparseSlots at a time (the last group
// repeats its first row in the unused places)
inline void sparse_list_dots(float* out, const float* a, const float* const* rows, int n, int HS) {
    for (int t0 = 0; t0 < n; t0 += kSparseSlots) {
        const float* group[kSparseSlots];
        float d[kSparseSlots];
        for (int w = 0; w < kSparseSlots; w++) group[w] = rows[t0 + w < n ? t0 + w : t0];
        sparse_dots<kSparseSlots>(d, a, group, HS);
        for (int w = 0; w < kSparseSlots && t0 + w < n; w++) out[t0 + w] = d[w];
    }
}

// out[c] = sum_t w_t x[t][c] for c < 16 NB, the NB x 16 running sums in registers while
// the n rows stream past (each channel summed in slot order)
template <int NB>
inline void sparse_weighted_sum_blocks(float* out, const float* w, const float* const* x, int c0, int n) {
    float acc[NB][kSparseLanes] = {};
    for (int t = 0; t < n; t++) {
        const float wt = w[t];
        const float* xt = x[t] + c0;
        for (int b = 0; b < NB; b++) {
            #pragma omp simd
            for (int l = 0; l < kSparseLanes; l++) acc[b][l] += wt * xt[b * kSparseLanes + l];
        }
    }
    for (int b = 0; b < NB; b++)
        for (int l = 0; l < kSparseLanes; l++) out[c0 + b * kSparseLanes + l] = acc[b][l];
}

// out[c] = sum_t w_t x[t][c] over the n rows x[t] (pointers), for c < HS, each channel
// summed in slot order: 8 blocks of 16 channels (128) per pass, then what is left
inline void sparse_weighted_row_sum(float* out, const float* w, const float* const* x, int n, int HS) {
    int c0 = 0;
    for (; c0 + 8 * kSparseLanes <= HS; c0 += 8 * kSparseLanes) sparse_weighted_sum_blocks<8>(out, w, x, c0, n);
    switch ((HS - c0) / kSparseLanes) {
        case 7: sparse_weighted_sum_blocks<7>(out, w, x, c0, n); break;
        case 6: sparse_weighted_sum_blocks<6>(out, w, x, c0, n); break;
        case 5: sparse_weighted_sum_blocks<5>(out, w, x, c0, n); break;
        case 4: sparse_weighted_sum_blocks<4>(out, w, x, c0, n); break;
        case 3: sparse_weighted_sum_blocks<3>(out, w, x, c0, n); break;
        case 2: sparse_weighted_sum_blocks<2>(out, w, x, c0, n); break;
        case 1: sparse_weighted_sum_blocks<1>(out, w, x, c0, n); break;
        default: break;
    }
    for (c0 += (HS - c0) / kSparseLanes * kSparseLanes; c0 < HS; c0++) {
        float acc = 0.0f;
        for (int t = 0; t < n; t++) acc += w[t] * x[t][c0];
        out[c0] = acc;
    }
}

// The valid slots of one list: their keys, their packed rows (row j at rows + j stride)
// and logits a_t = tau q . k_{j_t} + logw_t (k_{j_t} the first HS floats of the row),
// packed to the front of `keys`, `row` and `logits` (slot order kept). Returns how many.
inline int sparse_row_logits(int* keys, const float** row, float* logits, const float* q, const float* rows,
                             size_t stride, const int* idx_row, const float* logw_row, int K, int HS, float tau) {
    int count = 0;
    for (int t = 0; t < K; t++) {
        const int j = idx_row[t];
        if (j < 0) continue;
        keys[count] = j;
        row[count] = rows + (size_t)j * stride;
        count++;
    }
    sparse_list_dots(logits, q, row, count, HS);
    for (int u = 0, t = 0; t < K; t++) {
        if (idx_row[t] < 0) continue;
        logits[u] = tau * logits[u] + (logw_row ? logw_row[t] : 0.0f);
        u++;
    }
    return count;
}

// Copies the (T, HS) rows of one head, `src_stride` floats apart in qkv, to dst, row j at
// dst + j dst_stride.
inline void sparse_pack_head_rows(float* dst, size_t dst_stride, const float* src, int T, int HS, int src_stride) {
    for (int t = 0; t < T; t++)
        for (int c = 0; c < HS; c++) dst[(size_t)t * dst_stride + c] = src[(size_t)t * src_stride + c];
}

inline void sparse_attention_forward(float* out, float* lse, const float* qkv, const int* idx, const float* logw,
                                     int B, int T, int C, int NH, int K) {
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = attention_tau(HS);
    const size_t stride = 2 * (size_t)HS;  // packed row j: k_j, v_j
    #pragma omp parallel
    {
        // per-thread scratch: the head's rows packed (T, 2 HS), one list's keys, rows and
        // logits (then P), the rows' v parts
        std::vector<float> packed((size_t)T * stride);
        std::vector<int> keys(K > 0 ? K : 1);
        std::vector<const float*> rows(K > 0 ? K : 1), v_rows(K > 0 ? K : 1);
        std::vector<float> logits(K > 0 ? K : 1);
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                sparse_pack_head_rows(packed.data(), stride, qkv + at.k, T, HS, C3);
                sparse_pack_head_rows(packed.data() + HS, stride, qkv + at.v, T, HS, C3);
                for (int i = 0; i < T; i++) {
                    const size_t row = ((size_t)b * NH + h) * T + i;
                    const int* idx_row = idx + row * K;
                    const float* logw_row = logw ? logw + row * K : nullptr;
                    const float* q = qkv + at.q + (size_t)i * C3;
                    float* o = out + ((size_t)b * T + i) * C + (size_t)h * HS;
                    float* a = logits.data();
                    if (i + 1 < T)  // the next row's q and o
                        for (int c = 0; c < HS; c += 16) {
                            __builtin_prefetch(q + C3 + c);
                            __builtin_prefetch(o + C + c, 1);
                        }

                    const int n = sparse_row_logits(keys.data(), rows.data(), a, q, packed.data(), stride, idx_row, logw_row,
                                                    K, HS, tau);
                    if (n == 0) {  // an empty list: nothing attended
                        for (int c = 0; c < HS; c++) o[c] = 0.0f;
                        lse[row] = -INFINITY;
                        continue;
                    }
                    // softmax over the slots, max subtracted
                    float row_max = a[0];
                    for (int t = 1; t < n; t++) row_max = a[t] > row_max ? a[t] : row_max;
                    float exp_sum = 0.0f;
                    #pragma omp simd reduction(+:exp_sum)
                    for (int t = 0; t < n; t++) {
                        a[t] = exp_vectorizable(a[t] - row_max);
                        exp_sum += a[t];
                    }
                    const float inv_sum = 1.0f / exp_sum;
                    for (int t = 0; t < n; t++) a[t] *= inv_sum;
                    // o_i = sum_t P_t v_{j_t}
                    for (int t = 0; t < n; t++) v_rows[t] = rows[t] + HS;
                    sparse_weighted_row_sum(o, a, v_rows.data(), n, HS);
                    lse[row] = row_max + std::log(exp_sum);
                }
            }
        }
    }
}

inline void sparse_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                      const float* lse, const int* idx, const float* logw,
                                      int B, int T, int C, int NH, int K) {
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = attention_tau(HS);
    const size_t stride = 4 * (size_t)HS;  // packed row j: k_j, v_j, dK_j, dV_j
    #pragma omp parallel
    {
        // per-thread scratch: the head's rows packed (T, 4 HS), one list's keys, rows,
        // logits (then P), dS tau and the rows' v parts, and the dQ row
        std::vector<float> packed((size_t)T * stride);
        std::vector<int> keys(K > 0 ? K : 1);
        std::vector<const float*> rows(K > 0 ? K : 1), v_rows(K > 0 ? K : 1);
        std::vector<float> logits(K > 0 ? K : 1), ds_tau(K > 0 ? K : 1);
        std::vector<float> dq_acc(HS);
        // dK and dV of a head collect from every query of that head: one (b, h) per thread
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                sparse_pack_head_rows(packed.data(), stride, qkv + at.k, T, HS, C3);
                sparse_pack_head_rows(packed.data() + HS, stride, qkv + at.v, T, HS, C3);
                for (int j = 0; j < T; j++) std::fill_n(packed.data() + (size_t)j * stride + 2 * HS, 2 * HS, 0.0f);
                for (int i = 0; i < T; i++) {
                    const size_t row = ((size_t)b * NH + h) * T + i;
                    const int* idx_row = idx + row * K;
                    const float* logw_row = logw ? logw + row * K : nullptr;
                    const float* q = qkv + at.q + (size_t)i * C3;
                    float* dq = dqkv + at.q + (size_t)i * C3;
                    const float* o = out + ((size_t)b * T + i) * C + (size_t)h * HS;
                    const float* d_o = dout + ((size_t)b * T + i) * C + (size_t)h * HS;
                    float* P = logits.data();

                    const int n = sparse_row_logits(keys.data(), rows.data(), P, q, packed.data(), stride, idx_row, logw_row,
                                                    K, HS, tau);
                    if (n == 0) continue;
                    // P_t = exp(a_t - lse_i), from the saved log-normaliser
                    const float lse_i = lse[row];
                    #pragma omp simd
                    for (int t = 0; t < n; t++) P[t] = exp_vectorizable(P[t] - lse_i);
                    // Delta_i = dO_i . o_i, and dS_t tau = tau P_t (dO_i . v_j - Delta_i)
                    const float delta = sparse_dot(d_o, o, HS);
                    for (int t = 0; t < n; t++) v_rows[t] = rows[t] + HS;
                    sparse_list_dots(ds_tau.data(), d_o, v_rows.data(), n, HS);
                    for (int t = 0; t < n; t++) ds_tau[t] = tau * P[t] * (ds_tau[t] - delta);
                    // dQ_i += tau sum_t dS_t k_j
                    sparse_weighted_row_sum(dq_acc.data(), ds_tau.data(), rows.data(), n, HS);
                    for (int c = 0; c < HS; c++) dq[c] += dq_acc[c];
                    // dK_j += tau dS_t q_i and dV_j += P_t dO_i, slot by slot; meanwhile the
                    // next row's packed rows are asked for, one a slot (they are scattered
                    // over the head, and its passes wait on them otherwise)
                    const int* next_row = i + 1 < T ? idx_row + K : nullptr;
                    if (next_row)  // and its own rows: q, dQ (in qkv's layout), o and dO
                        for (int c = 0; c < HS; c += 16) {
                            __builtin_prefetch(q + C3 + c);
                            __builtin_prefetch(dq + C3 + c, 1);
                            __builtin_prefetch(o + C + c);
                            __builtin_prefetch(d_o + C + c);
                        }
                    for (int t = 0; t < n; t++) {
                        if (next_row && next_row[t] >= 0) {
                            const float* r = packed.data() + (size_t)next_row[t] * stride;
                            for (size_t c = 0; c < stride; c += 16) __builtin_prefetch(r + c, 1);
                        }
                        float* dk_j = packed.data() + (size_t)keys[t] * stride + 2 * HS;
                        float* dv_j = dk_j + HS;
                        const float ds = ds_tau[t], p = P[t];
                        #pragma omp simd
                        for (int c = 0; c < HS; c++) {
                            dk_j[c] += ds * q[c];
                            dv_j[c] += p * d_o[c];
                        }
                    }
                }
                // the head's dK and dV into dqkv
                for (int j = 0; j < T; j++) {
                    float* dk = dqkv + at.k + (size_t)j * C3;
                    float* dv = dqkv + at.v + (size_t)j * C3;
                    const float* packed_j = packed.data() + (size_t)j * stride + 2 * HS;
                    for (int c = 0; c < HS; c++) {
                        dk[c] += packed_j[c];
                        dv[c] += packed_j[HS + c];
                    }
                }
            }
        }
    }
}

}  // namespace knngpt::cpu
