// tests/test_sparse_attention.cpp — attention over key lists
// (kernels/cpu/sparse_attention.h) and the knn-tail sampler
// (kernels/cpu/tail_sampling.h), against references written here in double:
// exact causal attention, a naive causal top-k and the list softmax.
//
// Deterministic checks. Lists holding every key must reproduce the exact kernel
// (attention.h) to 1e-6 relative: both sum the same few dozen float terms, only
// in another order. Float kernel against double reference: 1e-5 relative
// (tests/test_cpu_ops.cpp's forward tolerance, same argument). Backward against
// central differences of the double reference (step 1e-6): 1e-4 relative, as
// in test_cpu_ops.cpp; a wrong formula or index errs by O(1).
//
// Statistical checks run over >= 1000 seeds (20000 for the subset frequencies)
// and compare means with the truth within 5 standard errors estimated from the
// same draws. The one approximate law, the MSE's 1/m, is checked against a
// first-order bracket widened by a factor derived in that test.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/tail_sampling.h"
#include "tests/attention_test_util.h"
#include "tests/test_util.h"

using knngpt_test::finite_difference_gradient;
using knngpt_test::max_rel_error;
using knngpt_test::to_double;
using knngpt_test::uniform;
using Shape = knngpt_test::AttentionShape;
using std::vector;
namespace cpu = knngpt::cpu;

namespace {

constexpr double kExactTol = 1e-6;
constexpr double kForwardTol = 1e-5;
constexpr double kBackwardTol = 1e-4;
constexpr double kZBound = 5.0;  // standard errors allowed between a sample mean and the truth

// s_ij = tau q_i . k_j in double
template <class F>
double score(const vector<F>& qkv, const Shape& s, int b, int h, int i, int j) {
    double dot = 0.0;
    for (int c = 0; c < s.HS(); c++) dot += (double)qkv[s.qkv_at(b, i, 0, h, c)] * (double)qkv[s.qkv_at(b, j, 1, h, c)];
    return dot / std::sqrt((double)s.HS());
}

// Naive causal top-k on the double scores above (reference_topk: larger score
// first, ties to the smaller index; the first min(k, i+1) keys in slots [0, k)
// in ascending key order; every other slot of the K-slot list is -1).
template <class F>
vector<int> naive_causal_topk(const vector<F>& qkv, const Shape& s, int k, int K) {
    return knngpt_test::reference_topk(s, k, K, [&](int b, int h, int i, int j) { return score(qkv, s, b, h, i, j); });
}

// Smallest gap between the k-th and (k+1)-th largest score over all rows with n_i > k.
double topk_margin(const vector<float>& qkv, const Shape& s, int k) {
    double margin = INFINITY;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = k; i < s.T; i++) {
                vector<double> scores;
                for (int j = 0; j <= i; j++) scores.push_back(score(qkv, s, b, h, i, j));
                std::sort(scores.rbegin(), scores.rend());
                margin = std::fmin(margin, scores[k - 1] - scores[k]);
            }
    return margin;
}

// The list softmax of sparse_attention.h, plainly, in double.
struct ListAttentionRef {
    vector<double> out, lse;
};
ListAttentionRef ref_list_attention(const vector<double>& qkv, const Shape& s, const vector<int>& idx,
                                    const vector<float>* logw, int K) {
    ListAttentionRef r{vector<double>(s.out_size(), 0.0), vector<double>(s.rows(), -INFINITY)};
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.T; i++) {
                const size_t row = s.row_at(b, h, i);
                vector<std::pair<int, double>> slots;  // (key, logit)
                for (int t = 0; t < K; t++) {
                    const int j = idx[row * K + t];
                    if (j < 0) continue;
                    slots.push_back({j, score(qkv, s, b, h, i, j) + (logw ? (double)(*logw)[row * K + t] : 0.0)});
                }
                if (slots.empty()) continue;
                double row_max = -INFINITY, sum = 0.0;
                for (auto& sl : slots) row_max = std::fmax(row_max, sl.second);
                for (auto& sl : slots) sum += std::exp(sl.second - row_max);
                r.lse[row] = row_max + std::log(sum);
                for (auto& sl : slots) {
                    const double p = std::exp(sl.second - r.lse[row]);
                    for (int c = 0; c < s.HS(); c++) r.out[s.out_at(b, i, h, c)] += p * qkv[s.qkv_at(b, sl.first, 2, h, c)];
                }
            }
    return r;
}

// Exact attention of one row in double: Z_i = sum_j e^{s_ij}, N_i = sum_j e^{s_ij} v_j, O_i = N_i / Z_i, P_ij.
struct ExactRow {
    double Z;
    vector<double> N, O, P;
};
ExactRow exact_row(const vector<double>& qkv, const Shape& s, int b, int h, int i) {
    ExactRow r{0.0, vector<double>(s.HS(), 0.0), vector<double>(s.HS()), vector<double>(i + 1)};
    for (int j = 0; j <= i; j++) {
        const double e = std::exp(score(qkv, s, b, h, i, j));
        r.Z += e;
        r.P[j] = e;
        for (int c = 0; c < s.HS(); c++) r.N[c] += e * qkv[s.qkv_at(b, j, 2, h, c)];
    }
    for (int j = 0; j <= i; j++) r.P[j] /= r.Z;
    for (int c = 0; c < s.HS(); c++) r.O[c] = r.N[c] / r.Z;
    return r;
}

double max_value_norm(const vector<double>& qkv, const Shape& s, int b, int h, int i) {
    double m = 0.0;
    for (int j = 0; j <= i; j++) {
        double n2 = 0.0;
        for (int c = 0; c < s.HS(); c++) n2 += qkv[s.qkv_at(b, j, 2, h, c)] * qkv[s.qkv_at(b, j, 2, h, c)];
        m = std::fmax(m, std::sqrt(n2));
    }
    return m;
}


// The float backward with dout = w against central differences of the double
// list softmax with the lists and log-weights fixed.
void expect_list_backward_matches_finite_differences(const vector<float>& qkv, const Shape& s, const vector<int>& idx,
                                                     const vector<float>* logw, int K, unsigned seed) {
    const auto w = uniform(s.out_size(), seed);
    vector<float> out(s.out_size()), lse(s.rows()), dqkv(s.qkv_size(), 0.0f);
    const float* logw_ptr = logw ? logw->data() : nullptr;
    cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), idx.data(), logw_ptr, s.B, s.T, s.C, s.NH, K);
    cpu::sparse_attention_backward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), idx.data(), logw_ptr,
                                   s.B, s.T, s.C, s.NH, K);
    auto qkv_d = to_double(qkv);
    const auto reference = ref_list_attention(qkv_d, s, idx, logw, K);
    EXPECT_LT(max_rel_error(out.data(), reference.out.data(), out.size()), kForwardTol);
    auto grad = finite_difference_gradient(qkv_d, w, [&] { return ref_list_attention(qkv_d, s, idx, logw, K).out; });
    EXPECT_LT(max_rel_error(dqkv.data(), grad.data(), grad.size()), kBackwardTol);
}

// Top-k lists in slots [0, k) of K = k + m slots, completed by the tail sampler.
struct TailLists {
    vector<int> idx;
    vector<float> logw;
};
TailLists sample_tail_lists(const vector<int>& head_lists, const Shape& s, int k, int m, bool with_replacement,
                            uint64_t seed, uint32_t step = 0, int layer = 0, int batch0 = 0) {
    TailLists lists{head_lists, vector<float>(head_lists.size(), 0.0f)};
    cpu::sample_tail_keys(lists.idx.data(), lists.logw.data(), s.B, s.T, s.NH, k, m, with_replacement, seed, step, layer,
                          batch0);
    return lists;
}

// The Monte Carlo loops call the kernels thousands of times on small shapes,
// where OpenMP's fork and join cost more than the work (far more on a shared,
// loaded machine), so they run on one thread.
struct OneThreadScope {
    int saved = omp_get_max_threads();
    OneThreadScope() { omp_set_num_threads(1); }
    ~OneThreadScope() { omp_set_num_threads(saved); }
};

// Mean and standard error of a stream of numbers.
struct RunningMean {
    double sum = 0.0, sum_sq = 0.0;
    long n = 0;
    void add(double x) { sum += x; sum_sq += x * x; n++; }
    double mean() const { return sum / n; }
    double stderr_of_mean() const { return std::sqrt(std::fmax(sum_sq / n - mean() * mean(), 0.0) / (n - 1)); }
};

}  // namespace

// ---------------------------------------------------------------------------
// The list kernel
// ---------------------------------------------------------------------------

// The kernels' batched inner loops: eight dot products side by side (on AVX-512, their
// pairwise reductions eight at a time in vector registers) equal eight lone ones bit for
// bit (the same products and sums; only the additions of the reduction are regrouped
// across slots), and the register-tiled weighted sum is the weighted sum (to fp32
// rounding: whether its multiply-adds fuse is the compiler's choice), for head sizes
// around the 16- and 128-channel tiles.
TEST(SparseAttention, BatchedInnerLoopsEqualTheirOneAtATimeForms) {
    std::mt19937 gen(5);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int n : {1, 7, 15, 16, 17, 64, 72, 127, 128, 130, 300}) {
        vector<float> a(n), rows((size_t)9 * n), w(9);
        for (float& x : a) x = u(gen);
        for (float& x : rows) x = u(gen);
        for (float& x : w) x = u(gen);
        const float* b[8];
        for (int r = 0; r < 8; r++) b[r] = rows.data() + (size_t)r * n;
        float side_by_side[8];
        cpu::sparse_dots<8>(side_by_side, a.data(), b, n);
        for (int r = 0; r < 8; r++) {
            const float lone = cpu::sparse_dot(a.data(), b[r], n);
            EXPECT_EQ(std::memcmp(&side_by_side[r], &lone, sizeof lone), 0) << "n=" << n << " slot " << r;
        }
        for (int slots : {1, 5, 9}) {
            const float* x[9];
            for (int t = 0; t < slots; t++) x[t] = rows.data() + (size_t)((t * 4) % 9) * n;
            vector<float> tiled(n);
            cpu::sparse_weighted_row_sum(tiled.data(), w.data(), x, slots, n);
            for (int c = 0; c < n; c++) {
                double sum = 0.0, size = 0.0;
                for (int t = 0; t < slots; t++) {
                    sum += (double)w[t] * x[t][c];
                    size += std::fabs((double)w[t] * x[t][c]);
                }
                EXPECT_NEAR(tiled[c], sum, 1e-6 * size + 1e-30) << "n=" << n << " slots=" << slots << " c=" << c;
            }
        }
    }
}

TEST(SparseAttention, ListsHoldingEveryKeyGiveExactAttentionForwardAndBackward) {
    // k >= T: every row lists all of 0..i (then -1 padding); T = 70 spans two exact-kernel query blocks.
    const Shape s{2, 70, 64, 2};
    const int K = s.T + 3;
    const auto qkv = uniform(s.qkv_size(), 1, -2.0f, 2.0f);
    const auto dout = uniform(s.out_size(), 2);
    const auto idx = naive_causal_topk(qkv, s, K, K);

    vector<float> out(s.out_size()), lse(s.rows()), out_exact(s.out_size()), lse_exact(s.rows());
    cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), idx.data(), nullptr, s.B, s.T, s.C, s.NH, K);
    cpu::attention_forward(out_exact.data(), lse_exact.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    EXPECT_LT(max_rel_error(out.data(), out_exact.data(), out.size()), kExactTol);
    EXPECT_LT(max_rel_error(lse.data(), lse_exact.data(), lse.size()), kExactTol);

    // backward accumulates into the same starting gradient
    auto dqkv = uniform(s.qkv_size(), 3);
    auto dqkv_exact = dqkv;
    cpu::sparse_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), idx.data(), nullptr,
                                   s.B, s.T, s.C, s.NH, K);
    cpu::attention_backward(dqkv_exact.data(), dout.data(), qkv.data(), out_exact.data(), lse_exact.data(),
                            s.B, s.T, s.C, s.NH);
    EXPECT_LT(max_rel_error(dqkv.data(), dqkv_exact.data(), dqkv.size()), kExactTol);

    // zero log-weights are the same as none, bit for bit
    const vector<float> zero_logw(idx.size(), 0.0f);
    vector<float> out_zero(s.out_size()), lse_zero(s.rows());
    cpu::sparse_attention_forward(out_zero.data(), lse_zero.data(), qkv.data(), idx.data(), zero_logw.data(),
                                  s.B, s.T, s.C, s.NH, K);
    EXPECT_EQ(out_zero, out);
    EXPECT_EQ(lse_zero, lse);
}

TEST(SparseAttention, ForwardMatchesListSoftmaxWithLogWeightsRepeatsAndEmptySlots) {
    const Shape s{2, 30, 48, 2};  // HS = 24: one 16-channel block and a remainder
    const int K = 9;
    const auto qkv = uniform(s.qkv_size(), 4, -2.0f, 2.0f);
    std::mt19937 gen(5);
    vector<int> idx(s.rows() * K, -1);
    for (size_t row = 0; row < s.rows(); row++) {
        const int i = (int)(row % s.T);
        const int valid = 1 + (int)(gen() % K);  // at least one key, then -1
        for (int t = 0; t < valid; t++) idx[row * K + t] = (int)(gen() % (i + 1));
    }
    const auto logw = uniform(idx.size(), 6, -2.0f, 2.0f);
    vector<float> out(s.out_size()), lse(s.rows());
    cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), idx.data(), logw.data(), s.B, s.T, s.C, s.NH, K);
    const auto reference = ref_list_attention(to_double(qkv), s, idx, &logw, K);
    EXPECT_LT(max_rel_error(out.data(), reference.out.data(), out.size()), kForwardTol);
    EXPECT_LT(max_rel_error(lse.data(), reference.lse.data(), lse.size()), kForwardTol);
}

TEST(SparseAttention, BackwardMatchesFiniteDifferencesWithLogWeightsRepeatedKeysAndEmptyLists) {
    const Shape s{1, 10, 16, 2};
    const int K = 6;
    const auto qkv = uniform(s.qkv_size(), 7, -2.0f, 2.0f);
    std::mt19937 gen(8);
    vector<int> idx(s.rows() * K, -1);
    int repeats = 0;
    for (size_t row = 0; row < s.rows(); row++) {
        const int i = (int)(row % s.T);
        const int valid = row == 3 ? 0 : 1 + (int)(gen() % K);  // row 3: an empty list (o = 0, no gradient)
        std::set<int> seen;
        for (int t = 0; t < valid; t++) {
            idx[row * K + t] = (int)(gen() % (i + 1));
            repeats += !seen.insert(idx[row * K + t]).second;
        }
    }
    ASSERT_GT(repeats, 0);
    const auto logw = uniform(idx.size(), 9, -2.0f, 2.0f);
    expect_list_backward_matches_finite_differences(qkv, s, idx, &logw, K, 10);
}

TEST(SparseAttention, BackwardIsIdenticalForAnyThreadCount) {
    const Shape s{2, 64, 64, 4};
    const int k = 6, m = 10;
    const auto qkv = uniform(s.qkv_size(), 11, -2.0f, 2.0f);
    const auto dout = uniform(s.out_size(), 12);
    const auto lists = sample_tail_lists(naive_causal_topk(qkv, s, k, k + m), s, k, m, true, 13);
    auto run = [&](int threads) {
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        vector<float> out(s.out_size()), lse(s.rows()), dqkv(s.qkv_size(), 0.0f);
        cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), lists.idx.data(), lists.logw.data(),
                                      s.B, s.T, s.C, s.NH, k + m);
        cpu::sparse_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), lists.idx.data(),
                                       lists.logw.data(), s.B, s.T, s.C, s.NH, k + m);
        omp_set_num_threads(saved);
        return dqkv;
    };
    const auto one_thread = run(1);
    EXPECT_EQ(run(3), one_thread);
    EXPECT_EQ(run(8), one_thread);
}

// ---------------------------------------------------------------------------
// knn: top-k lists (ALGORITHMS.md §2)
// ---------------------------------------------------------------------------

TEST(KnnAttention, BackwardMatchesFiniteDifferencesOfTheTopKFunctionAwayFromTies) {
    // The double forward re-selects the top-k at every perturbed point, so this
    // checks the gradient of knn itself. The inputs keep a margin between the
    // k-th and (k+1)-th scores much wider than a step can move a score
    // (|ds| <= tau * step * max|q or k| ~ 1e-6), so the selection never changes.
    const Shape s{1, 12, 16, 2};
    const int k = 3;
    vector<float> qkv;
    unsigned seed = 20;
    for (;; seed++) {
        qkv = uniform(s.qkv_size(), seed, -2.0f, 2.0f);
        if (topk_margin(qkv, s, k) > 1e-3) break;
        ASSERT_LT(seed, 200u) << "no input with a top-k margin found";
    }
    const auto idx = naive_causal_topk(qkv, s, k, k);
    const auto w = uniform(s.out_size(), seed + 1000);
    vector<float> out(s.out_size()), lse(s.rows()), dqkv(s.qkv_size(), 0.0f);
    cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), idx.data(), nullptr, s.B, s.T, s.C, s.NH, k);
    cpu::sparse_attention_backward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), idx.data(), nullptr,
                                   s.B, s.T, s.C, s.NH, k);
    auto qkv_d = to_double(qkv);
    auto grad = finite_difference_gradient(qkv_d, w, [&] {
        return ref_list_attention(qkv_d, s, naive_causal_topk(qkv_d, s, k, k), nullptr, k).out;
    });
    EXPECT_LT(max_rel_error(dqkv.data(), grad.data(), grad.size()), kBackwardTol);
}

TEST(KnnAttention, ErrorIsTheTailTermAndAtMostTwiceTailMassTimesLargestValue) {
    // §2.2: O_i - Ô_i = rho_i (mu_tail - mu_head), ||O_i - Ô_i|| <= 2 rho_i max_j ||v_j||,
    // rho_i <= (n_i - k) / n_i, with the exact P in double and Ô from the kernel.
    const Shape s{2, 64, 64, 2};
    const int k = 8;
    const auto qkv = uniform(s.qkv_size(), 30, -2.0f, 2.0f);
    const auto qkv_d = to_double(qkv);
    const auto idx = naive_causal_topk(qkv, s, k, k);
    vector<float> out(s.out_size()), lse(s.rows());
    cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), idx.data(), nullptr, s.B, s.T, s.C, s.NH, k);

    double max_identity_error = 0.0, max_value = 0.0, max_bound_excess = -INFINITY;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.T; i++) {
                const ExactRow exact = exact_row(qkv_d, s, b, h, i);
                std::set<int> head(idx.begin() + s.row_at(b, h, i) * k, idx.begin() + s.row_at(b, h, i) * k + k);
                head.erase(-1);
                double head_mass = 0.0;
                vector<double> head_sum(s.HS(), 0.0), tail_sum(s.HS(), 0.0);
                for (int j = 0; j <= i; j++) {
                    auto& sum = head.count(j) ? head_sum : tail_sum;
                    if (head.count(j)) head_mass += exact.P[j];
                    for (int c = 0; c < s.HS(); c++) sum[c] += exact.P[j] * qkv_d[s.qkv_at(b, j, 2, h, c)];
                }
                const double rho = 1.0 - head_mass;
                const int n = i + 1;
                EXPECT_LE(rho, (double)std::max(n - k, 0) / n + 1e-12) << "b=" << b << " h=" << h << " i=" << i;
                double error_norm2 = 0.0;
                for (int c = 0; c < s.HS(); c++) {
                    const double mu_head = head_sum[c] / head_mass;
                    const double tail_term = rho > 0.0 ? rho * (tail_sum[c] / rho - mu_head) : 0.0;
                    const double error = exact.O[c] - out[s.out_at(b, i, h, c)];
                    max_identity_error = std::fmax(max_identity_error, std::fabs(error - tail_term));
                    max_value = std::fmax(max_value, std::fabs(exact.O[c]));
                    error_norm2 += error * error;
                }
                max_bound_excess = std::fmax(max_bound_excess,
                                             std::sqrt(error_norm2) - 2.0 * rho * max_value_norm(qkv_d, s, b, h, i));
            }
    EXPECT_LT(max_identity_error, kForwardTol * max_value);
    EXPECT_LE(max_bound_excess, kForwardTol * max_value);
}

TEST(KnnAttention, MeanTailMassDoesNotIncreaseWithK) {
    // rho_i = 1 - Z_S / Z_i = 1 - exp(lse_knn_i - lse_exact_i), from the two kernels.
    const Shape s{2, 64, 64, 4};
    const auto qkv = uniform(s.qkv_size(), 31, -2.0f, 2.0f);
    vector<float> out(s.out_size()), lse_exact(s.rows()), lse(s.rows());
    cpu::attention_forward(out.data(), lse_exact.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    double previous = INFINITY;
    for (int k : {1, 2, 4, 8, 16, 32, 64}) {
        const auto idx = naive_causal_topk(qkv, s, k, k);
        cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), idx.data(), nullptr, s.B, s.T, s.C, s.NH, k);
        double mean_rho = 0.0;
        for (size_t row = 0; row < s.rows(); row++) mean_rho += 1.0 - std::exp((double)lse[row] - lse_exact[row]);
        mean_rho /= s.rows();
        std::printf("  k = %2d: mean tail mass %.4f\n", k, mean_rho);
        EXPECT_LE(mean_rho, previous) << "k=" << k;
        previous = mean_rho;
    }
    EXPECT_NEAR(previous, 0.0, kExactTol);  // k = T: no tail
}

TEST(KnnAttention, IsCausalWithAndWithoutTail) {
    // Changing q, k and v at positions > cut leaves rows <= cut unchanged, for
    // knn and for knn-tail under the same seed.
    const Shape s{2, 50, 32, 2};
    const int k = 4, m = 5, cut = 20;
    const auto qkv = uniform(s.qkv_size(), 32, -2.0f, 2.0f);
    auto changed = qkv;
    const auto noise = uniform(s.qkv_size(), 33, -3.0f, 3.0f);
    for (int b = 0; b < s.B; b++)
        for (int t = cut + 1; t < s.T; t++)
            for (int c = 0; c < 3 * s.C; c++) changed[s.qkv_at(b, t, 0, 0, c)] = noise[s.qkv_at(b, t, 0, 0, c)];

    for (int tail : {0, m}) {
        auto run = [&](const vector<float>& x) {
            const auto lists = sample_tail_lists(naive_causal_topk(x, s, k, k + tail), s, k, tail, false, 34);
            vector<float> out(s.out_size()), lse(s.rows());
            cpu::sparse_attention_forward(out.data(), lse.data(), x.data(), lists.idx.data(), lists.logw.data(),
                                          s.B, s.T, s.C, s.NH, k + tail);
            return std::make_pair(out, lse);
        };
        const auto before = run(qkv), after = run(changed);
        for (int b = 0; b < s.B; b++)
            for (int h = 0; h < s.NH; h++)
                for (int i = 0; i < s.T; i++) {
                    bool same = before.second[s.row_at(b, h, i)] == after.second[s.row_at(b, h, i)];
                    for (int c = 0; c < s.HS(); c++)
                        same &= before.first[s.out_at(b, i, h, c)] == after.first[s.out_at(b, i, h, c)];
                    if (i <= cut) EXPECT_TRUE(same) << "m=" << tail << " b=" << b << " h=" << h << " i=" << i;
                    else EXPECT_FALSE(same) << "m=" << tail << " b=" << b << " h=" << h << " i=" << i;
                }
    }
}

// ---------------------------------------------------------------------------
// knn-tail: top-k plus an up-weighted uniform tail (ALGORITHMS.md §3)
// ---------------------------------------------------------------------------

TEST(KnnTail, NoTailSamplesEqualsKnn) {
    const Shape s{2, 40, 32, 2};
    const int k = 5;
    const auto qkv = uniform(s.qkv_size(), 40, -2.0f, 2.0f);
    const auto head_lists = naive_causal_topk(qkv, s, k, k);
    for (bool with_replacement : {false, true}) {
        const auto lists = sample_tail_lists(head_lists, s, k, 0, with_replacement, 41);
        EXPECT_EQ(lists.idx, head_lists);
        EXPECT_EQ(lists.logw, vector<float>(head_lists.size(), 0.0f));
        vector<float> out(s.out_size()), lse(s.rows()), out_knn(s.out_size()), lse_knn(s.rows());
        cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), lists.idx.data(), lists.logw.data(),
                                      s.B, s.T, s.C, s.NH, k);
        cpu::sparse_attention_forward(out_knn.data(), lse_knn.data(), qkv.data(), head_lists.data(), nullptr,
                                      s.B, s.T, s.C, s.NH, k);
        EXPECT_EQ(out, out_knn);
        EXPECT_EQ(lse, lse_knn);
    }
}

TEST(KnnTail, RowsWithKPlusMAtLeastNAreExact) {
    const Shape s{2, 40, 64, 2};
    const auto qkv = uniform(s.qkv_size(), 42, -2.0f, 2.0f);
    vector<float> out_exact(s.out_size()), lse_exact(s.rows());
    cpu::attention_forward(out_exact.data(), lse_exact.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    // (k, m) = (4, 6): rows i < 10 exact; (4, 40): k + m >= T, every row exact
    for (auto [k, m] : {std::pair<int, int>{4, 6}, std::pair<int, int>{4, 40}}) {
        for (bool with_replacement : {false, true}) {
            const int K = k + m;
            const auto lists = sample_tail_lists(naive_causal_topk(qkv, s, k, K), s, k, m, with_replacement, 43);
            vector<float> out(s.out_size()), lse(s.rows());
            cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), lists.idx.data(), lists.logw.data(),
                                          s.B, s.T, s.C, s.NH, K);
            for (int b = 0; b < s.B; b++)
                for (int h = 0; h < s.NH; h++)
                    for (int i = 0; i < std::min(k + m, s.T); i++) {
                        const size_t row = s.row_at(b, h, i);
                        std::multiset<int> listed;
                        for (int t = 0; t < K; t++) {
                            if (lists.idx[row * K + t] >= 0) listed.insert(lists.idx[row * K + t]);
                            EXPECT_EQ(lists.logw[row * K + t], 0.0f);
                        }
                        vector<int> all_keys(i + 1);
                        for (int j = 0; j <= i; j++) all_keys[j] = j;
                        EXPECT_EQ(vector<int>(listed.begin(), listed.end()), all_keys) << "row " << i;
                        EXPECT_LT(max_rel_error(&out[s.out_at(b, i, h, 0)], &out_exact[s.out_at(b, i, h, 0)], s.HS()),
                                  kExactTol);
                        EXPECT_NEAR(lse[row], lse_exact[row], kExactTol * std::fmax(1.0, std::fabs(lse_exact[row])));
                    }
        }
    }
}

TEST(KnnTail, SamplesAreCausalTailKeysOutsideTheHeadWithWeightTailSizeOverM) {
    // Without replacement: m distinct keys; with replacement: m keys, repeats allowed (and seen).
    const Shape s{2, 100, 32, 2};
    const int k = 5, m = 7, K = k + m;
    const auto qkv = uniform(s.qkv_size(), 44, -2.0f, 2.0f);
    const auto head_lists = naive_causal_topk(qkv, s, k, K);
    int repeats = 0;
    for (bool with_replacement : {false, true}) {
        for (uint64_t seed = 0; seed < 10; seed++) {
            const auto lists = sample_tail_lists(head_lists, s, k, m, with_replacement, seed);
            for (size_t row = 0; row < s.rows(); row++) {
                const int i = (int)(row % s.T);
                const int tail_size = (i + 1) - std::min(k, i + 1);
                const int* list = &lists.idx[row * K];
                const float* weights = &lists.logw[row * K];
                ASSERT_TRUE(std::equal(list, list + k, &head_lists[row * K]));
                for (int t = 0; t < k; t++) ASSERT_EQ(weights[t], 0.0f);
                if (tail_size <= m) continue;
                const std::set<int> head(list, list + k);
                const float weight = (float)std::log((double)tail_size / m);
                for (int t = k; t < K; t++) {
                    ASSERT_GE(list[t], 0);
                    ASSERT_LE(list[t], i);
                    ASSERT_EQ(head.count(list[t]), 0u) << "row " << row << " slot " << t;
                    ASSERT_EQ(weights[t], weight);
                }
                const size_t distinct = std::set<int>(list + k, list + K).size();
                if (!with_replacement) ASSERT_EQ(distinct, (size_t)m) << "row " << row;
                else repeats += m - (int)distinct;
            }
        }
    }
    EXPECT_GT(repeats, 0);
}

TEST(KnnTail, DrawsAreUniformOverTailSubsetsAndTailKeys) {
    // Row i = 7 with head {2, 5}: tail {0, 1, 3, 4, 6, 7}. Without replacement,
    // each of the C(6, 3) = 20 subsets has probability 1/20; with replacement,
    // each of the 3 draws is each tail key with probability 1/6. Counts over
    // 20000 seeds against N p within 5 binomial standard deviations.
    const Shape s{1, 8, 8, 1};
    const int k = 2, m = 3, K = k + m, seeds = 20000;
    vector<int> head_lists(s.rows() * K, -1);
    for (int i = 0; i < s.T; i++) {
        head_lists[i * K] = 0;                      // rows 0..6: head {0, 1} (or {0})
        if (i > 0) head_lists[i * K + 1] = 1;
    }
    head_lists[7 * K] = 2;
    head_lists[7 * K + 1] = 5;
    const vector<int> tail{0, 1, 3, 4, 6, 7};

    std::map<vector<int>, int> subset_counts;
    std::map<int, int> key_counts;
    OneThreadScope one_thread;
    for (int seed = 0; seed < seeds; seed++) {
        const auto without = sample_tail_lists(head_lists, s, k, m, false, 1000 + seed);
        vector<int> subset(without.idx.begin() + 7 * K + k, without.idx.begin() + 8 * K);
        std::sort(subset.begin(), subset.end());
        subset_counts[subset]++;
        const auto with = sample_tail_lists(head_lists, s, k, m, true, 1000 + seed);
        for (int t = k; t < K; t++) key_counts[with.idx[7 * K + t]]++;
    }
    ASSERT_EQ(subset_counts.size(), 20u);
    const double p_subset = 1.0 / 20.0;
    for (auto& [subset, count] : subset_counts) {
        for (int j : subset) ASSERT_TRUE(std::count(tail.begin(), tail.end(), j));
        EXPECT_LE(std::fabs(count - seeds * p_subset), kZBound * std::sqrt(seeds * p_subset * (1 - p_subset)));
    }
    ASSERT_EQ(key_counts.size(), tail.size());
    const double draws = (double)seeds * m, p_key = 1.0 / 6.0;
    for (auto& [key, count] : key_counts) {
        ASSERT_TRUE(std::count(tail.begin(), tail.end(), key));
        EXPECT_LE(std::fabs(count - draws * p_key), kZBound * std::sqrt(draws * p_key * (1 - p_key))) << "key " << key;
    }
}

TEST(KnnTail, ListsAreAPureFunctionOfSeedStepAndLayer) {
    const Shape s{2, 64, 32, 2};
    const int k = 4, m = 8;
    const auto head_lists = naive_causal_topk(uniform(s.qkv_size(), 45, -2.0f, 2.0f), s, k, k + m);
    for (bool with_replacement : {false, true}) {
        const auto lists = sample_tail_lists(head_lists, s, k, m, with_replacement, 7, 3, 1);
        EXPECT_EQ(sample_tail_lists(head_lists, s, k, m, with_replacement, 7, 3, 1).idx, lists.idx);
        EXPECT_NE(sample_tail_lists(head_lists, s, k, m, with_replacement, 8, 3, 1).idx, lists.idx);
        EXPECT_NE(sample_tail_lists(head_lists, s, k, m, with_replacement, 7, 4, 1).idx, lists.idx);
        EXPECT_NE(sample_tail_lists(head_lists, s, k, m, with_replacement, 7, 3, 2).idx, lists.idx);
    }
}

// Row b draws as global batch row batch0 + b (kernels/common/draws.h): a batch of 4
// sequences and its two halves at batch0 = 0 and 2 give the same lists, bit for bit,
// and the first half at batch0 = 2 draws other samples than at batch0 = 0.
TEST(KnnTail, BatchSplitAtItsGlobalRowsDrawsTheSameLists) {
    const Shape s{4, 64, 32, 2}, half{2, 64, 32, 2};
    const int k = 4, m = 8;
    const auto head_lists = naive_causal_topk(uniform(s.qkv_size(), 46, -2.0f, 2.0f), s, k, k + m);
    const size_t half_size = head_lists.size() / 2;  // (B, NH, T, K): rows 0..1, then 2..3
    const vector<int> first(head_lists.begin(), head_lists.begin() + half_size);
    const vector<int> second(head_lists.begin() + half_size, head_lists.end());
    for (bool with_replacement : {false, true}) {
        const auto whole = sample_tail_lists(head_lists, s, k, m, with_replacement, 7, 3, 1, 0);
        const auto a = sample_tail_lists(first, half, k, m, with_replacement, 7, 3, 1, 0);
        const auto b = sample_tail_lists(second, half, k, m, with_replacement, 7, 3, 1, half.B);
        vector<int> idx = a.idx;
        idx.insert(idx.end(), b.idx.begin(), b.idx.end());
        vector<float> logw = a.logw;
        logw.insert(logw.end(), b.logw.begin(), b.logw.end());
        EXPECT_EQ(idx, whole.idx) << "with replacement " << with_replacement;
        EXPECT_EQ(std::memcmp(logw.data(), whole.logw.data(), logw.size() * sizeof(float)), 0);
        EXPECT_NE(sample_tail_lists(first, half, k, m, with_replacement, 7, 3, 1, half.B).idx, a.idx);
    }
}

TEST(KnnTail, NormaliserAndNumeratorAreUnbiased) {
    // §3.2: E[Ẑ_i] = Z_i and E[N̂_i] = N_i, with Ẑ_i = exp(lse_i) and N̂_i = Ẑ_i Ô_i
    // from the kernel, over 1000 seeds, every row with a sampled tail, every channel.
    const Shape s{1, 48, 64, 2};
    const int k = 4, m = 6, K = k + m, seeds = 1000;
    const auto qkv = uniform(s.qkv_size(), 46, -2.0f, 2.0f);
    const auto qkv_d = to_double(qkv);
    const auto head_lists = naive_causal_topk(qkv, s, k, K);
    for (bool with_replacement : {false, true}) {
        vector<RunningMean> z_hat(s.rows()), n_hat(s.rows() * s.HS());
        vector<float> out(s.out_size()), lse(s.rows());
        OneThreadScope one_thread;
        for (int seed = 0; seed < seeds; seed++) {
            const auto lists = sample_tail_lists(head_lists, s, k, m, with_replacement, 5000 + seed);
            cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), lists.idx.data(), lists.logw.data(),
                                          s.B, s.T, s.C, s.NH, K);
            for (int h = 0; h < s.NH; h++)
                for (int i = k + m; i < s.T; i++) {
                    const size_t row = s.row_at(0, h, i);
                    const double z = std::exp((double)lse[row]);
                    z_hat[row].add(z);
                    for (int c = 0; c < s.HS(); c++) n_hat[row * s.HS() + c].add(z * out[s.out_at(0, i, h, c)]);
                }
        }
        double max_z = 0.0;
        for (int h = 0; h < s.NH; h++)
            for (int i = k + m; i < s.T; i++) {
                const size_t row = s.row_at(0, h, i);
                const ExactRow exact = exact_row(qkv_d, s, 0, h, i);
                ASSERT_GT(z_hat[row].stderr_of_mean(), 0.0);
                const double z_score = (z_hat[row].mean() - exact.Z) / z_hat[row].stderr_of_mean();
                EXPECT_LE(std::fabs(z_score), kZBound) << "Z, h=" << h << " i=" << i;
                max_z = std::fmax(max_z, std::fabs(z_score));
                for (int c = 0; c < s.HS(); c++) {
                    const RunningMean& n = n_hat[row * s.HS() + c];
                    const double zc = (n.mean() - exact.N[c]) / n.stderr_of_mean();
                    EXPECT_LE(std::fabs(zc), kZBound) << "N, h=" << h << " i=" << i << " c=" << c;
                    max_z = std::fmax(max_z, std::fabs(zc));
                }
            }
        std::printf("  %s replacement: largest |z| %.2f over %d means\n", with_replacement ? "with" : "without",
                    max_z, (s.T - k - m) * s.NH * (s.HS() + 1));
    }
}

TEST(KnnTail, BackwardMatchesFiniteDifferencesWithSamplesFixed) {
    // T = 12, k = 3, m = 4: rows i >= 7 sample (with replacement, repeats occur), rows below are exact.
    const Shape s{1, 12, 16, 2};
    const int k = 3, m = 4, K = k + m;
    const auto qkv = uniform(s.qkv_size(), 47, -2.0f, 2.0f);
    const auto head_lists = naive_causal_topk(qkv, s, k, K);
    for (bool with_replacement : {false, true}) {
        const auto lists = sample_tail_lists(head_lists, s, k, m, with_replacement, 48);
        if (with_replacement) {
            size_t repeats = 0;
            for (size_t row = 0; row < s.rows(); row++)
                repeats += m - std::set<int>(&lists.idx[row * K + k], &lists.idx[row * K + K]).size();
            ASSERT_GT(repeats, 0u);
        }
        expect_list_backward_matches_finite_differences(qkv, s, lists.idx, &lists.logw, K, 49);
    }
}

// ---------------------------------------------------------------------------
// knn-tail error statistics over 1000 seeds
// ---------------------------------------------------------------------------

namespace {

// One fixed input, shape (1, 128, 64, 4) (HS = 16): q and k uniform in (-2, 2),
// so scores have standard deviation ~1.3 (a peaked softmax), v uniform in
// (-1, 1). Studied rows: i >= 96 of every head, whose tails |R_i| = i + 1 - k
// lie close together (k = 8: 89..120; k = 32: 65..96).
const Shape kTailShape{1, 128, 64, 4};
constexpr int kTailFirstRow = 96, kTailSeeds = 1000;

const vector<float>& tail_problem_qkv() {
    static const vector<float> qkv = [] {
        auto x = uniform(kTailShape.qkv_size(), 50, -2.0f, 2.0f);
        for (int t = 0; t < kTailShape.T; t++)
            for (int c = 0; c < kTailShape.C; c++) x[kTailShape.qkv_at(0, t, 2, 0, c)] *= 0.5f;
        return x;
    }();
    return qkv;
}

struct TailErrorStats {
    vector<int> tail_size;              // |R_i| per studied row
    vector<double> bound;               // §3.2: |R_i| max_j ||v_j - O_i||^2 / (4 k m)
    vector<double> mse;                 // E||Ô_i - O_i||^2 per row
    vector<double> bias2, bias2_var;    // ||E[Ô_i] - O_i||^2 per row (the mean's own variance removed), its variance
    double linear_exact = 0.0;          // sum over rows of E||N̂_i - O_i Ẑ_i||^2 / Z_i^2, exact (below)
    RunningMean linear;                 // per seed: sum over rows of ||N̂_i - O_i Ẑ_i||^2 / Z_i^2
    RunningMean squared_error;          // per seed: sum over rows of ||Ô_i - O_i||^2
    vector<double> seed_squared_error;  // the same, seed by seed, for paired comparisons
};

double sum_of(const vector<double>& per_row) {
    double total = 0.0;
    for (double x : per_row) total += x;
    return total;
}

// The first-order error of Ô_i exactly: Ô_i - O_i = D_i / Ẑ_i with
// D_i = N̂_i - O_i Ẑ_i = sum_{j in S_i} x_j + w_i sum_t x_{J_t}, x_j = e^{s_ij} (v_j - O_i).
// Since sum_{j <= i} x_j = N_i - O_i Z_i = 0, E[D_i] = 0 and E||D_i||^2 is the
// variance of w_i sum_t x_{J_t}: (|R|^2 / m) sigma^2, times the finite-population
// correction (|R| - m) / (|R| - 1) without replacement, where
// sigma^2 = (1/|R|) sum_{j in R} ||x_j - mean_R x||^2. Returns E||D_i||^2 / Z_i^2.
double linear_error_exact(const vector<double>& qkv, const Shape& s, int h, int i, const std::set<int>& head,
                          const ExactRow& exact, int m, bool with_replacement) {
    vector<vector<double>> x;
    for (int j = 0; j <= i; j++) {
        if (head.count(j)) continue;
        const double e = std::exp(score(qkv, s, 0, h, i, j));
        vector<double> xj(s.HS());
        for (int c = 0; c < s.HS(); c++) xj[c] = e * (qkv[s.qkv_at(0, j, 2, h, c)] - exact.O[c]);
        x.push_back(xj);
    }
    const double R = (double)x.size();
    double sigma2 = 0.0;
    for (int c = 0; c < s.HS(); c++) {
        double mean = 0.0, sq = 0.0;
        for (auto& xj : x) mean += xj[c] / R;
        for (auto& xj : x) sq += (xj[c] - mean) * (xj[c] - mean);
        sigma2 += sq / R;
    }
    const double fpc = with_replacement ? 1.0 : (R - m) / (R - 1.0);
    return R * R / m * sigma2 * fpc / (exact.Z * exact.Z);
}

TailErrorStats compute_tail_error_stats(int k, int m, bool with_replacement) {
    const Shape& s = kTailShape;
    const int K = k + m, HS = s.HS();
    const auto& qkv = tail_problem_qkv();
    const auto qkv_d = to_double(qkv);
    const auto head_lists = naive_causal_topk(qkv, s, k, K);
    TailErrorStats st;
    vector<ExactRow> exact;
    for (int h = 0; h < s.NH; h++)
        for (int i = kTailFirstRow; i < s.T; i++) {
            exact.push_back(exact_row(qkv_d, s, 0, h, i));
            const size_t row = s.row_at(0, h, i);
            const std::set<int> head(head_lists.begin() + row * K, head_lists.begin() + row * K + k);
            st.tail_size.push_back(i + 1 - k);
            st.linear_exact += linear_error_exact(qkv_d, s, h, i, head, exact.back(), m, with_replacement);
            double spread = 0.0;  // max_j ||v_j - O_i||^2
            for (int j = 0; j <= i; j++) {
                double d2 = 0.0;
                for (int c = 0; c < HS; c++) {
                    const double d = qkv_d[s.qkv_at(0, j, 2, h, c)] - exact.back().O[c];
                    d2 += d * d;
                }
                spread = std::fmax(spread, d2);
            }
            st.bound.push_back(st.tail_size.back() * spread / (4.0 * k * m));
        }
    const size_t rows = exact.size();
    // per row: sums of the error vector and of its outer products, for the mean and covariance
    vector<double> error_sum(rows * HS, 0.0), error_outer(rows * HS * HS, 0.0), error(HS);
    vector<float> out(s.out_size()), lse(s.rows());
    OneThreadScope one_thread;
    for (int seed = 0; seed < kTailSeeds; seed++) {
        const auto lists = sample_tail_lists(head_lists, s, k, m, with_replacement, 90000 + seed);
        cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), lists.idx.data(), lists.logw.data(),
                                      s.B, s.T, s.C, s.NH, K);
        double squared_error = 0.0, linear = 0.0;
        size_t r = 0;
        for (int h = 0; h < s.NH; h++)
            for (int i = kTailFirstRow; i < s.T; i++, r++) {
                const double z_ratio = std::exp((double)lse[s.row_at(0, h, i)]) / exact[r].Z;  // Ẑ_i / Z_i
                for (int c = 0; c < HS; c++) {
                    error[c] = out[s.out_at(0, i, h, c)] - exact[r].O[c];
                    squared_error += error[c] * error[c];
                    linear += z_ratio * z_ratio * error[c] * error[c];
                    error_sum[r * HS + c] += error[c];
                }
                for (int c = 0; c < HS; c++)
                    for (int d = 0; d < HS; d++) error_outer[(r * HS + c) * HS + d] += error[c] * error[d];
            }
        st.squared_error.add(squared_error);
        st.seed_squared_error.push_back(squared_error);
        st.linear.add(linear);
    }
    // bias^2 = ||mean||^2 - tr(Cov)/n is unbiased; Var ~ 4 mean^T Cov mean / n + 2 tr(Cov^2) / n^2
    const double n = kTailSeeds;
    vector<double> mean(HS), cov(HS * HS);
    for (size_t r = 0; r < rows; r++) {
        for (int c = 0; c < HS; c++) mean[c] = error_sum[r * HS + c] / n;
        for (int c = 0; c < HS; c++)
            for (int d = 0; d < HS; d++)
                cov[c * HS + d] = (error_outer[(r * HS + c) * HS + d] / n - mean[c] * mean[d]) * n / (n - 1);
        double mse = 0.0, mean2 = 0.0, trace = 0.0, quad = 0.0, trace_sq = 0.0;
        for (int c = 0; c < HS; c++) {
            mse += error_outer[(r * HS + c) * HS + c] / n;
            mean2 += mean[c] * mean[c];
            trace += cov[c * HS + c];
            for (int d = 0; d < HS; d++) {
                quad += mean[c] * cov[c * HS + d] * mean[d];
                trace_sq += cov[c * HS + d] * cov[d * HS + c];
            }
        }
        st.mse.push_back(mse);
        st.bias2.push_back(mean2 - trace / n);
        st.bias2_var.push_back(4.0 * quad / n + 2.0 * trace_sq / (n * n));
    }
    return st;
}

// Each (k, m, variant) is run once and shared by the tests below.
const TailErrorStats& tail_error_stats(int k, int m, bool with_replacement) {
    static std::map<std::tuple<int, int, bool>, TailErrorStats> cache;
    const auto key = std::make_tuple(k, m, with_replacement);
    auto found = cache.find(key);
    if (found == cache.end()) found = cache.emplace(key, compute_tail_error_stats(k, m, with_replacement)).first;
    return found->second;
}

}  // namespace

TEST(KnnTail, LinearisedErrorFallsExactlyAsOneOverMWithFinitePopulationCorrection) {
    // E||N̂_i - O_i Ẑ_i||^2 / Z_i^2 (the first-order error of Ô_i) against its
    // exact value (|R|^2 / m) sigma^2 [(|R| - m) / (|R| - 1) without replacement],
    // summed over the studied rows, within 5 standard errors.
    for (bool with_replacement : {false, true})
        for (int m : {2, 8, 32}) {
            const auto& st = tail_error_stats(8, m, with_replacement);
            const double z = (st.linear.mean() - st.linear_exact) / st.linear.stderr_of_mean();
            std::printf("  k = 8, m = %2d, %s: linearised error %.4f, exact %.4f (z = %+.2f)\n", m,
                        with_replacement ? "with   " : "without", st.linear.mean(), st.linear_exact, z);
            EXPECT_LE(std::fabs(z), kZBound) << "m=" << m << " with_replacement=" << with_replacement;
        }
}

TEST(KnnTail, MeanSquaredErrorFallsRoughlyAsOneOverMAndStaysUnderTheBound) {
    // First order in 1/m, MSE_i(m) = A_i f_i(m) with f_i(m) = (|R_i| - m) / (m (|R_i| - 1))
    // (1/m with the finite-population correction of sampling without replacement),
    // so the summed MSE's ratio between m and 4m lies between the smallest and the
    // largest f_i(m) / f_i(4m) over the rows. The ratio estimator adds relative
    // corrections of the order of Var[Ẑ_i] / Z_i^2, which §3.2 bounds by
    // |R_i| / (4 k m): with k = 32, at most 96 / 256 = 0.375 at m = 2. The measured
    // ratio must lie within that bracket widened by 1 + max_i |R_i| / (4 k m) either way.
    const int k = 32;
    const int ms[] = {2, 8, 32};
    for (int a = 0; a + 1 < 3; a++) {
        const int m1 = ms[a], m2 = ms[a + 1];
        const auto& st1 = tail_error_stats(k, m1, false);
        const auto& st2 = tail_error_stats(k, m2, false);
        double lo = INFINITY, hi = 0.0, widen = 1.0;
        for (int R : st1.tail_size) {
            const double predicted = ((double)(R - m1) / m1) / ((double)(R - m2) / m2);
            lo = std::fmin(lo, predicted);
            hi = std::fmax(hi, predicted);
            widen = std::fmax(widen, 1.0 + R / (4.0 * k * m1));
        }
        const double ratio = st1.squared_error.mean() / st2.squared_error.mean();
        std::printf("  k = %d: MSE(m = %d) / MSE(m = %d) = %.3f; first order %.3f..%.3f, allowed %.3f..%.3f\n", k, m1,
                    m2, ratio, lo, hi, lo / widen, hi * widen);
        EXPECT_GE(ratio, lo / widen);
        EXPECT_LE(ratio, hi * widen);
    }
    // §3.2: E||Ô_i - O_i||^2 <~ |R_i| max_j ||v_j - O_i||^2 / (4 k m), row by row
    for (int kk : {8, 32})
        for (int m : ms) {
            const auto& st = tail_error_stats(kk, m, false);
            double worst = 0.0;
            for (size_t r = 0; r < st.mse.size(); r++) worst = std::fmax(worst, st.mse[r] / st.bound[r]);
            std::printf("  k = %2d, m = %2d: MSE %.4f, largest MSE / bound %.3f\n", kk, m, st.squared_error.mean(), worst);
            EXPECT_LE(worst, 1.0) << "k=" << kk << " m=" << m;
        }
}

TEST(KnnTail, MeanSquaredErrorFallsAsKGrows) {
    // §3.6: at fixed m the error falls with k (same rows; k = 8 vs k = 32), by more than 5 standard errors.
    for (int m : {2, 8, 32}) {
        const auto& small_k = tail_error_stats(8, m, false);
        const auto& large_k = tail_error_stats(32, m, false);
        const double gap = small_k.squared_error.mean() - large_k.squared_error.mean();
        EXPECT_GT(gap, kZBound * std::hypot(small_k.squared_error.stderr_of_mean(), large_k.squared_error.stderr_of_mean()))
            << "m=" << m;
    }
}

TEST(KnnTail, BiasShrinksWithM) {
    // Ô_i is a ratio estimator: biased, O(1/m). The summed squared bias ||E[Ô_i] - O_i||^2
    // at m = 2 is nonzero, and each step m -> 4m lowers it, each by more than 5 standard errors.
    const int k = 8;
    double previous = 0.0, previous_var = 0.0;
    for (int m : {2, 8, 32}) {
        const auto& st = tail_error_stats(k, m, false);
        const double bias2 = sum_of(st.bias2), bias2_var = sum_of(st.bias2_var);
        std::printf("  k = %d, m = %2d: squared bias %.5f +- %.5f (MSE %.4f)\n", k, m, bias2, std::sqrt(bias2_var),
                    st.squared_error.mean());
        if (m == 2) EXPECT_GT(bias2, kZBound * std::sqrt(bias2_var));
        else EXPECT_GT(previous - bias2, kZBound * std::sqrt(previous_var + bias2_var)) << "m=" << m;
        previous = bias2;
        previous_var = bias2_var;
    }
}

TEST(KnnTail, WithoutReplacementHasLowerVarianceThanWith) {
    // Same m, same seeds (k = 8, |R_i| = 89..120): the summed squared error is
    // lower without replacement, by more than 5 standard errors of the paired
    // per-seed difference; and so is the variance, MSE minus squared bias.
    const int k = 8;
    for (int m : {8, 32}) {
        const auto& without = tail_error_stats(k, m, false);
        const auto& with = tail_error_stats(k, m, true);
        RunningMean difference;
        for (int seed = 0; seed < kTailSeeds; seed++)
            difference.add(with.seed_squared_error[seed] - without.seed_squared_error[seed]);
        const double variance_without = without.squared_error.mean() - sum_of(without.bias2);
        const double variance_with = with.squared_error.mean() - sum_of(with.bias2);
        std::printf("  k = %d, m = %2d: variance without %.4f, with %.4f (ratio %.3f)\n", k, m, variance_without,
                    variance_with, variance_without / variance_with);
        EXPECT_GT(difference.mean(), kZBound * difference.stderr_of_mean()) << "m=" << m;
        EXPECT_LT(variance_without, variance_with) << "m=" << m;
    }
}
