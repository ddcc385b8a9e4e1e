// kernels/cuda/tail_sampling.cuh — the up-weighted uniform tail of knn-tail.
// Twin of kernels/cpu/tail_sampling.h: the same draws, bit for bit (see its header
// comment for the estimator).
//
//   Lists idx, logw (B, NH, T, K), K = k + m. Slots [0, k) hold the head S_i
//   (top-k, -1 padded) and are kept, with logw 0; slots [k, K) get the tail
//   R_i = {0..i} \ S_i:
//     |R_i| <= m  the whole tail in ascending order, logw 0, then -1 (logw 0);
//     |R_i| >  m  m draws, each with logw = log(|R_i| / m): positions p in [0, |R_i|)
//                 from the Philox stream {seed, step, layer * NH + h, (batch0 + b) * T + i},
//                 purpose DRAW_TAIL_POSITION (the stratified backward: DRAW_GRADIENT_TAIL),
//                 draw t = word 0 of draw index t;
//                 with replacement p_t = uniform_below(w_t, |R_i|); without, Floyd's
//                 algorithm: top_t = |R_i| - m + t, u_t = uniform_below(w_t, top_t + 1),
//                 p_t = u_t unless u_t was drawn before, then top_t. A position maps
//                 to its key by skipping the head: key(p) = the p-th key not in S_i.
//   Head keys must be distinct and <= i (as top-k lists are); any slot order.
// The backward (sparse_attention.cuh) reads these lists as fixed samples (§3.5).
//
// Design: one thread per (b, h, i) row, everything in the row's own slots, with the
// CPU's integer arithmetic, so the indices equal the CPU's everywhere.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/draws.h"
#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kTailThreads = 128;  // one row per thread

// ---- CUDA kernels -------------------------------------------------------------
// Floyd's "drawn before" is a linear scan over the row's earlier draws (m is small),
// the same answer as the CPU's hash set. The positions go into the tail slots first
// and are turned into keys in a second loop: for a sorted head (top-k rows are),
// key(p) = p + #{r : S[r] - r <= p}, O(k) per draw as on the CPU; for an unsorted
// head, the fixed point of x <- p + #{s in S : s <= x} from x = p (the smallest x
// with p keys outside S below it and x itself outside S).
// The weight is log(|R_i| / m) in double, rounded to fp32, as on the CPU: equal under
// the emulator (the host's log) and on a GPU up to the device log, which may differ
// from glibc's in the last bit of the double (almost never visible after rounding to
// fp32).

// whether key j is one of the valid head slots of the row
__device__ __forceinline__ bool tail_in_head(const int* head, int k, int j) {
    for (int r = 0; r < k; r++)
        if (head[r] == j) return true;
    return false;
}

// tail position p -> its key: the p-th (from 0) key not in the head
__device__ __forceinline__ int tail_position_to_key_device(int p, const int* head, int k, bool head_sorted) {
    if (head_sorted) {  // key(p) = p + #{r : S[r] - r <= p}, r counting the valid slots
        int below = 0, r = 0;
        for (int t = 0; t < k; t++) {
            if (head[t] < 0) continue;
            below += head[t] - r <= p;
            r++;
        }
        return p + below;
    }
    int x = p;
    for (;;) {  // x <- p + #{s in S : s <= x}, non-decreasing, stops at the answer
        int below = 0;
        for (int t = 0; t < k; t++) below += head[t] >= 0 && head[t] <= x;
        if (p + below == x) return x;
        x = p + below;
    }
}

__global__ void sample_tail_keys_kernel(int* idx, float* logw, int B, int T, int NH, int k, int m,
                                        bool with_replacement, uint64_t seed, uint32_t step, int layer,
                                        int batch0, uint32_t purpose) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;  // (b * NH + h) * T + i
    if (row >= B * NH * T) return;
    const int i = row % T;
    const int h = (row / T) % NH;
    const int b = row / (T * NH);
    const int K = k + m;
    int* idx_row = idx + (size_t)row * K;
    float* logw_row = logw + (size_t)row * K;
    int* tail_idx = idx_row + k;
    float* tail_logw = logw_row + k;

    // head S_i: the valid slots of [0, k), weight 1
    int n_head = 0, last = -1;
    bool head_sorted = true;
    for (int t = 0; t < k; t++) {
        logw_row[t] = 0.0f;
        const int j = idx_row[t];
        if (j < 0) continue;
        if (j < last) head_sorted = false;
        last = j;
        n_head++;
    }
    const int tail_size = (i + 1) - n_head;

    if (tail_size <= m) {  // the whole tail fits: the row is exact
        int count = 0;
        for (int j = 0; j <= i; j++)
            if (!tail_in_head(idx_row, k, j)) tail_idx[count++] = j;
        for (int t = 0; t < m; t++) {
            if (t >= count) tail_idx[t] = -1;
            tail_logw[t] = 0.0f;
        }
        return;
    }

    // positions p_t in draw order, kept in the tail slots for Floyd's check
    const DrawSite site = row_draw_site(seed, step, layer, NH, h, batch0 + b, T, i);
    for (int t = 0; t < m; t++) {
        const uint32_t word = philox_draw(site, purpose, (uint32_t)t).x[0];
        uint32_t p;
        if (with_replacement) {
            p = uniform_below(word, (uint32_t)tail_size);
        } else {
            const uint32_t top = (uint32_t)tail_size - (uint32_t)m + (uint32_t)t;
            p = uniform_below(word, top + 1);
            for (int s = 0; s < t; s++) {
                if (tail_idx[s] == (int)p) {  // p taken: top, above every earlier draw
                    p = top;
                    break;
                }
            }
        }
        tail_idx[t] = (int)p;
    }
    const float weight = (float)log((double)tail_size / (double)m);
    for (int t = 0; t < m; t++) {
        tail_idx[t] = tail_position_to_key_device(tail_idx[t], idx_row, k, head_sorted);
        tail_logw[t] = weight;
    }
}

// ---- host launcher --------------------------------------------------------------

inline void sample_tail_keys(int* idx, float* logw, int B, int T, int NH, int k, int m, bool with_replacement,
                             uint64_t seed, uint32_t step, int layer, int batch0,
                             DrawPurpose purpose = DRAW_TAIL_POSITION) {
    if (k < 0 || m < 0) {
        std::fprintf(stderr, "sample_tail_keys: need k >= 0 and m >= 0 (got k=%d m=%d)\n", k, m);
        std::exit(1);
    }
    if (batch0 < 0 || !draw_rows_fit((long long)batch0 + B, T)) {
        std::fprintf(stderr, "sample_tail_keys: need batch0 >= 0 and (batch0 + B) * T <= 2^32 draw rows (got batch0=%d "
                             "B=%d T=%d)\n", batch0, B, T);
        std::exit(1);
    }
    const int rows = B * NH * T;
    if (rows == 0) return;
    launch(sample_tail_keys_kernel, ceil_div(rows, kTailThreads), kTailThreads, 0, nullptr, idx, logw, B, T, NH, k,
           m, with_replacement, seed, step, layer, batch0, (uint32_t)purpose);
}

}  // namespace knngpt::cuda
