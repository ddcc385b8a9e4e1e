// kernels/cpu/sparse_attention.h — softmax attention over per-query key lists
// with log-weights: the one forward/backward behind every key-selecting mode,
// knn (ALGORITHMS.md §2) and knn-tail (§3) first (the key-list form of §9.2).
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
//
// Work: gathers, O(T K HS) per head, no T x T buffer. OpenMP over (b, h): a
// thread first packs the head's k and v rows (T, HS) contiguously (they are 3C
// floats apart in qkv), so the gathers stay in its cache. A slot's score is one
// HS-long dot product with 16 partial sums; the output sums 16 channels at a
// time over the slots in registers. Backward: inside a head one thread walks
// the queries and their slots in ascending order and scatters into the head's
// packed dK and dV, added to dqkv at the end; so the result does not depend on
// the thread count (no atomics). Scratch per thread: 2 (forward) or 4
// (backward) x T x HS floats.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/vector_math.h"

namespace knngpt::cpu {

// a . b over n floats with 16 partial sums (one AVX-512 or two AVX2 registers), added
// pairwise at the end: vectorises without the serial chain of scalar adds that ends an
// omp simd reduction.
constexpr int kSparseLanes = 16;
inline float sparse_dot(const float* a, const float* b, int n) {
    float partial[kSparseLanes] = {};
    int c = 0;
    for (; c + kSparseLanes <= n; c += kSparseLanes) {
        #pragma omp simd
        for (int l = 0; l < kSparseLanes; l++) partial[l] += a[c + l] * b[c + l];
    }
    for (int l = 0; c + l < n; l++) partial[l] += a[c + l] * b[c + l];
    for (int l = 0; l < 8; l++) partial[l] += partial[l + 8];
    for (int l = 0; l < 4; l++) partial[l] += partial[l + 4];
    for (int l = 0; l < 2; l++) partial[l] += partial[l + 2];
    return partial[0] + partial[1];
}

// out[c] = sum_t w_t rows[keys_t][c] over the (., HS) rows: 16 channels at a time, the
// running sums held in registers while the n rows stream past.
inline void sparse_weighted_row_sum(float* out, const float* w, const int* keys, int n, const float* rows, int HS) {
    int c0 = 0;
    for (; c0 + kSparseLanes <= HS; c0 += kSparseLanes) {
        float acc[kSparseLanes] = {};
        for (int t = 0; t < n; t++) {
            const float* x = rows + (size_t)keys[t] * HS + c0;
            #pragma omp simd
            for (int l = 0; l < kSparseLanes; l++) acc[l] += w[t] * x[l];
        }
        for (int l = 0; l < kSparseLanes; l++) out[c0 + l] = acc[l];
    }
    for (; c0 < HS; c0++) {
        float acc = 0.0f;
        for (int t = 0; t < n; t++) acc += w[t] * rows[(size_t)keys[t] * HS + c0];
        out[c0] = acc;
    }
}

// The valid slots of one list: their keys and logits a_t = tau q . k_{j_t} + logw_t,
// packed to the front of `keys` and `logits` (slot order kept). k_rows holds the
// head's keys (T, HS). Returns how many.
inline int sparse_row_logits(int* keys, float* logits, const float* q, const float* k_rows, const int* idx_row,
                             const float* logw_row, int K, int HS, float tau) {
    int count = 0;
    for (int t = 0; t < K; t++) {
        const int j = idx_row[t];
        if (j < 0) continue;
        keys[count] = j;
        logits[count] = tau * sparse_dot(q, k_rows + (size_t)j * HS, HS) + (logw_row ? logw_row[t] : 0.0f);
        count++;
    }
    return count;
}

// Copies the (T, HS) rows of one head, `stride` floats apart in qkv, to a contiguous buffer.
inline void sparse_pack_head_rows(float* packed, const float* src, int T, int HS, int stride) {
    for (int t = 0; t < T; t++)
        for (int c = 0; c < HS; c++) packed[(size_t)t * HS + c] = src[(size_t)t * stride + c];
}

inline void sparse_attention_forward(float* out, float* lse, const float* qkv, const int* idx, const float* logw,
                                     int B, int T, int C, int NH, int K) {
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = attention_tau(HS);
    #pragma omp parallel
    {
        // per-thread scratch: the head's k and v packed (T, HS), one list's keys and logits (then P)
        std::vector<float> k_packed((size_t)T * HS), v_packed((size_t)T * HS);
        std::vector<int> keys(K > 0 ? K : 1);
        std::vector<float> logits(K > 0 ? K : 1);
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                sparse_pack_head_rows(k_packed.data(), qkv + at.k, T, HS, C3);
                sparse_pack_head_rows(v_packed.data(), qkv + at.v, T, HS, C3);
                for (int i = 0; i < T; i++) {
                    const size_t row = ((size_t)b * NH + h) * T + i;
                    const int* idx_row = idx + row * K;
                    const float* logw_row = logw ? logw + row * K : nullptr;
                    const float* q = qkv + at.q + (size_t)i * C3;
                    float* o = out + ((size_t)b * T + i) * C + (size_t)h * HS;
                    float* a = logits.data();

                    const int n = sparse_row_logits(keys.data(), a, q, k_packed.data(), idx_row, logw_row, K, HS, tau);
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
                    sparse_weighted_row_sum(o, a, keys.data(), n, v_packed.data(), HS);
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
    #pragma omp parallel
    {
        // per-thread scratch: the head's k and v packed (T, HS) and its dK and dV (T, HS),
        // one list's keys and logits (then P), and the dQ row
        std::vector<float> k_packed((size_t)T * HS), v_packed((size_t)T * HS);
        std::vector<float> dk_packed((size_t)T * HS), dv_packed((size_t)T * HS);
        std::vector<int> keys(K > 0 ? K : 1);
        std::vector<float> logits(K > 0 ? K : 1);
        std::vector<float> dq_acc(HS);
        // dK and dV of a head collect from every query of that head: one (b, h) per thread
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                sparse_pack_head_rows(k_packed.data(), qkv + at.k, T, HS, C3);
                sparse_pack_head_rows(v_packed.data(), qkv + at.v, T, HS, C3);
                std::fill(dk_packed.begin(), dk_packed.end(), 0.0f);
                std::fill(dv_packed.begin(), dv_packed.end(), 0.0f);
                for (int i = 0; i < T; i++) {
                    const size_t row = ((size_t)b * NH + h) * T + i;
                    const int* idx_row = idx + row * K;
                    const float* logw_row = logw ? logw + row * K : nullptr;
                    const float* q = qkv + at.q + (size_t)i * C3;
                    float* dq = dqkv + at.q + (size_t)i * C3;
                    const float* o = out + ((size_t)b * T + i) * C + (size_t)h * HS;
                    const float* d_o = dout + ((size_t)b * T + i) * C + (size_t)h * HS;
                    float* P = logits.data();

                    const int n = sparse_row_logits(keys.data(), P, q, k_packed.data(), idx_row, logw_row, K, HS, tau);
                    if (n == 0) continue;
                    // P_t = exp(a_t - lse_i), from the saved log-normaliser
                    const float lse_i = lse[row];
                    #pragma omp simd
                    for (int t = 0; t < n; t++) P[t] = exp_vectorizable(P[t] - lse_i);
                    // Delta_i = dO_i . o_i
                    const float delta = sparse_dot(d_o, o, HS);

                    for (int c = 0; c < HS; c++) dq_acc[c] = 0.0f;
                    for (int t = 0; t < n; t++) {
                        const size_t key_offset = (size_t)keys[t] * HS;
                        const float* k_j = k_packed.data() + key_offset;
                        const float* v_j = v_packed.data() + key_offset;
                        float* dk_j = dk_packed.data() + key_offset;
                        float* dv_j = dv_packed.data() + key_offset;
                        // dS_t = P_t (dO_i . v_j - Delta_i)
                        const float dp = sparse_dot(d_o, v_j, HS);
                        const float p = P[t];
                        const float ds_tau = tau * p * (dp - delta);
                        #pragma omp simd
                        for (int c = 0; c < HS; c++) {
                            dq_acc[c] += ds_tau * k_j[c];  // dQ_i += tau dS_t k_j
                            dk_j[c] += ds_tau * q[c];      // dK_j += tau dS_t q_i
                            dv_j[c] += p * d_o[c];         // dV_j += P_t dO_i
                        }
                    }
                    for (int c = 0; c < HS; c++) dq[c] += dq_acc[c];
                }
                // the head's dK and dV into dqkv
                for (int j = 0; j < T; j++) {
                    float* dk = dqkv + at.k + (size_t)j * C3;
                    float* dv = dqkv + at.v + (size_t)j * C3;
                    for (int c = 0; c < HS; c++) {
                        dk[c] += dk_packed[(size_t)j * HS + c];
                        dv[c] += dv_packed[(size_t)j * HS + c];
                    }
                }
            }
        }
    }
}

}  // namespace knngpt::cpu
