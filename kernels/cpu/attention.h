// kernels/cpu/attention.h — exact causal multi-head attention, flash style; twin of
// kernels/cuda/attention.cuh (kernels/cuda/attention_exact.cuh chooses which CUDA kernels
// the trainer runs).
//
//   For batch b, head h, query i and key j <= i (tau = 1/sqrt(HS)):
//     s_ij   = tau q_i . k_j
//     lse_i  = log sum_{j<=i} exp(s_ij)
//     P_ij   = exp(s_ij - lse_i)
//     o_i    = sum_{j<=i} P_ij v_j
//   backward, given dO:
//     dV_j  += sum_i P_ij dO_i
//     dP_ij  = dO_i . v_j
//     Delta_i = dO_i . o_i
//     dS_ij  = P_ij (dP_ij - Delta_i)
//     dQ_i  += tau sum_j dS_ij k_j
//     dK_j  += tau sum_i dS_ij q_i
//
// Shapes: qkv/dqkv (B, T, 3C) with q = channels [0, C), k = [C, 2C), v = [2C, 3C);
// head h owns channels h*HS .. h*HS+HS-1 of each, HS = C / NH.
// out/dout (B, T, C), head h written at channels h*HS..; lse (B, NH, T).
// Saved for backward: out and lse. Backward recomputes P from lse instead of
// storing the (B, NH, T, T) probabilities, and accumulates (+=) into dqkv.
// Design: work per (b, h) on blocks of kAttentionQueryBlock queries, whose scores against
// keys 0..(the block's last query) fit a per-thread (block, T) scratch: memory stays
// O(block * T) per thread at any T, and the block's products are sgemm calls (run
// single-threaded inside the OpenMP region). exp is exp_vectorizable (vector_math.h).
#pragma once

#include <cblas.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/common/attention_score.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/cpu/parallel.h"

namespace knngpt::cpu {

constexpr int kAttentionQueryBlock = 64;

// Where head h of batch b starts in a (B, T, 3C) qkv buffer, for the q, k and v parts.
struct AttentionHeadOffsets {
    size_t q, k, v;
};
inline AttentionHeadOffsets attention_head_offsets(int b, int h, int T, int C, int HS) {
    const size_t batch = (size_t)b * T * 3 * C;
    return {batch + (size_t)h * HS, batch + C + (size_t)h * HS, batch + 2 * (size_t)C + (size_t)h * HS};
}

inline void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = attention_tau(HS);
    const int num_blocks = (T + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
    #pragma omp parallel if (parallel_pays((size_t)B * NH * T * T / 2 * HS))
    {
        // per-thread scratch: the block's scores, then its probabilities, (block, keys)
        std::vector<float> probs((size_t)kAttentionQueryBlock * T);
        #pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int blk = 0; blk < num_blocks; blk++) {
                    // the last blocks see the most keys: hand them out first
                    const int i0 = (num_blocks - 1 - blk) * kAttentionQueryBlock;
                    const int i1 = i0 + kAttentionQueryBlock < T ? i0 + kAttentionQueryBlock : T;
                    const int rows = i1 - i0;  // queries i0..i1-1
                    const int keys = i1;       // keys 0..i1-1: all any query of the block sees
                    const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                    const float* q = qkv + at.q + (size_t)i0 * C3;
                    const float* k = qkv + at.k;
                    const float* v = qkv + at.v;
                    float* o = out + ((size_t)b * T + i0) * C + (size_t)h * HS;
                    float* lse_bh = lse + ((size_t)b * NH + h) * T;
                    float* P = probs.data();

                    // S(rows, keys) = tau Q K^T
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS,
                                tau, q, C3, k, C3, 0.0f, P, keys);
                    // row softmax over the causal keys j <= i; masked keys get P = 0
                    for (int r = 0; r < rows; r++) {
                        const int i = i0 + r;
                        float* p_row = P + (size_t)r * keys;
                        float row_max = p_row[0];
                        #pragma omp simd reduction(max:row_max)
                        for (int j = 1; j <= i; j++) row_max = p_row[j] > row_max ? p_row[j] : row_max;
                        float exp_sum = 0.0f;
                        #pragma omp simd reduction(+:exp_sum)
                        for (int j = 0; j <= i; j++) {
                            p_row[j] = exp_vectorizable(p_row[j] - row_max);
                            exp_sum += p_row[j];
                        }
                        const float inv_sum = 1.0f / exp_sum;
                        #pragma omp simd
                        for (int j = 0; j <= i; j++) p_row[j] *= inv_sum;
                        for (int j = i + 1; j < keys; j++) p_row[j] = 0.0f;
                        lse_bh[i] = row_max + std::log(exp_sum);
                    }
                    // O(rows, HS) = P V
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, keys,
                                1.0f, P, keys, v, C3, 0.0f, o, C);
                }
            }
        }
    }
}

inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const float* lse, int B, int T, int C, int NH) {
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = attention_tau(HS);
    const int num_blocks = (T + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
    #pragma omp parallel if (parallel_pays((size_t)B * NH * T * T / 2 * HS))
    {
        // per-thread scratch, (block, keys) each: P, and dP which becomes dS in place
        std::vector<float> probs((size_t)kAttentionQueryBlock * T);
        std::vector<float> dprobs((size_t)kAttentionQueryBlock * T);
        // dK and dV of a head collect from every query block: one (b, h) per iteration
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                const float* lse_bh = lse + ((size_t)b * NH + h) * T;
                for (int blk = 0; blk < num_blocks; blk++) {
                    const int i0 = blk * kAttentionQueryBlock;
                    const int i1 = i0 + kAttentionQueryBlock < T ? i0 + kAttentionQueryBlock : T;
                    const int rows = i1 - i0;
                    const int keys = i1;
                    const float* q = qkv + at.q + (size_t)i0 * C3;
                    const float* k = qkv + at.k;
                    const float* v = qkv + at.v;
                    float* dq = dqkv + at.q + (size_t)i0 * C3;
                    float* dk = dqkv + at.k;
                    float* dv = dqkv + at.v;
                    const float* o = out + ((size_t)b * T + i0) * C + (size_t)h * HS;
                    const float* d_o = dout + ((size_t)b * T + i0) * C + (size_t)h * HS;
                    float* P = probs.data();
                    float* dS = dprobs.data();

                    // P(rows, keys) = exp(tau Q K^T - lse), 0 for masked keys j > i
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS,
                                tau, q, C3, k, C3, 0.0f, P, keys);
                    for (int r = 0; r < rows; r++) {
                        const int i = i0 + r;
                        float* p_row = P + (size_t)r * keys;
                        const float lse_i = lse_bh[i];
                        #pragma omp simd
                        for (int j = 0; j <= i; j++) p_row[j] = exp_vectorizable(p_row[j] - lse_i);
                        for (int j = i + 1; j < keys; j++) p_row[j] = 0.0f;
                    }
                    // dP(rows, keys) = dO V^T
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS,
                                1.0f, d_o, C, v, C3, 0.0f, dS, keys);
                    // dS = P (dP - Delta_i), Delta_i = dO_i . o_i  (0 where masked, since P is)
                    for (int r = 0; r < rows; r++) {
                        const float* d_o_r = d_o + (size_t)r * C;
                        const float* o_r = o + (size_t)r * C;
                        float delta = 0.0f;
                        #pragma omp simd reduction(+:delta)
                        for (int c = 0; c < HS; c++) delta += d_o_r[c] * o_r[c];
                        const float* p_row = P + (size_t)r * keys;
                        float* ds_row = dS + (size_t)r * keys;
                        #pragma omp simd
                        for (int j = 0; j < keys; j++) ds_row[j] = p_row[j] * (ds_row[j] - delta);
                    }
                    // dV(keys, HS) += P^T dO
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, HS, rows,
                                1.0f, P, keys, d_o, C, 1.0f, dv, C3);
                    // dQ(rows, HS) += tau dS K
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, keys,
                                tau, dS, keys, k, C3, 1.0f, dq, C3);
                    // dK(keys, HS) += tau dS^T Q
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, HS, rows,
                                tau, dS, keys, q, C3, 1.0f, dk, C3);
                }
            }
        }
    }
}

}  // namespace knngpt::cpu
