// tests/test_philox.cpp — Philox4x32-10 against the published known-answer
// vectors (Random123's kat_vectors), and the properties of the draw helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kernels/common/draws.h"

using namespace knngpt;

TEST(Philox, MatchesPublishedKnownAnswerVectors) {
    struct Kat { Philox4 ctr; uint32_t k0, k1; Philox4 want; };
    const Kat kats[] = {
        {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
        {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
         {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
        {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
         {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
    };
    for (const Kat& k : kats) {
        Philox4 got = philox4x32_10(k.ctr, k.k0, k.k1);
        for (int i = 0; i < 4; i++) EXPECT_EQ(got.x[i], k.want.x[i]) << "word " << i;
    }
}

TEST(Philox, DrawsArePureFunctionsOfSeedSiteAndIndex) {
    DrawSite site{42, 7, 3, 100};
    Philox4 a = philox_draw(site, DRAW_TAIL_POSITION, 5), b = philox_draw(site, DRAW_TAIL_POSITION, 5);
    for (int i = 0; i < 4; i++) EXPECT_EQ(a.x[i], b.x[i]);
    // each coordinate of the site, the purpose and the index changes the draw
    std::set<uint32_t> words = {a.x[0]};
    DrawSite other_seed = site, other_step = site, other_head = site, other_query = site;
    other_seed.seed = 43, other_step.step = 8, other_head.layer_head = 4, other_query.batch_query = 101;
    for (const DrawSite& s : {other_seed, other_step, other_head, other_query})
        words.insert(philox_draw(s, DRAW_TAIL_POSITION, 5).x[0]);
    words.insert(philox_draw(site, DRAW_HEAD_GUMBEL, 5).x[0]);
    words.insert(philox_draw(site, DRAW_TAIL_POSITION, 6).x[0]);
    EXPECT_EQ(words.size(), 7u);
    // the seed's high half is part of the key
    DrawSite high = site;
    high.seed = 42 + (1ull << 32);
    EXPECT_NE(philox_draw(high, DRAW_TAIL_POSITION, 5).x[0], a.x[0]);
}

// The counter's step and rows: the training step is the optimizer step whatever the
// micro-batch, and micro-batch m of rank r of W (B rows each) starts at global row
// (m W + r) B, so W ranks, one process of W B rows and W micro-batches of B rows lay
// out the same rows; rows up to 2^32 - 1 are counted in unsigned arithmetic.
TEST(Philox, DrawStepAndGlobalRowsOfTheCounter) {
    EXPECT_EQ(training_draw_step(0), 0u);
    EXPECT_EQ(training_draw_step(12345), 12345u);
    EXPECT_EQ(draw_batch0(0, 1, 0, 4), 0);
    EXPECT_EQ(draw_batch0(0, 4, 3, 8), 24);   // rank 3 of 4: rows 24..31
    EXPECT_EQ(draw_batch0(1, 4, 0, 8), 32);   // the next micro-batch starts after all ranks
    EXPECT_EQ(draw_batch0(3, 1, 0, 8), 24);   // 4 micro-batches of one process = 4 ranks
    EXPECT_EQ(draw_batch0(2, 2, 1, 3), 15);
    EXPECT_TRUE(draw_rows_fit(1ll << 22, 1024));        // (batch0 + B) T = 2^32: rows up to 2^32 - 1
    EXPECT_FALSE(draw_rows_fit((1ll << 22) + 1, 1024));
    EXPECT_FALSE(draw_rows_fit(1ll << 31, 1));           // batch0 is an int
    EXPECT_FALSE(draw_rows_fit(-1, 8));
    EXPECT_EQ(row_draw_site(1, 2, 0, 1, 0, 5, 16, 3).batch_query, 5u * 16 + 3);
    EXPECT_EQ(head_draw_site(1, 2, 0, 1, 0, 5, 16).batch_query, 5u * 16);
    // the last row that fits: (2^22 - 1) 1024 + 1023 = 2^32 - 1, past int
    EXPECT_EQ(row_draw_site(1, 2, 0, 1, 0, (1 << 22) - 1, 1024, 1023).batch_query, 0xFFFFFFFFu);
}

TEST(Philox, UniformsStayInsideTheOpenIntervalAndHaveTheRightMoments) {
    EXPECT_GT(uniform_open01(0u), 0.0f);
    EXPECT_LT(uniform_open01(0xffffffffu), 1.0f);
    EXPECT_GT(uniform_open01_f64(0u, 0u), 0.0);
    EXPECT_LT(uniform_open01_f64(0xffffffffu, 0xffffffffu), 1.0);
    EXPECT_EQ(uniform_below(0xffffffffu, 10), 9u);
    EXPECT_EQ(uniform_below(0u, 10), 0u);
    // mean 1/2 and variance 1/12 over 200000 draws, within 5 standard errors
    const int n = 200000;
    double sum = 0, sum2 = 0;
    int counts[10] = {0};
    DrawSite site{1, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        Philox4 d = philox_draw(site, DRAW_GRADIENT_SAMPLE, (uint32_t)i);
        double u = uniform_open01(d.x[0]);
        sum += u, sum2 += u * u;
        counts[uniform_below(d.x[1], 10)]++;
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
    EXPECT_NEAR(var, 1.0 / 12, 5 * std::sqrt(1.0 / 180 / n));  // var of u^2-ish bound, generous
    // chi-square of the 10 bins (9 degrees of freedom; 99.9 % quantile 27.88)
    double chi2 = 0;
    for (int c : counts) chi2 += (c - n / 10.0) * (c - n / 10.0) / (n / 10.0);
    EXPECT_LT(chi2, 27.88);
}

// DrawMargin keeps the smallest relative gap of the comparisons it saw, and how close
// a floor's argument came to an integer; comparisons against -inf (the start of a
// running max) and floors of inf never count.
TEST(DrawMargin, KeepsTheClosestComparison) {
    knngpt::DrawMargin margin;
    EXPECT_EQ(margin.smallest, INFINITY);
    margin.compare(0.25, -INFINITY);
    margin.floor_of(INFINITY);
    EXPECT_EQ(margin.smallest, INFINITY);
    margin.compare(3.0, 2.5);  // gap 0.5 at scale 3
    EXPECT_DOUBLE_EQ(margin.smallest, 0.5 / 3.0);
    margin.compare(1e-3, 1e-3 + 1e-9);  // below scale 1: the absolute gap
    EXPECT_NEAR(margin.smallest, 1e-9, 1e-15);
    margin.compare(8.0, 7.0);  // a wider gap leaves it
    EXPECT_NEAR(margin.smallest, 1e-9, 1e-15);
    knngpt::DrawMargin skip;
    skip.floor_of(41.9999999);  // 1e-7 below 42, at scale 42
    EXPECT_NEAR(skip.smallest, 1e-7 / 41.9999999, 1e-15);
    skip.floor_of(5.5);
    EXPECT_NEAR(skip.smallest, 1e-7 / 41.9999999, 1e-15);
}
