// tests/attention_test_util.h — helpers shared by the attention-estimator tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gumbel_attention.h"

namespace knngpt_test {

using knngpt::cpu::AttentionHeadOffsets;
using knngpt::cpu::attention_head_offsets;

// Naive causal top-k, (B, NH, T, k): full sort of each row by score (ties to the smaller
// key), the best min(k, i+1) keys in ascending key order, then -1.
std::vector<int> naive_causal_topk(const float* qkv, int B, int T, int C, int NH, int k) {
    const int HS = C / NH, C3 = 3 * C;
    std::vector<int> topk((size_t)B * NH * T * k, -1);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
            for (int i = 0; i < T; i++) {
                std::vector<float> score(i + 1);
                std::vector<int> order(i + 1);
                for (int j = 0; j <= i; j++) {
                    score[j] = knngpt::attention_dot(qkv + at.q + (size_t)i * C3, qkv + at.k + (size_t)j * C3, HS);
                    order[j] = j;
                }
                std::sort(order.begin(), order.end(), [&](int a, int c) {
                    return score[a] != score[c] ? score[a] > score[c] : a < c;
                });
                const int kept = std::min(k, i + 1);
                std::sort(order.begin(), order.begin() + kept);
                int* row = topk.data() + (((size_t)b * NH + h) * T + i) * k;
                for (int s = 0; s < kept; s++) row[s] = order[s];
            }
        }
    return topk;
}

}  // namespace knngpt_test
