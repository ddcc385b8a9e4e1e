// kernels/cpu/topk_lsh.h — the approximate causal top-k of SimHash on MIPS-padded
// vectors (ALGORITHMS.md §6; randomness of §9.3).
//
//   key code    bit m of table t = [a_tm . (k_j, sqrt(R^2 - ||k_j||^2)) >= 0],  R = max_j ||k_j|| over the (b, h)
//   query code  bit m of table t = [a_tm . (q_i, 0) >= 0],                     a_tm in R^(HS+1)
//   S_i         of the keys j <= i sharing the query's bucket in any table, the k best by
//               (attention_dot desc, j asc); if fewer than n = min(k, i + 1) turn up, the
//               most recent keys i, i-1, .. not already candidates fill the row, so every row
//               has exactly n distinct keys. With num_bits = 0 every key is a candidate and lsh
//               equals brute.
//
// Shapes as in topk_brute.h; params LshParams (num_bits 0..16, num_tables >= 1, seed, step,
// layer). Hyperplane entry (t, m, d) (bit m, coordinate d in 0..HS) is a standard Gaussian
// from philox_draw(site, DRAW_HASH, m (HS + 1) + d), site = {seed, step, layer * NH + h, t}:
// the batch_query slot of the counter carries the table, since one set of hyperplanes
// serves every batch row and query of a head. Box-Muller on the draw's four words:
// g = sqrt(-2 log u0) cos(2 pi u1), u0 from words 0, 1 and u1 from words 2, 3, in double,
// stored as fp32; the projections a . x are fp32 sums. Candidates are scored through the
// key panel (the chunks of 8 keys holding them, topk_panel.h), with brute's score.
// OpenMP over (b, h); each row in a fixed order, so results and statistics are deterministic.
// Nothing is saved for a backward; no CUDA twin.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common/attention_params.h"
#include "kernels/common/draws.h"
#include "kernels/cpu/topk_panel.h"
#include "kernels/cpu/topk_select.h"

namespace knngpt::cpu {

using knngpt::LshParams;

// hyperplanes of every table for head h, standard Gaussian entries, stored transposed:
// planes[d * M + t * num_bits + m] for coordinate d in 0..HS, M = num_tables * num_bits
inline void lsh_hyperplanes(float* planes, const LshParams& p, int NH, int h, int HS) {
    const int M = p.num_tables * p.num_bits;
    const double two_pi = 6.283185307179586;
    for (int t = 0; t < p.num_tables; t++) {
        const DrawSite site = lsh_table_draw_site(p.seed, p.step, p.layer, NH, h, t);
        for (int m = 0; m < p.num_bits; m++) {
            for (int d = 0; d <= HS; d++) {
                const Philox4 w = philox_draw(site, DRAW_HASH, (uint32_t)(m * (HS + 1) + d));
                const double u0 = uniform_open01_f64(w.x[0], w.x[1]);
                const double u1 = uniform_open01_f64(w.x[2], w.x[3]);
                planes[(size_t)d * M + t * p.num_bits + m] =
                    (float)(std::sqrt(-2.0 * std::log(u0)) * std::cos(two_pi * u1));
            }
        }
    }
}

// the SimHash codes of x = (v, pad) in every table: code[t] bit m = [a_tm . x >= 0].
// proj is scratch of M floats.
inline void lsh_codes(uint32_t* code, float* proj, const float* planes, const LshParams& p, const float* v, float pad,
                      int HS) {
    const int M = p.num_tables * p.num_bits;
    for (int u = 0; u < M; u++) proj[u] = planes[(size_t)HS * M + u] * pad;
    for (int d = 0; d < HS; d++) {
        const float vd = v[d];
        const float* a = planes + (size_t)d * M;
        for (int u = 0; u < M; u++) proj[u] += vd * a[u];
    }
    for (int t = 0; t < p.num_tables; t++) {
        uint32_t c = 0;
        for (int m = 0; m < p.num_bits; m++) c |= (uint32_t)(proj[t * p.num_bits + m] >= 0.0f) << m;
        code[t] = c;
    }
}

inline void causal_topk_lsh(int* idx, const float* qkv, int B, int T, int C, int NH, int k, const LshParams& p,
                            TopkStats* stats = nullptr) {
    topk_check_shapes(B, T, C, NH, k);
    topk_check(p.num_bits >= 0 && p.num_bits <= 16, "LshParams.num_bits must be in 0..16");
    topk_check(p.num_tables >= 1, "LshParams.num_tables must be >= 1");
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const int L = p.num_tables;
    const int num_buckets = 1 << p.num_bits;
    // the hyperplanes depend on the head, not on the batch row: draw them once per head
    const size_t planes_size = (size_t)(HS + 1) * L * p.num_bits;
    std::vector<float> head_planes((size_t)NH * planes_size);
    #pragma omp parallel for schedule(static)
    for (int h = 0; h < NH; h++) lsh_hyperplanes(head_planes.data() + (size_t)h * planes_size, p, NH, h, HS);
    long long scores_computed = 0;
    #pragma omp parallel reduction(+ : scores_computed)
    {
        std::vector<float> proj((size_t)L * p.num_bits + 1);
        std::vector<uint32_t> key_code((size_t)L * T);  // (T, L)
        std::vector<uint32_t> query_code((size_t)L);
        std::vector<int> bucket_start((size_t)L * (num_buckets + 1));  // per table: bucket b holds
        std::vector<int> bucket_keys((size_t)L * T);                    // keys [start[b], start[b+1]), ascending
        std::vector<float> panel((size_t)topk_num_chunks(T) * HS * kTopkLanes);
        std::vector<int> seen((size_t)T);                         // seen[j] == i: j is a candidate of row i
        std::vector<int> chunk_seen((size_t)topk_num_chunks(T));  // the same for the chunks holding them
        std::vector<int> chunk_list((size_t)topk_num_chunks(T));
        std::vector<float> chunk_scores((size_t)topk_num_chunks(T) * kTopkLanes);
        std::vector<int> row((size_t)k);
        TopkSelector selector(k);
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                const float* k_head = q_head + C;
                topk_pack_head_keys(panel.data(), k_head, C3, T, HS);
                // R = max ||k_j|| over the head; padded keys (k_j, sqrt(R^2 - ||k_j||^2)) all have norm R
                std::vector<double> key_norm2((size_t)T);
                double R2 = 0.0;
                for (int j = 0; j < T; j++) {
                    double n2 = 0.0;
                    for (int d = 0; d < HS; d++) n2 += (double)k_head[j * C3 + d] * k_head[j * C3 + d];
                    key_norm2[j] = n2;
                    R2 = std::max(R2, n2);
                }
                // hash the keys, then bucket them per table (a counting sort keeps j ascending)
                const float* planes = head_planes.data() + (size_t)h * planes_size;
                for (int j = 0; j < T; j++) {
                    const float pad = (float)std::sqrt(std::max(R2 - key_norm2[j], 0.0));
                    lsh_codes(key_code.data() + (size_t)j * L, proj.data(), planes, p, k_head + j * C3, pad, HS);
                }
                for (int t = 0; t < L; t++) {
                    int* start = bucket_start.data() + (size_t)t * (num_buckets + 1);
                    int* keys_t = bucket_keys.data() + (size_t)t * T;
                    std::fill(start, start + num_buckets + 1, 0);
                    for (int j = 0; j < T; j++) start[key_code[(size_t)j * L + t] + 1]++;
                    for (int u = 0; u < num_buckets; u++) start[u + 1] += start[u];
                    for (int j = 0; j < T; j++) keys_t[start[key_code[(size_t)j * L + t]]++] = j;
                    topk_rewind_bucket_starts(start, num_buckets);
                }
                std::fill(seen.begin(), seen.end(), -1);
                std::fill(chunk_seen.begin(), chunk_seen.end(), -1);
                for (int i = 0; i < T; i++) {
                    int* out = idx + topk_idx_row(b, h, i, T, NH, k);
                    if (i + 1 <= k) {
                        topk_write_all_keys(out, i, k);
                        continue;
                    }
                    const float* q = q_head + (size_t)i * C3;
                    // candidates: causal keys in the query's bucket of any table (seen[j] == i marks them)
                    int n_cand = 0, n_chunks = 0;
                    lsh_codes(query_code.data(), proj.data(), planes, p, q, 0.0f, HS);
                    for (int t = 0; t < L; t++) {
                        const uint32_t code = query_code[t];
                        const int* start = bucket_start.data() + (size_t)t * (num_buckets + 1);
                        const int* first = bucket_keys.data() + (size_t)t * T + start[code];
                        const int* last = bucket_keys.data() + (size_t)t * T + start[code + 1];
                        last = std::upper_bound(first, last, i);
                        for (const int* j = first; j < last; j++) {
                            if (seen[*j] == i) continue;
                            seen[*j] = i;
                            n_cand++;
                            const int c = *j / kTopkLanes;
                            if (chunk_seen[c] != i) {
                                chunk_seen[c] = i;
                                chunk_list[n_chunks++] = c;
                            }
                        }
                    }
                    // rank the candidates by exact score: score the panel chunks holding
                    // them (eight keys per vector) and offer the candidate lanes
                    topk_score_chunk_list(chunk_scores.data(), q, panel.data(), chunk_list.data(), n_chunks, HS);
                    scores_computed += n_cand;
                    selector.clear();
                    for (int u = 0; u < n_chunks; u++) {
                        for (int l = 0; l < kTopkLanes; l++) {
                            const int j = chunk_list[u] * kTopkLanes + l;
                            const float score = chunk_scores[(size_t)u * kTopkLanes + l];
                            if (selector.may_enter(score) && j <= i && seen[j] == i) selector.offer(score, j);
                        }
                    }
                    int n = selector.write_sorted(row.data());
                    // too few candidates: fill with the most recent keys not already candidates
                    for (int j = i; n < k && j >= 0; j--)
                        if (seen[j] != i) row[n++] = j;
                    std::sort(row.begin(), row.begin() + n);
                    std::copy(row.begin(), row.begin() + n, out);
                }
            }
        }
    }
    if (stats) stats->scores_computed += scores_computed;
}

}  // namespace knngpt::cpu
