// kernels/cpu/tail_sampling.h — the up-weighted uniform tail of knn-tail (ALGORITHMS.md
// §3.1): completes each top-k key list with m tail samples, so that sparse_attention.h
// computes
//   Ô_i = (sum_{j in S_i} e^{s_ij} v_j + w_i sum_t e^{s_{i,J_t}} v_{J_t})
//       / (sum_{j in S_i} e^{s_ij}     + w_i sum_t e^{s_{i,J_t}}),   w_i = |R_i| / m,
// over the tail R_i = {0..i} \ S_i; numerator and denominator are unbiased (§3.2).
//
// Lists: idx and logw (B, NH, T, K), K = k + m, written in place. On entry slots [0, k)
// hold the top-k S_i (-1 padded when i + 1 < k); they are kept, with logw 0. Slots [k, K):
//   |R_i| <= m: the whole tail in ascending order with logw 0 (the row is exact), -1 after;
//   |R_i| >  m: m draws, each with logw log(|R_i| / m): without replacement (default) a
//               uniform m-subset of R_i (Floyd's algorithm), with replacement m independent
//               uniform keys (keys may repeat).
// Unused slots get idx -1 and logw 0. The backward is sparse_attention.h's with these
// lists held fixed (§3.5); nothing else is saved.
//
// Twin: kernels/cuda/tail_sampling.cuh, the same draws bit for bit. Draw t of query i of
// (b, h) is word 0 of draw index t at the row's site row_draw_site(.., batch0 + b, T, i),
// purpose DRAW_TAIL_POSITION, or DRAW_GRADIENT_TAIL for the stratified backward's tail
// (kernels/common/draws.h; batch0: the global batch row of
// local row 0). A draw is a tail position p in [0, |R_i|), mapped to its key by skipping
// the sorted head: key(p) = p + #{r : S_i[r] - r <= p}. With replacement
// p_t = uniform_below(word_t, |R_i|); without, Floyd's algorithm (§3.4): with
// top_t = |R_i| - m + t, u_t = uniform_below(word_t, top_t + 1), and p_t = u_t unless
// u_t was drawn before, then top_t.
// Design: every draw is a pure function of its site, so the lists depend on neither the
// thread count nor the backend. Memory O(k + m) per thread; OpenMP over (b, h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/common/draws.h"

namespace knngpt::cpu {

// Word 0 of draws 0..m-1 of the row's stream of `purpose`. A loop of its own, apart from
// the sequential use below, so that the compiler vectorises Philox across draws.
inline void tail_position_words(uint32_t* words, const DrawSite& site, DrawPurpose purpose, int m) {
    for (int t = 0; t < m; t++) words[t] = philox_draw(site, purpose, (uint32_t)t).x[0];
}

// m tail positions in [0, tail_size), drawn independently from words[0..m), in draw order.
inline void tail_positions_with_replacement(uint32_t* positions, const uint32_t* words, int m, uint32_t tail_size) {
    for (int t = 0; t < m; t++) positions[t] = uniform_below(words[t], tail_size);
}

// A set of tail positions: open addressing over 2^table_bits slots holding position + 1
// (0 = empty); multiplicative hash (top bits of p * 2^32/phi), linear probing.
// Inserts p; returns false if p was already there.
inline bool position_set_insert(uint32_t* table, int table_bits, uint32_t p) {
    const uint32_t mask = (1u << table_bits) - 1;
    uint32_t slot = (p * 0x9E3779B1u) >> (32 - table_bits);
    while (table[slot] != 0) {
        if (table[slot] == p + 1) return false;
        slot = (slot + 1) & mask;
    }
    table[slot] = p + 1;
    return true;
}

// A uniform m-subset of [0, tail_size) by Floyd's algorithm (m < tail_size) from words[0..m):
// positions[t] is the member added at step t. `table` has 2^table_bits >= 2m slots, so a
// membership test costs O(1) expected.
inline void tail_positions_without_replacement(uint32_t* positions, uint32_t* table, int table_bits,
                                               const uint32_t* words, int m, uint32_t tail_size) {
    for (size_t x = 0; x < ((size_t)1 << table_bits); x++) table[x] = 0;
    for (int t = 0; t < m; t++) {
        const uint32_t top = tail_size - (uint32_t)m + (uint32_t)t;
        const uint32_t u = uniform_below(words[t], top + 1);
        positions[t] = u;
        if (!position_set_insert(table, table_bits, u)) {  // u taken: top, above every member
            positions[t] = top;
            position_set_insert(table, table_bits, top);
        }
    }
}

// Tail position p -> its key, skipping the head: key(p) = p + #{r : head_gap[r] <= p}, where
// head_gap[r] = S_i[r] - r is the number of tail keys below the r-th (sorted) head key.
inline int tail_position_to_key(uint32_t p, const int* head_gap, int n_head) {
    int below = 0;
    #pragma omp simd reduction(+:below)
    for (int r = 0; r < n_head; r++) below += head_gap[r] <= (int)p;
    return (int)p + below;
}

inline void sample_tail_keys(int* idx, float* logw, int B, int T, int NH, int k, int m, bool with_replacement,
                             uint64_t seed, uint32_t step, int layer, int batch0,
                             DrawPurpose purpose = DRAW_TAIL_POSITION) {
    if (batch0 < 0 || !draw_rows_fit((long long)batch0 + B, T))
        throw std::invalid_argument("kernels/cpu/tail_sampling.h: need batch0 >= 0 and (batch0 + B) * T <= 2^32 "
                                    "draw rows");
    const int K = k + m;
    #pragma omp parallel
    {
        // per-thread scratch: the row's sorted head and its gaps, its random words, its tail
        // positions and Floyd's set (>= 2m slots)
        std::vector<int> head(k > 0 ? k : 1), head_gap(k > 0 ? k : 1);
        int table_bits = 1;
        while (((size_t)1 << table_bits) < 2 * (size_t)m) table_bits++;
        std::vector<uint32_t> words(m > 0 ? m : 1), positions(m > 0 ? m : 1), table((size_t)1 << table_bits);
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int i = 0; i < T; i++) {
                    const size_t row = ((size_t)b * NH + h) * T + i;
                    int* idx_row = idx + row * K;
                    float* logw_row = logw + row * K;
                    int* tail_idx = idx_row + k;
                    float* tail_logw = logw_row + k;

                    // head S_i: the valid slots of [0, k), weight 1
                    int n_head = 0;
                    for (int t = 0; t < k; t++) {
                        logw_row[t] = 0.0f;
                        if (idx_row[t] >= 0) head[n_head++] = idx_row[t];
                    }
                    if (!std::is_sorted(head.begin(), head.begin() + n_head))
                        std::sort(head.begin(), head.begin() + n_head);
                    const int tail_size = (i + 1) - n_head;

                    if (tail_size <= m) {  // the whole tail fits: the row is exact
                        int count = 0, r = 0;
                        for (int j = 0; j <= i; j++) {
                            if (r < n_head && head[r] == j) r++;
                            else tail_idx[count++] = j;
                        }
                        for (int t = 0; t < m; t++) {
                            if (t >= count) tail_idx[t] = -1;
                            tail_logw[t] = 0.0f;
                        }
                        continue;
                    }
                    const DrawSite site = row_draw_site(seed, step, layer, NH, h, batch0 + b, T, i);
                    tail_position_words(words.data(), site, purpose, m);
                    if (with_replacement)
                        tail_positions_with_replacement(positions.data(), words.data(), m, (uint32_t)tail_size);
                    else
                        tail_positions_without_replacement(positions.data(), table.data(), table_bits, words.data(), m,
                                                           (uint32_t)tail_size);
                    for (int r = 0; r < n_head; r++) head_gap[r] = head[r] - r;
                    for (int t = 0; t < m; t++) tail_idx[t] = tail_position_to_key(positions[t], head_gap.data(), n_head);
                    const float weight = (float)std::log((double)tail_size / (double)m);
                    for (int t = 0; t < m; t++) tail_logw[t] = weight;
                }
            }
        }
    }
}

}  // namespace knngpt::cpu
