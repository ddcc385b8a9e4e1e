// tests/attention_test_util.h — helpers shared by the attention tests (CPU and
// CUDA): the shape of a problem and its indexing, random qkv, and naive
// references for the top-k lists.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/common/attention_score.h"
#include "kernels/cpu/topk_index.h"
#include "tests/test_util.h"

namespace knngpt_test {

// The shape of an attention problem: qkv (B, T, 3C), out (B, T, C), one row
// per (b, h, query) (B, NH, T), key lists (B, NH, T, K).
struct AttentionShape {
    int B, T, C, NH;
    int HS() const { return C / NH; }
    size_t qkv_size() const { return (size_t)B * T * 3 * C; }
    size_t out_size() const { return (size_t)B * T * C; }
    size_t rows() const { return (size_t)B * NH * T; }
    size_t idx_size(int K) const { return rows() * K; }
    // element c of part (0 = q, 1 = k, 2 = v) of head h at position t of batch b in (B, T, 3C)
    size_t qkv_at(int b, int t, int part, int h, int c) const {
        return ((size_t)b * T + t) * 3 * C + (size_t)part * C + (size_t)h * HS() + c;
    }
    size_t out_at(int b, int t, int h, int c) const { return ((size_t)b * T + t) * C + (size_t)h * HS() + c; }
    size_t row_at(int b, int h, int i) const { return ((size_t)b * NH + h) * T + i; }
};

// qkv uniform in [-2, 2] (uniform(..., seed) times 2): scores of a few units,
// so softmax rows are far from uniform and both heads and tails matter.
inline std::vector<float> attention_qkv(const AttentionShape& s, unsigned seed) {
    std::vector<float> qkv = uniform(s.qkv_size(), seed);
    for (float& v : qkv) v *= 2.0f;
    return qkv;
}

// The CPU's exact top-k lists (cpu::causal_topk_brute), (B, NH, T, k).
inline std::vector<int> brute_topk(const std::vector<float>& qkv, const AttentionShape& s, int k) {
    std::vector<int> topk(s.idx_size(k));
    knngpt::cpu::causal_topk_brute(topk.data(), qkv.data(), s.B, s.T, s.C, s.NH, k);
    return topk;
}

// The definition of the causal top-k lists: per row (b, h, i), every key
// j <= i sorted by score(b, h, i, j) (a double; larger first, ties to the
// smaller key), the first min(k, i+1) written in ascending key order into
// slots [0, k) of a K-slot list (K >= k); every other slot is -1.
template <class ScoreFn>
std::vector<int> reference_topk(const AttentionShape& s, int k, int K, ScoreFn score) {
    std::vector<int> idx(s.idx_size(K), -1);
    std::vector<std::pair<double, int>> row;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.T; i++) {
                row.clear();
                for (int j = 0; j <= i; j++) row.push_back({score(b, h, i, j), j});
                std::sort(row.begin(), row.end(), [](const std::pair<double, int>& x, const std::pair<double, int>& y) {
                    return x.first != y.first ? x.first > y.first : x.second < y.second;
                });
                const int kept = std::min(k, i + 1);
                std::vector<int> chosen;
                for (int r = 0; r < kept; r++) chosen.push_back(row[r].second);
                std::sort(chosen.begin(), chosen.end());
                std::copy(chosen.begin(), chosen.end(), idx.begin() + s.row_at(b, h, i) * K);
            }
    return idx;
}

// Naive causal top-k, (B, NH, T, k), on the fp32 scores every index ranks by
// (attention_dot, kernels/common/attention_score.h).
inline std::vector<int> naive_causal_topk(const std::vector<float>& qkv, const AttentionShape& s, int k) {
    return reference_topk(s, k, k, [&](int b, int h, int i, int j) {
        return (double)knngpt::attention_dot(&qkv[s.qkv_at(b, i, 0, h, 0)], &qkv[s.qkv_at(b, j, 1, h, 0)], s.HS());
    });
}

}  // namespace knngpt_test
