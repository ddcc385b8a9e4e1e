// tests/test_draw_margin.cpp — the samplers report every comparison that decides a
// draw (DrawMargin, kernels/common/draws.h), so that "a draw whose margin clears
// kDrawMarginOfAgreement is the same on every device" holds.
//
// How: this file gives the shared samplers its own exp, log, log1p and expm1 (declared
// in namespace knngpt before the sampler headers, so the samplers' unqualified calls
// find them; the exact-row weights' row_weight_exp in knngpt::cpu, which hides the
// header's vectorised default), which return glibc's value times (1 +- eta), the sign drawn per call:
// a stand-in for another device's libm, eta times larger than any real one. Then
// every draw is made twice, exactly and perturbed; a draw that changed must have
// had a margin below kSlack * eta. A comparison the margin misses, or an error
// magnification it does not account for, would show as a changed draw with a
// larger margin. eta is chosen large enough that dozens of draws change, so the
// check is not vacuous.
//
// Slack: the margins carry each comparison's scale and the magnification of its
// ill-conditioned steps, not small constant factors. A perturbation of eta in each
// of the (at most two) functions a quantity passes through moves it by up to
// eta (1 + |value|) (g = -log(-log u) moves by eta + eta |g|), and both sides of a
// comparison move, so a gap can shrink by up to ~4 eta times the scale, a little
// more through p and the truncated Gumbel: measured, the changed draws had margins
// up to 6.4 eta. kSlack = 16; a comparison the margin misses shows as a changed
// draw with a margin of many times eta, usually an infinite one.
#include <cmath>
#include <cstdint>

namespace knngpt_test {
inline double perturbation = 0.0;     // eta; 0: glibc's values
inline uint64_t perturbation_state = 1;
inline double perturb(double v) {
    if (perturbation == 0.0) return v;
    perturbation_state ^= perturbation_state << 13, perturbation_state ^= perturbation_state >> 7,
        perturbation_state ^= perturbation_state << 17;
    return v * (1.0 + ((perturbation_state >> 63) ? perturbation : -perturbation));
}
}  // namespace knngpt_test

namespace knngpt {
inline double exp(double x) { return knngpt_test::perturb(std::exp(x)); }
inline double log(double x) { return knngpt_test::perturb(std::log(x)); }
inline double log1p(double x) { return knngpt_test::perturb(std::log1p(x)); }
inline double expm1(double x) { return knngpt_test::perturb(std::expm1(x)); }
}  // namespace knngpt
namespace knngpt::cpu {  // the exact-row weights' exp (kernels/cpu/sampled_grad.h)
inline double row_weight_exp(double x) { return knngpt::exp(x); }
}  // namespace knngpt::cpu

#include "kernels/common/draws.h"
#include "kernels/cpu/gumbel_attention.h"
#include "kernels/cpu/sampled_grad.h"
#include "tests/attention_test_util.h"
#include "tests/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

using knngpt::DrawMargin;
using knngpt::DrawSite;
using knngpt_test::attention_qkv;
using knngpt_test::brute_topk;
using Shape = knngpt_test::AttentionShape;
using std::vector;

namespace {

constexpr double kSlack = 16.0;

struct Outcome {
    int changed = 0;          // draws the perturbation changed
    double worst_ratio = 0.0;  // the largest margin / eta among them
};

void record(Outcome& o, bool changed, double margin, double eta) {
    if (!changed) return;
    o.changed++;
    o.worst_ratio = std::max(o.worst_ratio, margin / eta);
}

// Lazy Gumbel samples of head 0 of batch 0 (sample numbers 0..numbers-1 of every row),
// exact and perturbed, with the default exceeder cap and with a cap of 0 (the dense
// fallback).
Outcome lazy_gumbel_outcome(const vector<float>& qkv, const Shape& s, int k, int numbers, int cap, double eta) {
    const int HS = s.HS(), C3 = 3 * s.C;
    const float tau = knngpt::attention_tau(HS);
    const vector<int> topk = brute_topk(qkv, s, k);
    Outcome o;
    for (int i = 0; i < s.T; i++) {
        const int* row_topk = topk.data() + (size_t)i * k;
        int head = 0;
        while (head < k && row_topk[head] >= 0) head++;
        const int max_exceeders = cap >= 0 ? cap : knngpt::lazy_gumbel_default_max_exceeders(i + 1 - head, head);
        const DrawSite site = knngpt::row_draw_site(5, 2, 1, s.NH, 0, 0, s.T, i);
        for (int n = 0; n < numbers; n++) {
            auto draw = [&](DrawMargin* margin, int* x, bool* fb) {
                return knngpt::cpu::lazy_gumbel_sample(qkv.data() + (size_t)i * C3, qkv.data() + s.C, C3, HS, tau,
                                                       i + 1, row_topk, k, site, (uint32_t)n, max_exceeders, x, fb,
                                                       margin);
            };
            DrawMargin margin;
            int x0 = 0, x1 = 0;
            bool fb0 = false, fb1 = false;
            knngpt_test::perturbation = 0.0;
            const int exact = draw(&margin, &x0, &fb0);
            knngpt_test::perturbation = eta;
            const int perturbed = draw(nullptr, &x1, &fb1);
            knngpt_test::perturbation = 0.0;
            record(o, exact != perturbed || x0 != x1 || fb0 != fb1, margin.smallest, eta);
        }
    }
    return o;
}

TEST(DrawMargin, LazyGumbelRecordsEveryDecidingComparison) {
    const Shape s{1, 60, 32, 2};
    vector<float> qkv = attention_qkv(s, 61);
    // flat rows (small queries): long tails, many exceeders and skips
    for (size_t n = 0; n < qkv.size(); n++)
        if (n % (3 * s.C) < (size_t)s.C) qkv[n] *= 0.1f;
    const double eta = 1e-3;
    int changed = 0;
    for (int k : {1, 4})
        for (int cap : {-1, 0}) {
            const Outcome o = lazy_gumbel_outcome(qkv, s, k, 64, cap, eta);
            EXPECT_LT(o.worst_ratio, kSlack) << "k " << k << " cap " << cap << ": a draw changed by a perturbation of "
                                             << eta << " had a margin of " << o.worst_ratio << " times that";
            std::printf("lazy Gumbel k %d cap %d: %d draws changed, largest margin %.2f eta\n", k, cap, o.changed,
                        o.worst_ratio);
            changed += o.changed;
        }
    EXPECT_GT(changed, 20) << "too few draws changed for the check to mean anything";
}

// Exact-row backward samples (sampled_grad_row_samples: inverse CDF over fp64 sums of
// exp weights) of every row of head 0, s per row, exact and perturbed. Each pick's own
// margin comes from sampled_grad_pick on the row's exact sums.
TEST(DrawMargin, ExactRowPickRecordsEveryDecidingComparison) {
    const Shape s{1, 80, 32, 2};
    const vector<float> qkv = attention_qkv(s, 62);
    const int HS = s.HS(), C3 = 3 * s.C, samples = 128;
    const float tau = knngpt::attention_tau(HS);
    const double eta = 1e-3;
    vector<double> cdf(s.T), row_cdf(s.T);
    vector<int> exact(samples), perturbed(samples);
    long long exceeders = 0, fallbacks = 0;
    Outcome o;
    for (int i = 0; i < s.T; i++) {
        const float* q_i = qkv.data() + (size_t)i * C3;
        const float* keys = qkv.data() + s.C;
        const DrawSite site = knngpt::row_draw_site(9, 4, 0, s.NH, 0, 0, s.T, i);
        auto draw = [&](vector<int>& J) {
            knngpt::cpu::sampled_grad_row_samples(J.data(), samples, knngpt::GradSampleSource::ExactRow, q_i, keys, C3,
                                                  HS, tau, i + 1, nullptr, 0, site, cdf.data(), &exceeders, &fallbacks);
        };
        knngpt_test::perturbation = 0.0;
        draw(exact);
        knngpt_test::perturbation = eta;
        draw(perturbed);
        knngpt_test::perturbation = 0.0;
        // the row's exact sums, as the sampler forms them
        knngpt::cpu::sampled_grad_exact_row_cdf(row_cdf.data(), q_i, keys, C3, HS, tau, i + 1);
        for (int m = 0; m < samples; m++) {
            const knngpt::Philox4 w = knngpt::philox_draw(site, knngpt::DRAW_GRADIENT_SAMPLE, (uint32_t)m);
            DrawMargin margin;
            const int J = knngpt::cpu::sampled_grad_pick(row_cdf.data(), i + 1,
                                                         knngpt::uniform_open01_f64(w.x[0], w.x[1]), &margin);
            ASSERT_EQ(J, exact[m]) << "row " << i << " sample " << m;
            record(o, exact[m] != perturbed[m], margin.smallest, eta);
        }
    }
    EXPECT_LT(o.worst_ratio, kSlack) << "a pick changed by a perturbation of " << eta << " had a margin of "
                                     << o.worst_ratio << " times that";
    std::printf("exact-row picks: %d of %d changed, largest margin %.2f eta\n", o.changed, s.T * samples,
                o.worst_ratio);
    EXPECT_GT(o.changed, 20) << "too few picks changed for the check to mean anything";
}

}  // namespace
