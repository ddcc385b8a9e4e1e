// tests/test_sampled_grad.cpp — sampled estimators of the exact-attention gradients
// (kernels/cpu/sampled_grad.h, ALGORITHMS.md §5.4).
//
// The reference is attention_backward (kernels/cpu/attention.h) given the same dout and
// the exact out. Every bound is a z bound at 5 standard errors from the measured
// variance. With up to 768 elements per check and about 20 checks, the chance that a
// correct estimator trips a 5-sigma bound somewhere is about 768 * 20 * 5.7e-7 = 1%
// under normality; the fixed seeds make the outcome reproducible, and 5 sigma stays
// adequate up to ~1e5 elements.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/attention_test_util.h"
#include "kernels/common/rng.h"
#include "kernels/common/sampler_exp.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/sampled_grad.h"
#include "tests/test_util.h"

using namespace knngpt;
using namespace knngpt::cpu;

using knngpt_test::naive_causal_topk;
using knngpt_test::mean_and_stderr;
using knngpt_test::RunningMoments;

namespace {


// One estimator configuration: where J ~ P_i comes from, and which dV estimator.
struct Config {
    GradSampleSource source;
    bool signed_start_dv;
    std::string name() const {
        return std::string(source == GradSampleSource::ExactRow ? "ExactRow" : "LazyGumbel") +
               (signed_start_dv ? " + signed-start dV" : " row-wise");
    }
};
const Config kConfigs[] = {
    {GradSampleSource::ExactRow, false},
    {GradSampleSource::LazyGumbel, false},
    {GradSampleSource::ExactRow, true},
    {GradSampleSource::LazyGumbel, true},
};

// B = 2, T = 16, NH = 2, HS = 4; queries scaled by 2 so the rows are far from uniform.
struct GradProblem {
    int B = 2, T = 16, C = 8, NH = 2, k = 4;
    std::vector<float> qkv, out, lse, dout, exact_dqkv;
    std::vector<int> topk;
    GradProblem() {
        Rng rng(2024);
        qkv.resize((size_t)B * T * 3 * C);
        for (size_t n = 0; n < qkv.size(); n++)
            qkv[n] = ((n % (3 * C)) < (size_t)C ? 2.0f : 1.0f) * (2.0f * rng.uniform() - 1.0f);
        dout.resize((size_t)B * T * C);
        for (float& x : dout) x = 2.0f * rng.uniform() - 1.0f;
        out.assign((size_t)B * T * C, 0.0f);
        lse.assign((size_t)B * NH * T, 0.0f);
        attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
        exact_dqkv.assign(qkv.size(), 0.0f);
        attention_backward(exact_dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
        topk = naive_causal_topk(qkv, {B, T, C, NH}, k);
    }
    size_t size() const { return qkv.size(); }
    std::vector<float> run(const Config& cfg, int samples, uint64_t seed, GumbelStats* stats = nullptr) const {
        return run_rows(0, B, 0, cfg, samples, seed, stats);
    }
    // the backward on batch rows first..first + count - 1 alone, as global rows batch0..
    std::vector<float> run_rows(int first, int count, int batch0, const Config& cfg, int samples, uint64_t seed,
                                GumbelStats* stats = nullptr) const {
        std::vector<float> dqkv((size_t)count * T * 3 * C, 0.0f);
        const size_t rows = (size_t)first * T;  // (b, t) rows before the first
        sampled_attention_backward(dqkv.data(), dout.data() + rows * C, qkv.data() + rows * 3 * C,
                                   out.data() + rows * C, topk.data() + (size_t)first * NH * T * k, k, count, T, C, NH,
                                   samples, cfg.source, cfg.signed_start_dv, seed, 5, 1, batch0, stats);
        return dqkv;
    }
    // which gradient an element of dqkv belongs to: 0 dQ, 1 dK, 2 dV
    int part(size_t e) const { return (int)((e % (3 * C)) / C); }
    double max_abs_exact() const {
        double m = 0.0;
        for (float x : exact_dqkv) m = std::max(m, (double)std::fabs(x));
        return m;
    }
};

// fp32 rounding allowance for entries whose estimate is (nearly) deterministic, e.g. dQ
// of row 0 whose only key is key 0: far below every statistical bound elsewhere.
double rounding_allowance(const GradProblem& gp) { return 1e-5 * gp.max_abs_exact(); }

const char* kPartNames[3] = {"dQ", "dK", "dV"};

}  // namespace

// sampler_exp.h against the x87 exp (64-bit mantissa): within 2 ulps over its whole
// range and densely on (-40, 0], where a softmax row's weights live; exact at 0; 0
// below -708; NaN stays NaN; the same bits one by one and in a vector loop.
TEST(SamplerExp, WithinTwoUlpsOfLongDoubleExp) {
    std::mt19937_64 gen(4);
    std::vector<double> xs;
    for (int n = 0; n < 1000000; n++)
        xs.push_back(n % 2 ? -40.0 * std::ldexp((double)(gen() >> 11), -53)
                           : -708.0 + 1417.0 * std::ldexp((double)(gen() >> 11), -53));
    long double worst = 0.0L;
    for (double x : xs) {
        const long double expected = std::exp((long double)x);
        const long double ulp = std::ldexp(1.0L, std::ilogb((double)expected) - 52);
        worst = std::max(worst, std::fabs((long double)knngpt::sampler_exp(x) - expected) / ulp);
    }
    EXPECT_LE((double)worst, 2.0);
    std::printf("sampler_exp: largest error %.2f ulp\n", (double)worst);
    EXPECT_EQ(knngpt::sampler_exp(0.0), 1.0);
    EXPECT_EQ(knngpt::sampler_exp(-709.0), 0.0);
    EXPECT_EQ(knngpt::sampler_exp(-INFINITY), 0.0);
    EXPECT_TRUE(std::isnan(knngpt::sampler_exp(NAN)));
    knngpt_test::expect_vector_loop_matches_scalar([](double x) { return knngpt::sampler_exp(x); }, xs);
}

TEST(SampledGrad, BranchlessUpperBoundEqualsStdUpperBound) {
    // sorted arrays of every length to 70 and some long ones, with runs of equal values,
    // probed below, above, at and between every element
    std::mt19937_64 rng(11);
    for (int n = 1; n < 600; n += n < 70 ? 1 : 37) {
        std::vector<double> a(n);
        double v = 0.0;
        for (double& x : a) x = (v += (rng() % 3 == 0) ? 0.0 : 0.5 + (double)(rng() % 8));
        std::vector<double> probes = {-1.0, a.back() + 1.0};
        for (double x : a) probes.insert(probes.end(), {x, x - 0.25, x + 0.25});
        for (double x : probes)
            ASSERT_EQ(upper_bound_branchless(a.data(), n, x), (int)(std::upper_bound(a.begin(), a.end(), x) - a.begin()))
                << "n " << n << " x " << x;
    }
}

TEST(SampledGrad, MeansOverSeedsMatchExactGradients) {
    // s = 4 samples per row, 1000 seeds per configuration; z <= 5 per element of dqkv
    const GradProblem gp;
    const int seeds = 1000, s = 4;
    const double allowance = rounding_allowance(gp);
    for (const Config& cfg : kConfigs) {
        RunningMoments m(gp.size());
        for (int seed = 0; seed < seeds; seed++) m.add(gp.run(cfg, s, 1000 + seed));
        double worst_z[3] = {0, 0, 0};
        for (size_t e = 0; e < gp.size(); e++) {
            const double diff = std::fabs(m.mean(e) - gp.exact_dqkv[e]);
            const double se = m.stderr_of_mean(e);
            EXPECT_LE(diff, 5.0 * se + allowance) << cfg.name() << ": " << kPartNames[gp.part(e)] << " element " << e
                                                  << " mean " << m.mean(e) << " exact " << gp.exact_dqkv[e];
            if (se > allowance) worst_z[gp.part(e)] = std::max(worst_z[gp.part(e)], diff / se);
        }
        std::printf("  %-32s largest |z|: dQ %.2f, dK %.2f, dV %.2f (%zu elements)\n", cfg.name().c_str(),
                    worst_z[0], worst_z[1], worst_z[2], gp.size());
    }
}

TEST(SampledGrad, RmsErrorFallsAsOneOverSqrtSamples) {
    // Samples (and walks) are independent, so E|g_s - g|^2 = (variance of one sample) / s
    // exactly: the RMS ratio between s and 4s is 2 for dQ, dK and dV. The bound is 5
    // standard errors of the measured ratio (delta method; disjoint seeds per s).
    const GradProblem gp;
    const int seeds = 200;
    const int sample_counts[3] = {4, 16, 64};
    for (const Config& cfg : kConfigs) {
        double mse[3][3], mse_se[3][3];  // [s][part]
        for (int n = 0; n < 3; n++) {
            std::vector<double> err[3];
            for (int seed = 0; seed < seeds; seed++) {
                const std::vector<float> g = gp.run(cfg, sample_counts[n], 50000 + 1000 * n + seed);
                double e[3] = {0, 0, 0};
                for (size_t x = 0; x < g.size(); x++) e[gp.part(x)] += std::pow((double)g[x] - gp.exact_dqkv[x], 2);
                for (int p = 0; p < 3; p++) err[p].push_back(e[p]);
            }
            for (int p = 0; p < 3; p++) mean_and_stderr(err[p], &mse[n][p], &mse_se[n][p]);
        }
        for (int p = 0; p < 3; p++) {
            std::printf("  %-32s %s RMS ratios:", cfg.name().c_str(), kPartNames[p]);
            for (int n = 0; n + 1 < 3; n++) {
                const double ratio = std::sqrt(mse[n][p] / mse[n + 1][p]);
                const double ratio_se =
                    0.5 * ratio * std::hypot(mse_se[n][p] / mse[n][p], mse_se[n + 1][p] / mse[n + 1][p]);
                EXPECT_NEAR(ratio, 2.0, 5.0 * ratio_se) << cfg.name() << " " << kPartNames[p] << ": s = "
                                                        << sample_counts[n] << " -> " << sample_counts[n + 1];
                std::printf(" %d->%d %.3f +- %.3f", sample_counts[n], sample_counts[n + 1], ratio, ratio_se);
            }
            std::printf("\n");
        }
    }
}

TEST(SampledGrad, VeryLargeSampleCountsApproachExactGradients) {
    // With s = 16384 each element's error has standard deviation sd_1 / sqrt(s), sd_1 the
    // one-sample deviation measured from 200 runs at s = 4 (sd_4 * 2). Bound: 5 of those,
    // plus the fp32 rounding allowance.
    const GradProblem gp;
    const int s_small = 4, s_large = 16384, seeds = 200;
    const double allowance = rounding_allowance(gp);
    for (const Config& cfg : kConfigs) {
        if (cfg.source == GradSampleSource::LazyGumbel && cfg.signed_start_dv) continue;  // covered by the others
        RunningMoments m(gp.size());
        for (int seed = 0; seed < seeds; seed++) m.add(gp.run(cfg, s_small, 70000 + seed));
        const std::vector<float> g = gp.run(cfg, s_large, 99);
        double worst_z = 0.0;
        for (size_t e = 0; e < gp.size(); e++) {
            const double sd_large = m.sd(e) * std::sqrt((double)s_small / s_large);
            const double diff = std::fabs((double)g[e] - gp.exact_dqkv[e]);
            EXPECT_LE(diff, 5.0 * sd_large + allowance) << cfg.name() << ": " << kPartNames[gp.part(e)]
                                                        << " element " << e;
            if (sd_large > allowance) worst_z = std::max(worst_z, diff / sd_large);
        }
        const double rel = knngpt_test::max_rel_error(g.data(), gp.exact_dqkv.data(), gp.size());
        std::printf("  %-32s s = %d: max relative error %.4f, largest |z| %.2f\n", cfg.name().c_str(), s_large, rel,
                    worst_z);
    }
}

TEST(SampledGrad, SameSeedIsIdenticalAndOtherSeedsDiffer) {
    const GradProblem gp;
    for (const Config& cfg : kConfigs) {
        GumbelStats a_stats, b_stats;
        const std::vector<float> a = gp.run(cfg, 8, 7, &a_stats), b = gp.run(cfg, 8, 7, &b_stats);
        const std::vector<float> c = gp.run(cfg, 8, 8);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << cfg.name();
        EXPECT_NE(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0) << cfg.name();
        EXPECT_EQ(a_stats.samples, b_stats.samples);
        EXPECT_EQ(a_stats.exceeders, b_stats.exceeders);
        EXPECT_GE(a_stats.samples, (long long)gp.B * gp.NH * gp.T * 8) << "every row draws at least s samples";
        if (cfg.source == GradSampleSource::ExactRow) {
            EXPECT_EQ(a_stats.exceeders, 0);
        }
    }
}

TEST(SampledGrad, AccumulatesIntoDqkv) {
    const GradProblem gp;
    const Config cfg = kConfigs[1];
    const std::vector<float> fresh = gp.run(cfg, 4, 3);
    std::vector<float> dqkv(gp.size(), 1.0f);
    sampled_attention_backward(dqkv.data(), gp.dout.data(), gp.qkv.data(), gp.out.data(), gp.topk.data(), gp.k, gp.B,
                               gp.T, gp.C, gp.NH, 4, cfg.source, cfg.signed_start_dv, 3, 5, 1, 0);
    for (size_t e = 0; e < gp.size(); e++) ASSERT_FLOAT_EQ(dqkv[e], 1.0f + fresh[e]) << "element " << e;
}

TEST(SampledGrad, ExactRowSourceNeedsNoTopkList) {
    const GradProblem gp;
    std::vector<float> with_list = gp.run(kConfigs[0], 4, 11), without(gp.size(), 0.0f);
    sampled_attention_backward(without.data(), gp.dout.data(), gp.qkv.data(), gp.out.data(), nullptr, 0, gp.B, gp.T,
                               gp.C, gp.NH, 4, GradSampleSource::ExactRow, false, 11, 5, 1, 0);
    EXPECT_EQ(std::memcmp(with_list.data(), without.data(), without.size() * sizeof(float)), 0);
}

// Row b draws as global batch row batch0 + b (kernels/common/draws.h), its row samples
// and, with signed-start dV, its walk starts, which run down the T rows of one (b, h)
// and never mix batch rows. So for every configuration a batch of 2 sequences and its
// rows alone at batch0 = 0 and 1 give the same dqkv, bit for bit (the CPU sums each
// head in its own order), and row 0 alone at batch0 = 1 draws other samples.
TEST(SampledGrad, BatchSplitAtItsGlobalRowsGivesTheSameGradients) {
    const GradProblem gp;
    ASSERT_EQ(gp.B, 2);
    for (const Config& cfg : kConfigs) {
        const std::vector<float> whole = gp.run(cfg, 4, 3);
        std::vector<float> split = gp.run_rows(0, 1, 0, cfg, 4, 3);
        const std::vector<float> second = gp.run_rows(1, 1, 1, cfg, 4, 3);
        split.insert(split.end(), second.begin(), second.end());
        ASSERT_EQ(split.size(), whole.size());
        EXPECT_EQ(std::memcmp(split.data(), whole.data(), whole.size() * sizeof(float)), 0) << cfg.name();
        const std::vector<float> moved = gp.run_rows(0, 1, 1, cfg, 4, 3);
        EXPECT_NE(std::memcmp(moved.data(), whole.data(), moved.size() * sizeof(float)), 0) << cfg.name();
    }
}
