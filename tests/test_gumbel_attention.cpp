// tests/test_gumbel_attention.cpp — lazy Gumbel sampling and the median-of-means
// estimator (kernels/cpu/gumbel_attention.h, ALGORITHMS.md §4.6).
//
// Statistical bounds: every check is a z bound at 5 standard errors computed from
// the measured variance (or, for the chi-square tests, the 5-sigma upper quantile of
// the chi-square law). The fixed seeds make the outcomes reproducible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tests/attention_test_util.h"
#include "kernels/common/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/common/sampler_log.h"
#include "kernels/cpu/gumbel_attention.h"
#include "tests/test_util.h"

using namespace knngpt;
using namespace knngpt::cpu;

using knngpt_test::naive_causal_topk;
using knngpt_test::mean_and_stderr;
using knngpt_test::RunningMoments;

namespace {

// qkv (B, T, 3C) uniform in [-1, 1], with the queries scaled by `query_scale` (the
// score scale: small is flat, large is peaked).
std::vector<float> random_qkv(int B, int T, int C, float query_scale, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> qkv((size_t)B * T * 3 * C);
    for (size_t n = 0; n < qkv.size(); n++) {
        const float x = 2.0f * rng.uniform() - 1.0f;
        qkv[n] = (n % (3 * C)) < (size_t)C ? query_scale * x : x;
    }
    return qkv;
}


// Exact softmax row P_i of (b, h) in fp64, from the same fp32 scores.
std::vector<double> exact_row(const float* qkv, int b, int h, int i, int T, int C, int NH) {
    const int HS = C / NH, C3 = 3 * C;
    const float tau = 1.0f / std::sqrt((float)HS);
    const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
    std::vector<double> p(i + 1);
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j <= i; j++) {
        p[j] = knngpt::attention_score(qkv + at.q + (size_t)i * C3, qkv + at.k + (size_t)j * C3, HS, tau);
        mx = std::max(mx, p[j]);
    }
    for (double& x : p) sum += (x = std::exp(x - mx));
    for (double& x : p) x /= sum;
    return p;
}

// The 5-sigma upper quantile of chi-square with df degrees of freedom (Wilson-Hilferty:
// (X/df)^(1/3) is close to normal with mean 1 - 2/(9 df) and variance 2/(9 df)).
double chi_square_5_sigma(int df) {
    const double v = 2.0 / (9.0 * df);
    return df * std::pow(1.0 - v + 5.0 * std::sqrt(v), 3.0);
}

struct ChiSquare {
    double statistic;
    int df;
};
// Pearson chi-square of counts against probabilities, pooling the bins expected below
// 5 into one bin (so the chi-square approximation holds for peaked rows).
ChiSquare chi_square(const std::vector<long long>& counts, const std::vector<double>& probs, long long n) {
    double stat = 0.0, pooled_expected = 0.0, pooled_observed = 0.0;
    int bins = 0;
    for (size_t j = 0; j < probs.size(); j++) {
        const double expected = probs[j] * n;
        if (expected < 5.0) {
            pooled_expected += expected;
            pooled_observed += counts[j];
            continue;
        }
        stat += (counts[j] - expected) * (counts[j] - expected) / expected;
        bins++;
    }
    if (pooled_expected >= 5.0) {
        stat += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
        bins++;
    } else {
        stat += pooled_observed > 0 && pooled_expected == 0.0 ? 1e30 : 0.0;  // impossible keys drawn
    }
    return {stat, bins - 1};
}

// One row, sampled `n` times with lazy_gumbel_sample: counts per key, exceeders, fallbacks.
struct RowDraws {
    std::vector<long long> counts;
    double exceeder_mean = 0.0, exceeder_stderr = 0.0;
    long long fallbacks = 0;
    int head = 0, tail = 0;
};
RowDraws draw_row(const float* qkv, const int* topk_all, int T, int C, int NH, int k, int b, int h, int i,
                  long long n, uint64_t seed, int max_exceeders /* < 0: the default cap */) {
    const int HS = C / NH, C3 = 3 * C;
    const float tau = 1.0f / std::sqrt((float)HS);
    const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
    const int* topk = topk_all + (((size_t)b * NH + h) * T + i) * k;
    RowDraws r;
    r.counts.assign(i + 1, 0);
    while (r.head < k && topk[r.head] >= 0) r.head++;
    r.tail = i + 1 - r.head;
    const int cap = max_exceeders >= 0 ? max_exceeders : lazy_gumbel_default_max_exceeders(r.tail, r.head);
    const DrawSite site{seed, 0, (uint32_t)h, (uint32_t)(b * T + i)};
    double sum = 0.0, sum2 = 0.0;
    for (long long u = 0; u < n; u++) {
        int x = -1;
        bool fell_back = false;
        const int J = lazy_gumbel_sample(qkv + at.q + (size_t)i * C3, qkv + at.k, C3, HS, tau, i + 1, topk, k, site,
                                         (uint32_t)u, cap, &x, &fell_back);
        EXPECT_TRUE(J >= 0 && J <= i) << "sample " << J << " outside the causal row " << i;
        if (J < 0 || J > i) return r;
        r.counts[J]++;
        sum += x;
        sum2 += (double)x * x;
        r.fallbacks += fell_back ? 1 : 0;
    }
    r.exceeder_mean = sum / n;
    r.exceeder_stderr = std::sqrt(std::max(0.0, sum2 / n - r.exceeder_mean * r.exceeder_mean) / (n - 1));
    return r;
}

// Samples row i of (b 0, h 0) n times and checks the counts against the exact row by
// chi-square; returns the statistic over its 5-sigma quantile (pass: <= 1).
double expect_row_exact(const float* qkv, const int* topk, int T, int C, int NH, int k, int i, long long n,
                        uint64_t seed, int max_exceeders, const char* what, RowDraws* draws_out = nullptr) {
    RowDraws d = draw_row(qkv, topk, T, C, NH, k, 0, 0, i, n, seed, max_exceeders);
    const ChiSquare chi = chi_square(d.counts, exact_row(qkv, 0, 0, i, T, C, NH), n);
    if (chi.df >= 1) {
        EXPECT_LE(chi.statistic, chi_square_5_sigma(chi.df))
            << what << ": row " << i << " (n_i " << i + 1 << ", k " << k << "), chi-square " << chi.statistic
            << " on " << chi.df << " df";
    }
    if (draws_out) *draws_out = d;
    return chi.df >= 1 ? chi.statistic / chi_square_5_sigma(chi.df) : 0.0;
}

// The forward problem shared by the estimator tests.
struct ForwardProblem {
    int B = 1, T = 24, C = 16, NH = 2, k = 4;
    std::vector<float> qkv, exact_out, lse;
    std::vector<int> topk;
    explicit ForwardProblem(int batch = 1) : B(batch) {
        qkv = random_qkv(B, T, C, 2.0f, 7);
        topk = naive_causal_topk(qkv, {B, T, C, NH}, k);
        exact_out.assign((size_t)B * T * C, 0.0f);
        lse.assign((size_t)B * NH * T, 0.0f);
        attention_forward(exact_out.data(), lse.data(), qkv.data(), B, T, C, NH);
    }
    size_t out_size() const { return (size_t)B * T * C; }
    std::vector<float> run(int groups, int t, uint64_t seed, GumbelStats* stats = nullptr, uint32_t step = 0) const {
        return run_rows(0, B, 0, groups, t, seed, stats, step);
    }
    // the forward on batch rows first..first + count - 1 alone, as global rows batch0..
    std::vector<float> run_rows(int first, int count, int batch0, int groups, int t, uint64_t seed,
                                GumbelStats* stats = nullptr, uint32_t step = 0) const {
        std::vector<float> out((size_t)count * T * C, 0.0f);
        gumbel_attention_forward(out.data(), qkv.data() + (size_t)first * T * 3 * C,
                                 topk.data() + (size_t)first * NH * T * k, count, T, C, NH, k, groups, t, seed, step, 3,
                                 batch0, stats);
        return out;
    }
};

// Mean over seeds of the squared error summed over all elements, one value per seed.
std::vector<double> squared_errors_per_seed(const ForwardProblem& fp, int groups, int t, uint64_t first_seed,
                                            int seeds) {
    std::vector<double> err(seeds);
    for (int s = 0; s < seeds; s++) {
        const std::vector<float> out = fp.run(groups, t, first_seed + s);
        double e = 0.0;
        for (size_t n = 0; n < out.size(); n++) e += std::pow((double)out[n] - fp.exact_out[n], 2);
        err[s] = e;
    }
    return err;
}

}  // namespace

TEST(LazyGumbel, SamplesMatchExactSoftmaxByChiSquareOnCausalRows) {
    // n <= 64 keys, 1e5 samples per row; k = 4 (rows 0..3 hold every key), flat to peaked scores
    const int T = 64, C = 8, NH = 1;
    double worst = 0.0;
    for (float scale : {0.1f, 1.0f, 8.0f}) {
        const std::vector<float> qkv = random_qkv(1, T, C, scale, 11);
        for (int k : {4, 8}) {
            if (k == 8 && scale != 1.0f) continue;
            const std::vector<int> topk = naive_causal_topk(qkv, {1, T, C, NH}, k);
            for (int i : {2, 13, 40, 63}) {
                char what[64];
                std::snprintf(what, sizeof what, "score scale %g", scale);
                worst = std::max(worst, expect_row_exact(qkv.data(), topk.data(), T, C, NH, k, i, 100000,
                                                         1000 + i, -1, what));
            }
        }
    }
    std::printf("  largest chi-square over its 5-sigma quantile, 16 rows: %.3f\n", worst);
}

TEST(LazyGumbel, RowsWithAtMostKKeysAreSoftmaxPicksWithoutExceeders) {
    const int T = 16, C = 8, NH = 1, k = 8;
    const std::vector<float> qkv = random_qkv(1, T, C, 4.0f, 12);
    const std::vector<int> topk = naive_causal_topk(qkv, {1, T, C, NH}, k);
    for (int i = 0; i < k; i++) {
        RowDraws d;
        expect_row_exact(qkv.data(), topk.data(), T, C, NH, k, i, i == k - 1 ? 100000 : 2000, 77, -1, "n_i <= k", &d);
        EXPECT_EQ(d.tail, 0);
        EXPECT_EQ(d.exceeder_mean, 0.0) << "row " << i << " has no tail but drew exceeders";
        EXPECT_EQ(d.fallbacks, 0);
    }
}

TEST(LazyGumbel, RowHeadSummaryGivesTheSameSamplesAsEachSampleItsOwn) {
    // the samplers summarise a row's head once (lazy_gumbel_head_prepare with a buffer: its
    // scores 16 side by side); a sample without it recomputes them one by one. k = 40 spans
    // two full batches and a partial one; rows below k have padded lists; HS 7 and 64
    for (int HS : {7, 64}) {
        const int T = 160, C = HS, NH = 1, k = 40, C3 = 3 * C;
        const float tau = attention_tau(HS);
        const std::vector<float> qkv = random_qkv(1, T, C, 2.0f, 21 + HS);
        const std::vector<int> topk_all = naive_causal_topk(qkv, {1, T, C, NH}, k);
        std::vector<double> cdf(k);
        long long compared = 0, in_tail = 0;
        for (int i : {0, 5, 39, 40, 41, 77, 159}) {
            const int* topk = topk_all.data() + (size_t)i * k;
            const float* q_i = qkv.data() + (size_t)i * C3;
            LazyGumbelHead head;
            lazy_gumbel_head_prepare(&head, cdf.data(), q_i, qkv.data() + C, C3, HS, tau, topk, k);
            ASSERT_EQ(head.count, std::min(k, i + 1));
            const int cap = lazy_gumbel_default_max_exceeders(i + 1 - head.count, head.count);
            const DrawSite site{5, 0, 0, (uint32_t)i};
            for (uint32_t u = 0; u < 200; u++) {
                int x_own = -1, x_row = -1;
                bool fb_own = false, fb_row = false;
                const int own = lazy_gumbel_sample(q_i, qkv.data() + C, C3, HS, tau, i + 1, topk, k, site, u, cap,
                                                   &x_own, &fb_own);
                const int row = lazy_gumbel_sample(q_i, qkv.data() + C, C3, HS, tau, i + 1, topk, k, site, u, cap,
                                                   &x_row, &fb_row, nullptr, &head, true);
                ASSERT_EQ(own, row) << "HS " << HS << " row " << i << " sample " << u;
                ASSERT_EQ(x_own, x_row);
                ASSERT_EQ(fb_own, fb_row);
                compared++;
                in_tail += std::find(topk, topk + head.count, own) == topk + head.count ? 1 : 0;
            }
        }
        EXPECT_GT(in_tail, 0) << "no sample came from a tail: the walk was not exercised";
        std::printf("  HS %d: %lld samples equal, %lld of them from the tail\n", HS, compared, in_tail);
    }
}

TEST(LazyGumbel, MeanExceederCountIsAtMostTailOverK) {
    // E[x] <= |R_i| / k (§4.3); flat scores come closest to the bound
    const int T = 64, C = 8, NH = 1;
    for (float scale : {0.1f, 1.0f}) {
        const std::vector<float> qkv = random_qkv(1, T, C, scale, 13);
        for (int k : {2, 4, 8}) {
            const std::vector<int> topk = naive_causal_topk(qkv, {1, T, C, NH}, k);
            const int i = T - 1;
            const RowDraws d = draw_row(qkv.data(), topk.data(), T, C, NH, k, 0, 0, i, 20000, 5, -1);
            const double bound = (double)d.tail / k;
            EXPECT_LE(d.exceeder_mean, bound + 5.0 * d.exceeder_stderr)
                << "scale " << scale << ", k " << k << ": mean exceeders " << d.exceeder_mean << " +- "
                << d.exceeder_stderr << " against |R_i|/k = " << bound;
            std::printf("  scale %-4g k %d: mean exceeders %.3f +- %.3f, bound |R_i|/k = %.2f\n", scale, k,
                        d.exceeder_mean, d.exceeder_stderr, bound);
        }
    }
}

TEST(LazyGumbel, TinyExceederCapFallsBackAndStaysExact) {
    const int T = 64, C = 8, NH = 1, k = 4, i = 63;
    for (float scale : {0.1f, 2.0f}) {
        const std::vector<float> qkv = random_qkv(1, T, C, scale, 14);
        const std::vector<int> topk = naive_causal_topk(qkv, {1, T, C, NH}, k);
        for (int cap : {0, 1}) {
            const long long n = 100000;
            RowDraws d;
            char what[64];
            std::snprintf(what, sizeof what, "max_exceeders %d, scale %g", cap, scale);
            const double chi = expect_row_exact(qkv.data(), topk.data(), T, C, NH, k, i, n, 31 + cap, cap, what, &d);
            EXPECT_GT(d.fallbacks, n / 100) << what << ": the cap should be hit often";
            std::printf("  %s: %.1f%% of samples fell back, chi-square / 5-sigma quantile %.3f\n", what,
                        100.0 * d.fallbacks / n, chi);
        }
    }
}

TEST(GumbelAttention, PlainSampleMeanIsUnbiasedOverSeeds) {
    // one group of t = 4 samples: the plain mean of v_J; 1000 seeds; z <= 5 per element.
    // 384 elements: under normality the chance that any |z| > 5 is about 384 * 5.7e-7.
    const ForwardProblem fp;
    const int seeds = 1000;
    RunningMoments m(fp.out_size());
    for (int s = 0; s < seeds; s++) m.add(fp.run(1, 4, 100 + s).data());
    double worst_z = 0.0;
    for (size_t e = 0; e < fp.out_size(); e++) {
        const double diff = std::fabs(m.mean(e) - fp.exact_out[e]);
        const double se = m.stderr_of_mean(e);
        // 1e-5: fp32 rounding of the reference, for entries that barely vary (row 0 is exact)
        EXPECT_LE(diff, 5.0 * se + 1e-5) << "element " << e;
        if (se > 0) worst_z = std::max(worst_z, diff / se);
    }
    std::printf("  largest |z| over %zu elements: %.2f\n", fp.out_size(), worst_z);
}

TEST(GumbelAttention, SampleMeanErrorFallsAsOneOverSqrtSamples) {
    // E|mean_t - O|^2 = tr Cov / t exactly (independent samples), so the RMS error ratio
    // between t and 4t is 2; the bound is 5 standard errors of the measured ratio
    // (delta method on two independent means over seeds).
    const ForwardProblem fp;
    const int seeds = 300;
    std::vector<double> mse, mse_se;
    for (int t : {4, 16, 64}) {
        double mean, se;
        mean_and_stderr(squared_errors_per_seed(fp, 1, t, 5000 + 1000 * t, seeds), &mean, &se);
        mse.push_back(mean);
        mse_se.push_back(se);
    }
    for (int n = 0; n + 1 < 3; n++) {
        const double ratio = std::sqrt(mse[n] / mse[n + 1]);
        const double ratio_se = 0.5 * ratio * std::hypot(mse_se[n] / mse[n], mse_se[n + 1] / mse[n + 1]);
        EXPECT_NEAR(ratio, 2.0, 5.0 * ratio_se) << "RMS ratio between t = " << (4 << (2 * n)) << " and 4t";
        std::printf("  RMS error ratio t = %d -> %d: %.3f +- %.3f (expected 2)\n", 4 << (2 * n), 16 << (2 * n),
                    ratio, ratio_se);
    }
}

TEST(GumbelAttention, MedianOfMeansErrorQuantileShrinksAsGroupsGrow) {
    // r = 5 groups of t samples, t = 2, 8, 32: the 90% quantile of |O^ - O| over elements
    // and seeds must fall with t (asymptotically by 2 per 4x). The standard error of each
    // quantile comes from 10 independent batches of seeds; the drop must exceed 5 of them.
    const ForwardProblem fp;
    const int batches = 10, seeds_per_batch = 40, groups = 5;
    std::vector<double> q90_mean, q90_se;
    for (int t : {2, 8, 32}) {
        std::vector<double> q90(batches);
        for (int bt = 0; bt < batches; bt++) {
            std::vector<double> err;
            for (int s = 0; s < seeds_per_batch; s++) {
                const std::vector<float> out = fp.run(groups, t, 90000 + 1000 * t + bt * seeds_per_batch + s);
                for (size_t n = 0; n < out.size(); n++) err.push_back(std::fabs((double)out[n] - fp.exact_out[n]));
            }
            std::nth_element(err.begin(), err.begin() + (long)(0.9 * err.size()), err.end());
            q90[bt] = err[(size_t)(0.9 * err.size())];
        }
        double mean, se;
        mean_and_stderr(q90, &mean, &se);
        q90_mean.push_back(mean);
        q90_se.push_back(se);
        std::printf("  r = %d, t = %2d: 90%% error quantile %.4f +- %.4f\n", groups, t, mean, se);
    }
    for (int n = 0; n + 1 < 3; n++)
        EXPECT_GT(q90_mean[n] - q90_mean[n + 1], 5.0 * std::hypot(q90_se[n], q90_se[n + 1]))
            << "quantile did not shrink from t = " << (2 << (2 * n)) << " to 4t";
}

TEST(GumbelAttention, SameSeedGivesIdenticalOutputAndOtherSeedsDiffer) {
    const ForwardProblem fp;
    GumbelStats a_stats, b_stats;
    const std::vector<float> a = fp.run(3, 4, 42, &a_stats), b = fp.run(3, 4, 42, &b_stats);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    EXPECT_EQ(a_stats.exceeders, b_stats.exceeders);
    EXPECT_EQ(a_stats.samples, (long long)fp.B * fp.NH * fp.T * 3 * 4) << "every sample is counted";
    const std::vector<float> other_seed = fp.run(3, 4, 43), other_step = fp.run(3, 4, 42, nullptr, 1);
    EXPECT_NE(std::memcmp(a.data(), other_seed.data(), a.size() * sizeof(float)), 0);
    EXPECT_NE(std::memcmp(a.data(), other_step.data(), a.size() * sizeof(float)), 0);
    // row 0 has one key: its output is v_0 whatever the seed
    for (int h = 0; h < fp.NH; h++)
        for (int c = 0; c < fp.C / fp.NH; c++)
            EXPECT_EQ(other_seed[h * (fp.C / fp.NH) + c], fp.qkv[2 * fp.C + h * (fp.C / fp.NH) + c]);
}

// Row b draws as global batch row batch0 + b (kernels/common/draws.h): a batch of 4
// sequences and its halves at batch0 = 0 and 2 give the same output, bit for bit, and
// the first half at batch0 = 2 draws other samples than at batch0 = 0.
TEST(GumbelAttention, BatchSplitAtItsGlobalRowsGivesTheSameOutput) {
    const ForwardProblem fp(4);
    const std::vector<float> whole = fp.run(3, 4, 42, nullptr, 5);
    std::vector<float> halves = fp.run_rows(0, 2, 0, 3, 4, 42, nullptr, 5);
    const std::vector<float> second = fp.run_rows(2, 2, 2, 3, 4, 42, nullptr, 5);
    halves.insert(halves.end(), second.begin(), second.end());
    ASSERT_EQ(halves.size(), whole.size());
    EXPECT_EQ(std::memcmp(halves.data(), whole.data(), whole.size() * sizeof(float)), 0);
    const std::vector<float> moved = fp.run_rows(0, 2, 2, 3, 4, 42, nullptr, 5);
    EXPECT_NE(std::memcmp(moved.data(), whole.data(), moved.size() * sizeof(float)), 0);
}

// sampler_log.h against glibc: within 2 ulps of log (glibc's own error is below 1) on
// positive normals and subnormals, and of log1p on (-1, 0] (near 0 and near -1) and on
// positive values; exact at 1 and 0; the same bits one by one and in a vector loop.
TEST(SamplerLog, WithinTwoUlpsOfGlibc) {
    std::mt19937_64 gen(3);
    auto ulps = [](double a, double b) {
        return a == b ? 0.0 : std::fabs(a - b) / std::fabs(std::nextafter(b, INFINITY) - b);
    };
    double worst_log = 0.0, worst_log1p = 0.0;
    std::vector<double> xs, ys;
    for (int n = 0; n < 1000000; n++) {
        uint64_t bits = gen() & 0x7FEFFFFFFFFFFFFFull;              // any positive finite
        if (n % 4 == 0) bits = (gen() >> 12) | 0x3FE0000000000000ull;  // [1/2, 1): uniforms
        if (n % 4 == 1) bits = gen() >> 12;                           // subnormal
        double x;
        std::memcpy(&x, &bits, sizeof x);
        if (x == 0.0) continue;
        xs.push_back(x);
        worst_log = std::max(worst_log, ulps(knngpt::sampler_log(x), std::log(x)));
        double y = -std::ldexp((double)(gen() >> 11), -53);  // (-1, 0]
        if (n % 3 == 0) y = std::ldexp(y, -(int)(gen() % 1100));
        if (n % 7 == 0) y = std::ldexp((double)(gen() >> 11), -53 + (int)(gen() % 60));  // positive
        if (!(y > -1.0)) continue;
        ys.push_back(y);
        worst_log1p = std::max(worst_log1p, ulps(knngpt::sampler_log1p(y), std::log1p(y)));
    }
    EXPECT_LE(worst_log, 2.0);
    EXPECT_LE(worst_log1p, 2.0);
    EXPECT_EQ(knngpt::sampler_log(1.0), 0.0);
    EXPECT_EQ(knngpt::sampler_log1p(0.0), 0.0);
    EXPECT_EQ(knngpt::sampler_log1p(1e-300), 1e-300);
    knngpt_test::expect_vector_loop_matches_scalar([](double x) { return knngpt::sampler_log(x); }, xs);
    std::printf("  largest error against glibc: log %.2f ulp, log1p %.2f ulp (%zu and %zu inputs)\n", worst_log,
                worst_log1p, xs.size(), ys.size());
}
