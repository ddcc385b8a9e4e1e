// kernels/cpu/classifier.h — fused softmax + cross-entropy over a padded vocabulary;
// twin of kernels/cuda/classifier.cuh. V real tokens are padded to Vp columns
// (e.g. 50257 -> 50304) so that rows are aligned; columns V..Vp-1 never enter the softmax.
//
//   forward:  losses[n] = logsumexp_{j<V} logits[n,j] - logits[n, targets[n]]
//   backward: dlogits[n,j] = (softmax_{j<V}(logits[n,:])_j - [j == targets[n]]) dloss   for j < V
//             dlogits[n,j] = 0                                                          for V <= j < Vp
//             (dloss: the gradient of the loss on each position, e.g. 1/N for the mean loss)
//
// Shapes: logits/dlogits (N, Vp) with N = B*T rows, targets (N), losses (N).
// Nothing is saved: backward recomputes the row max and softmax sum from logits.
// Backward and fused WRITE dlogits (=, not +=), and dlogits may alias logits: each
// row is read completely (max, sum, the target's logit) before it is overwritten.
// Design: crossentropy_fused, which the training step uses, writes losses and dlogits
// from one set of row statistics (llm.c's fused_classifier), so each row is read three
// times (max, sum, probabilities) instead of five. exp is exp_vectorizable (vector_math.h).
#pragma once

#include <cmath>
#include <cstddef>

#include "kernels/cpu/vector_math.h"
#include "kernels/cpu/parallel.h"

namespace knngpt::cpu {

// max_{j<V} row[j] and sum_{j<V} exp(row[j] - max): the pieces of the row's logsumexp.
inline void softmax_row_stats(const float* row, int V, float* row_max, float* exp_sum) {
    float m = row[0];
    #pragma omp simd reduction(max:m)
    for (int j = 1; j < V; j++) m = row[j] > m ? row[j] : m;
    float sum = 0.0f;
    #pragma omp simd reduction(+:sum)
    for (int j = 0; j < V; j++) sum += exp_vectorizable(row[j] - m);
    *row_max = m;
    *exp_sum = sum;
}

inline void crossentropy_forward(float* losses, const float* logits, const int* targets,
                                 int N, int V, int Vp) {
    #pragma omp parallel for if (parallel_pays((size_t)N * Vp))
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * Vp;
        float row_max, exp_sum;
        softmax_row_stats(row, V, &row_max, &exp_sum);
        const float logsumexp = row_max + std::log(exp_sum);
        losses[n] = logsumexp - row[targets[n]];
    }
}

// losses (N) and dlogits (N, Vp) together: per row the stats once, then the loss, then
// the writes. Same values as crossentropy_forward + crossentropy_softmax_backward.
// losses == nullptr: dlogits only (crossentropy_softmax_backward).
inline void crossentropy_fused(float* losses, float* dlogits, const float* logits, const int* targets,
                               float dloss, int N, int V, int Vp) {
    #pragma omp parallel for if (parallel_pays((size_t)N * Vp))
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * Vp;
        float* drow = dlogits + (size_t)n * Vp;
        // read the whole row first: drow may be the same memory as row
        float row_max, exp_sum;
        softmax_row_stats(row, V, &row_max, &exp_sum);
        const int target = targets[n];
        const float logsumexp = row_max + std::log(exp_sum);
        if (losses) losses[n] = logsumexp - row[target];
        const float inv_sum = 1.0f / exp_sum;
        #pragma omp simd
        for (int j = 0; j < V; j++) {
            const float prob = exp_vectorizable(row[j] - row_max) * inv_sum;
            const float indicator = j == target ? 1.0f : 0.0f;
            drow[j] = (prob - indicator) * dloss;
        }
        for (int j = V; j < Vp; j++) drow[j] = 0.0f;
    }
}

inline void crossentropy_softmax_backward(float* dlogits, const float* logits, const int* targets,
                                          float dloss, int N, int V, int Vp) {
    crossentropy_fused(nullptr, dlogits, logits, targets, dloss, N, V, Vp);
}

}  // namespace knngpt::cpu
