// tests/test_topk_index.cpp — the causal top-k indexes of kernels/cpu/topk_index.h
// (ALGORITHMS.md §2.1, §6, §9.2).
//
// References written here:
//   - a full sort per row by (score desc, index asc), scores from attention_dot (the
//     score definition the indices share), so exact indices must match it exactly;
//   - attention_dot itself for the 8-lane panel routines, bit for bit per lane;
//   - on small-integer inputs every fp32 score is an exact integer, so there the
//     reference uses exact double dot products and ties are genuine;
//   - for the approximate indexes (heavy, ivf), brute force itself with every key a
//     candidate, causality as independence from the future keys, and a recall floor on
//     clustered keys; for ivf also its clusters and each row recomputed from their
//     definitions, and for its 2-means bisection the split of well-separated groups;
//   - for lsh, the candidate rule re-derived from the hash codes (lsh_codes), and
//     the hashing itself checked statistically: hyperplane entries standard
//     Gaussian, and SimHash's bit-collision probability 1 - angle / pi.
// Statistical checks use |mean - truth| <= 5 standard errors with the standard
// error measured from the samples.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "kernels/cpu/forced_keys.h"
#include "kernels/cpu/topk_index.h"
#include "tests/attention_test_util.h"
#include "tests/test_util.h"

using knngpt_test::naive_causal_topk;
using knngpt_test::reference_topk;
using knngpt_test::uniform;
using Shape = knngpt_test::AttentionShape;
using std::vector;
namespace cpu = knngpt::cpu;

namespace {

const float* query_of(const vector<float>& qkv, const Shape& s, int b, int h, int i) {
    return qkv.data() + ((size_t)b * s.T + i) * 3 * s.C + (size_t)h * s.HS();
}
const float* key_of(const vector<float>& qkv, const Shape& s, int b, int h, int j) {
    return query_of(qkv, s, b, h, j) + s.C;
}
float* query_of(vector<float>& qkv, const Shape& s, int b, int h, int i) {
    return qkv.data() + ((size_t)b * s.T + i) * 3 * s.C + (size_t)h * s.HS();
}
float* key_of(vector<float>& qkv, const Shape& s, int b, int h, int j) { return query_of(qkv, s, b, h, j) + s.C; }

vector<float> uniform_qkv(const Shape& s, unsigned seed) { return uniform(s.qkv_size(), seed); }

// entries in {-range..range}: every fp32 score is an exact integer, with many ties
vector<float> integer_qkv(const Shape& s, unsigned seed, int range) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> dist(-range, range);
    vector<float> qkv(s.qkv_size());
    for (auto& x : qkv) x = (float)dist(gen);
    return qkv;
}

// Keys from a Gaussian mixture: per (b, h), `components` means with N(0, 1)
// coordinates; key j = mean of its component + noise N(0, noise^2). Components come
// in runs of consecutive positions (lengths uniform in [run_min, run_max], like
// topics in a document) or, with run_max = 0, are drawn independently per position.
// Query i sits near the component of position i. component_of, if given, receives
// the component of every key, (B, NH, T).
vector<float> clustered_qkv(const Shape& s, unsigned seed, int components, int run_min, int run_max,
                            float noise = 0.3f, vector<int>* component_of = nullptr) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, components - 1);
    vector<float> qkv = uniform_qkv(s, seed + 1);  // v channels stay uniform
    const int HS = s.HS();
    if (component_of) component_of->assign((size_t)s.B * s.NH * s.T, -1);
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            vector<float> means((size_t)components * HS);
            for (auto& x : means) x = normal(gen);
            int component = 0, run_left = 0;
            for (int j = 0; j < s.T; j++) {
                if (run_max == 0) {
                    component = pick(gen);
                } else if (run_left == 0) {
                    component = pick(gen);
                    run_left = std::uniform_int_distribution<int>(run_min, run_max)(gen);
                }
                run_left--;
                if (component_of) (*component_of)[((size_t)b * s.NH + h) * s.T + j] = component;
                float* q = query_of(qkv, s, b, h, j);
                float* k = q + s.C;
                for (int d = 0; d < HS; d++) {
                    k[d] = means[(size_t)component * HS + d] + noise * normal(gen);
                    q[d] = means[(size_t)component * HS + d] + noise * normal(gen);
                }
            }
        }
    }
    return qkv;
}

// The attention benchmark's clustered inputs: per (b, h), `components` centres drawn
// N(0, I) and scaled to norm `radius`; key j = a random centre + noise N(0, noise^2),
// query i = another, independent random centre + noise. Every position draws its
// own components, so the clusters are interleaved along the sequence.
vector<float> sphere_mixture_qkv(const Shape& s, unsigned seed, int components, float radius, float noise) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, components - 1);
    vector<float> qkv = uniform_qkv(s, seed + 1);  // v channels stay uniform
    const int HS = s.HS();
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            vector<float> centres((size_t)components * HS);
            for (int c = 0; c < components; c++) {
                double norm2 = 0.0;
                for (int d = 0; d < HS; d++) {
                    centres[(size_t)c * HS + d] = normal(gen);
                    norm2 += (double)centres[(size_t)c * HS + d] * centres[(size_t)c * HS + d];
                }
                for (int d = 0; d < HS; d++) centres[(size_t)c * HS + d] *= (float)(radius / std::sqrt(norm2));
            }
            for (int j = 0; j < s.T; j++) {
                float* q = query_of(qkv, s, b, h, j);
                const float* key_centre = centres.data() + (size_t)pick(gen) * HS;
                const float* query_centre = centres.data() + (size_t)pick(gen) * HS;
                for (int d = 0; d < HS; d++) {
                    q[s.C + d] = key_centre[d] + noise * normal(gen);
                    q[d] = query_centre[d] + noise * normal(gen);
                }
            }
        }
    }
    return qkv;
}

vector<int> reference_topk_exact(const vector<float>& qkv, const Shape& s, int k) {
    return reference_topk(s, k, k, [&](int b, int h, int i, int j) {
        const float* q = query_of(qkv, s, b, h, i);
        const float* key = key_of(qkv, s, b, h, j);
        double dot = 0.0;
        for (int d = 0; d < s.HS(); d++) dot += (double)q[d] * key[d];
        return dot;
    });
}

vector<int> run_brute(const vector<float>& qkv, const Shape& s, int k, cpu::TopkStats* stats = nullptr) {
    vector<int> idx(s.idx_size(k), -7);
    cpu::causal_topk_brute(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, stats);
    return idx;
}
vector<int> run_brute_sgemm(const vector<float>& qkv, const Shape& s, int k, cpu::TopkStats* stats = nullptr) {
    vector<int> idx(s.idx_size(k), -7);
    cpu::causal_topk_brute_sgemm(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, stats);
    return idx;
}
vector<int> run_brute_reference(const vector<float>& qkv, const Shape& s, int k, cpu::TopkStats* stats = nullptr) {
    vector<int> idx(s.idx_size(k), -7);
    cpu::causal_topk_brute_reference(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, stats);
    return idx;
}
vector<int> run_int8(const vector<float>& qkv, const Shape& s, int k, cpu::TopkStats* stats = nullptr,
                     cpu::TopkInt8Kernel kernel = cpu::topk_int8_kernel()) {
    vector<int> idx(s.idx_size(k), -7);
    cpu::causal_topk_brute_fast<cpu::TopkInt8Pass>(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, stats, kernel);
    return idx;
}
vector<int> run_lsh(const vector<float>& qkv, const Shape& s, int k, const cpu::LshParams& p,
                    cpu::TopkStats* stats = nullptr) {
    vector<int> idx(s.idx_size(k), -7);
    cpu::causal_topk_lsh(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, p, stats);
    return idx;
}
vector<int> run_heavy(const vector<float>& qkv, const Shape& s, int k,
                      const cpu::TopkHeavyParams& p = cpu::TopkHeavyParams(), cpu::TopkStats* stats = nullptr) {
    vector<int> idx(s.idx_size(k), -7);
    cpu::causal_topk_heavy(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, p, stats);
    return idx;
}
vector<int> run_ivf(const vector<float>& qkv, const Shape& s, int k, const cpu::TopkIvfParams& p = cpu::TopkIvfParams(),
                    cpu::TopkStats* stats = nullptr) {
    vector<int> idx(s.idx_size(k), -7);
    cpu::causal_topk_ivf(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, p, stats);
    return idx;
}
// small epochs and clusters, so that short sequences have several epochs
cpu::TopkIvfParams small_ivf_params(int budget) {
    cpu::TopkIvfParams p;
    p.first_epoch = 64;
    p.cluster_size = 16;
    p.budget = budget;
    return p;
}
cpu::TopkHeavyParams heavy_params(int prev_queries, int recent) {
    cpu::TopkHeavyParams p;
    p.prev_queries = prev_queries;
    p.recent = recent;
    return p;
}
// brute's score count over searching rows: sum_{i >= k} (i + 1) per (b, h)
double brute_scores(const Shape& s, int k) {
    return (double)s.B * s.NH * (double)(s.T - k) * (s.T + k + 1) / 2.0;
}

// Every row: exactly min(k, i+1) keys, strictly increasing (so distinct), all in
// 0..i (causal), then -1. Returns the number of bad rows (and prints the first).
int count_invalid_rows(const vector<int>& idx, const Shape& s, int k) {
    int bad = 0;
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            for (int i = 0; i < s.T; i++) {
                const int* row = idx.data() + cpu::topk_idx_row(b, h, i, s.T, s.NH, k);
                const int n = std::min(k, i + 1);
                bool ok = true;
                for (int slot = 0; slot < k; slot++) {
                    if (slot < n) {
                        ok = ok && row[slot] >= 0 && row[slot] <= i && (slot == 0 || row[slot] > row[slot - 1]);
                    } else {
                        ok = ok && row[slot] == -1;
                    }
                }
                if (!ok && bad++ == 0) std::printf("  first invalid row: b=%d h=%d i=%d k=%d\n", b, h, i, k);
            }
        }
    }
    return bad;
}

// fraction of brute's keys that another index found, over rows with i + 1 > k
double recall(const vector<int>& found, const vector<int>& exact, const Shape& s, int k) {
    long long hits = 0, total = 0;
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            for (int i = k; i < s.T; i++) {
                const size_t row = cpu::topk_idx_row(b, h, i, s.T, s.NH, k);
                for (int a = 0; a < k; a++)
                    hits += std::binary_search(found.begin() + row, found.begin() + row + k, exact[row + a]);
                total += k;
            }
        }
    }
    return (double)hits / (double)total;
}

}  // namespace

// ---------------------------------------------------------------------------
// the score

TEST(TopkScore, IsWithinFp32RoundingOfTheExactDotProduct) {
    // sequential accumulation of n products: |error| <= gamma_n sum |q_d k_d|, gamma_n = n u / (1 - n u)
    std::mt19937 gen(3);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int HS : {1, 7, 32, 64, 100}) {
        for (int trial = 0; trial < 200; trial++) {
            vector<float> q(HS), k(HS);
            for (auto& x : q) x = dist(gen);
            for (auto& x : k) x = dist(gen);
            double exact = 0.0, magnitude = 0.0;
            for (int d = 0; d < HS; d++) {
                exact += (double)q[d] * k[d];
                magnitude += std::fabs((double)q[d] * k[d]);
            }
            const double u = std::ldexp(1.0, -24), gamma = HS * u / (1.0 - HS * u);
            ASSERT_LE(std::fabs(knngpt::attention_dot(q.data(), k.data(), HS) - exact), gamma * magnitude) << "HS=" << HS;
        }
    }
}

// The panel routines compute 8 keys per vector lane; each lane must be attention_dot
// exactly, in the routines a build uses and in each lane backend it compiles (the
// per-lane std::fma loop always; the AVX/FMA intrinsics where this CPU has them). Key
// counts that are not multiples of 8 leave zero-padded lanes in the last chunk; the
// chunk counts (10, 17, 23 chunks) reach every unrolled path and every tail.
namespace {

struct PanelRoutines {
    const char* name;
    void (*chunks)(float*, const float*, const float*, int, int, int);
    void (*chunks_4q)(float*, size_t, const float*, const float*, int, int);
    void (*chunk_list)(float*, const float*, const float*, const int*, int, int);
};

vector<PanelRoutines> panel_routines() {
    vector<PanelRoutines> all{{"in use", cpu::topk_score_chunks, cpu::topk_score_chunks_4q, cpu::topk_score_chunk_list},
                              {"portable", cpu::topk_lanes_portable::topk_score_chunks,
                               cpu::topk_lanes_portable::topk_score_chunks_4q,
                               cpu::topk_lanes_portable::topk_score_chunk_list}};
#if KNNGPT_TOPK_LANES_FMA
    if (cpu::topk_lanes_use_fma())
        all.push_back({"avx/fma", cpu::topk_lanes_fma::topk_score_chunks, cpu::topk_lanes_fma::topk_score_chunks_4q,
                       cpu::topk_lanes_fma::topk_score_chunk_list});
#endif
    return all;
}

}  // namespace

TEST(TopkScore, PanelLanesEqualTheScoreBitForBit) {
    const auto same_bits = [](float x, float y) {
        uint32_t a, b;
        std::memcpy(&a, &x, 4);
        std::memcpy(&b, &y, 4);
        return a == b;
    };
    for (const PanelRoutines& routines : panel_routines()) {
        std::mt19937 gen(4);
        std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
        long long compared = 0;
        for (int HS = 1; HS <= 130; HS++) {
            for (int T : {77, 133, 179}) {
                const size_t stride = HS + 3;  // keys as rows of a wider tensor, like the k channels of qkv
                vector<float> keys((size_t)T * stride), q4((size_t)4 * HS);
                vector<vector<float>> q(4, vector<float>(HS));
                for (auto& x : keys) x = dist(gen);
                for (int r = 0; r < 4; r++)
                    for (int d = 0; d < HS; d++) q4[4 * d + r] = q[r][d] = dist(gen);
                const int chunks = cpu::topk_num_chunks(T);
                vector<float> panel((size_t)chunks * HS * cpu::kTopkLanes);
                cpu::topk_pack_head_keys(panel.data(), keys.data(), stride, T, HS);
                // lane (c, l) against key j = c * 8 + l; padded lanes score 0
                const auto check = [&](const float* out, int c, const vector<float>& query, const char* routine) {
                    for (int l = 0; l < cpu::kTopkLanes; l++) {
                        const int j = c * cpu::kTopkLanes + l;
                        const float want = j < T ? knngpt::attention_dot(query.data(), keys.data() + j * stride, HS) : 0.0f;
                        ASSERT_TRUE(same_bits(out[l], want)) << routines.name << " " << routine << " HS=" << HS
                                                             << " T=" << T << " key " << j << ": " << out[l] << " vs "
                                                             << want;
                        compared++;
                    }
                };
                vector<float> out((size_t)4 * chunks * cpu::kTopkLanes);
                // one query, chunks [c0, chunks) for several c0
                for (int c0 : {0, 1, 3}) {
                    routines.chunks(out.data(), q[0].data(), panel.data(), c0, chunks, HS);
                    for (int c = c0; c < chunks; c++)
                        check(out.data() + (size_t)(c - c0) * cpu::kTopkLanes, c, q[0], "chunks");
                }
                // four queries, chunks [0, c1) for an even and an odd c1
                const size_t ld = (size_t)chunks * cpu::kTopkLanes;
                for (int c1 : {chunks, chunks - 1}) {
                    routines.chunks_4q(out.data(), ld, q4.data(), panel.data(), c1, HS);
                    for (int r = 0; r < 4; r++)
                        for (int c = 0; c < c1; c++)
                            check(out.data() + r * ld + (size_t)c * cpu::kTopkLanes, c, q[r], "4q");
                }
                // a list of chunks, in no particular order, with repeats; 8-groups and a tail
                vector<int> list;
                for (int u = 0; u < chunks + 3; u++) list.push_back((int)(gen() % chunks));
                routines.chunk_list(out.data(), q[1].data(), panel.data(), list.data(), (int)list.size(), HS);
                for (size_t u = 0; u < list.size(); u++) check(out.data() + u * cpu::kTopkLanes, list[u], q[1], "list");
            }
        }
        std::printf("  %s: %lld lanes compared\n", routines.name, compared);
    }
}

// ---------------------------------------------------------------------------
// brute

TEST(TopkBrute, MatchesAFullSortPerRowOnRandomInputs) {
    const Shape shapes[] = {{2, 37, 24, 3}, {1, 70, 30, 3}, {1, 129, 64, 1}, {2, 5, 8, 2}, {1, 1, 4, 1}, {1, 200, 64, 2}};
    for (const Shape& s : shapes) {
        const vector<float> qkv = uniform_qkv(s, 11 + s.T);
        for (int k : {1, 3, 8, s.T - 1, s.T, s.T + 5}) {
            if (k < 1) continue;
            EXPECT_EQ(run_brute(qkv, s, k), naive_causal_topk(qkv, s, k))
                << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH << " k=" << k;
        }
    }
}

TEST(TopkBrute, BreaksTiesTowardTheSmallerIndexOnIntegerScores) {
    // entries in {-1, 0, 1} and HS = 4: scores take 9 values, ties everywhere
    const Shape s{2, 90, 8, 2};
    const vector<float> qkv = integer_qkv(s, 5, 1);
    for (int k : {1, 3, 10}) EXPECT_EQ(run_brute(qkv, s, k), reference_topk_exact(qkv, s, k)) << "k=" << k;
}

TEST(TopkBrute, DuplicateKeysGoToTheSmallerIndex) {
    // every key the same vector: each row's scores all tie, so row i >= k holds 0..k-1
    const Shape s{1, 50, 16, 2};
    vector<float> qkv = uniform_qkv(s, 8);
    for (int j = 1; j < s.T; j++)
        for (int c = 0; c < s.C; c++) qkv[(size_t)j * 3 * s.C + s.C + c] = qkv[s.C + c];
    const int k = 4;
    for (const vector<int>& idx : {run_brute(qkv, s, k), run_int8(qkv, s, k), run_brute_reference(qkv, s, k)}) {
        for (int h = 0; h < s.NH; h++)
            for (int i = k; i < s.T; i++)
                for (int slot = 0; slot < k; slot++)
                    ASSERT_EQ(idx[cpu::topk_idx_row(0, h, i, s.T, s.NH, k) + slot], slot) << "h=" << h << " i=" << i;
    }
}

TEST(TopkAllIndices, RowsWithAtMostKKeysHoldAllKeysThenMinusOne) {
    const Shape s{2, 12, 16, 2};
    const vector<float> qkv = uniform_qkv(s, 21);
    for (int k : {5, 12, 20}) {
        cpu::LshParams p;
        for (const vector<int>& idx : {run_brute(qkv, s, k), run_int8(qkv, s, k), run_lsh(qkv, s, k, p),
                                        run_heavy(qkv, s, k, heavy_params(4, 2)), run_ivf(qkv, s, k, small_ivf_params(4))}) {
            for (int b = 0; b < s.B; b++)
                for (int h = 0; h < s.NH; h++)
                    for (int i = 0; i < std::min(k, s.T); i++)
                        for (int slot = 0; slot < k; slot++)
                            ASSERT_EQ(idx[cpu::topk_idx_row(b, h, i, s.T, s.NH, k) + slot], slot <= i ? slot : -1)
                                << "k=" << k << " i=" << i << " slot=" << slot;
            EXPECT_EQ(count_invalid_rows(idx, s, k), 0);
        }
    }
}

TEST(TopkAllIndices, NeverSelectAFutureKey) {
    // q_i = u and k_j = (j + 1) u: the score grows with j, so the best keys of every
    // row would be future ones; the causal answer is the last k keys i-k+1..i
    const Shape s{1, 100, 8, 1};
    vector<float> qkv(s.qkv_size(), 0.0f);
    const float u[8] = {0.5f, -0.25f, 0.125f, 1.0f, -0.5f, 0.25f, 0.75f, -1.0f};
    for (int j = 0; j < s.T; j++)
        for (int d = 0; d < 8; d++) {
            query_of(qkv, s, 0, 0, j)[d] = u[d];
            query_of(qkv, s, 0, 0, j)[s.C + d] = (float)(j + 1) * u[d];
        }
    const int k = 6;
    for (const vector<int>& idx : {run_brute(qkv, s, k), run_int8(qkv, s, k), run_brute_reference(qkv, s, k)}) {
        for (int i = k; i < s.T; i++)
            for (int slot = 0; slot < k; slot++) ASSERT_EQ(idx[(size_t)i * k + slot], i - k + 1 + slot) << "i=" << i;
    }
    // the approximate indexes: every key they return must still be causal
    for (int bits : {0, 2, 8}) {
        cpu::LshParams p;
        p.num_bits = bits;
        EXPECT_EQ(count_invalid_rows(run_lsh(qkv, s, k, p), s, k), 0) << "bits=" << bits;
    }
    EXPECT_EQ(count_invalid_rows(run_heavy(qkv, s, k, heavy_params(16, 4)), s, k), 0);
    EXPECT_EQ(count_invalid_rows(run_ivf(qkv, s, k, small_ivf_params(8)), s, k), 0);
}

TEST(TopkBrute, CountsTheCausalScoresOfSearchingRows) {
    const Shape s{2, 75, 16, 2};
    const vector<float> qkv = uniform_qkv(s, 4);
    const int k = 10;
    cpu::TopkStats stats;
    run_brute(qkv, s, k, &stats);
    run_brute(qkv, s, k, &stats);  // accumulates
    long long per_head = 0;
    for (int i = k; i < s.T; i++) per_head += i + 1;
    EXPECT_EQ(stats.scores_computed, 2 * s.B * s.NH * per_head);
}

// ---------------------------------------------------------------------------
// brute: the sgemm search (fast scores, a rounding bound, candidates rescored with
// attention_dot) against the reference that scores every key with attention_dot

// Inputs meant to break the candidate rule if its bound were too tight: every kind of tie,
// near-tie and scale. The v channels are left uniform.
enum class BruteInput {
    Gaussian,     // N(0, 1)
    Uniform,      // [-1, 1]
    Clustered,    // runs of positions around 5 Gaussian means (clustered_qkv)
    Interleaved,  // 8 centres of norm 3, drawn per position (sphere_mixture_qkv)
    Integer1,     // entries in {-1, 0, 1}: exact integer scores, ties everywhere
    Integer3,     // entries in {-3..3}
    Duplicates,   // 3 key vectors and 3 query vectors, repeated at random positions
    UlpApart,     // one key vector, each key with a few coordinates moved by 1 or 2 ulps
    Permuted,     // keys: permutations of one vector; queries: constant vectors, so every
                  // real score ties and only the fp32 summation order separates them
    Large,        // N(0, 1e3^2)
    Tiny,         // N(0, 1e-3^2)
    Subnormal,    // N(0, 1e-22^2): every product is subnormal or zero
    ZeroQueries,  // half the queries exactly zero (every score 0), keys Gaussian
    Huge,         // N(0, 1e19^2): norms that could overflow fp32, rows fall back to rescoring all
};
constexpr BruteInput kBruteInputs[] = {BruteInput::Gaussian,  BruteInput::Uniform,     BruteInput::Clustered,
                                       BruteInput::Interleaved, BruteInput::Integer1,  BruteInput::Integer3,
                                       BruteInput::Duplicates,  BruteInput::UlpApart,  BruteInput::Permuted,
                                       BruteInput::Large,       BruteInput::Tiny,      BruteInput::Subnormal,
                                       BruteInput::ZeroQueries, BruteInput::Huge};

vector<float> brute_input(BruteInput kind, const Shape& s, unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int HS = s.HS();
    auto gaussian = [&](float scale) {
        vector<float> qkv = uniform_qkv(s, seed);
        for (int b = 0; b < s.B; b++)
            for (int i = 0; i < s.T; i++)
                for (int c = 0; c < 2 * s.C; c++) qkv[((size_t)b * s.T + i) * 3 * s.C + c] = scale * normal(gen);
        return qkv;
    };
    // key and query of (b, h, i) set from two vectors
    auto set_qk = [&](vector<float>& qkv, int b, int h, int i, const float* q, const float* key) {
        float* dst = query_of(qkv, s, b, h, i);
        std::copy(q, q + HS, dst);
        std::copy(key, key + HS, dst + s.C);
    };
    switch (kind) {
        case BruteInput::Gaussian: return gaussian(1.0f);
        case BruteInput::Uniform: return uniform_qkv(s, seed);
        case BruteInput::Clustered: return clustered_qkv(s, seed, 5, 10, 40);
        case BruteInput::Interleaved: return sphere_mixture_qkv(s, seed, 8, 3.0f, 0.3f);
        case BruteInput::Integer1: return integer_qkv(s, seed, 1);
        case BruteInput::Integer3: return integer_qkv(s, seed, 3);
        case BruteInput::Large: return gaussian(1e3f);
        case BruteInput::Tiny: return gaussian(1e-3f);
        case BruteInput::Subnormal: return gaussian(1e-22f);
        case BruteInput::Huge: return gaussian(1e19f);
        case BruteInput::Duplicates: {
            vector<float> qkv = uniform_qkv(s, seed), pool(6 * (size_t)HS);
            for (auto& x : pool) x = normal(gen);
            for (int b = 0; b < s.B; b++)
                for (int h = 0; h < s.NH; h++)
                    for (int i = 0; i < s.T; i++)
                        set_qk(qkv, b, h, i, pool.data() + (size_t)(gen() % 3) * HS,
                               pool.data() + (size_t)(3 + gen() % 3) * HS);
            return qkv;
        }
        case BruteInput::UlpApart: {
            vector<float> qkv = gaussian(1.0f), base(HS), key(HS);
            for (auto& x : base) x = normal(gen);
            for (int b = 0; b < s.B; b++)
                for (int h = 0; h < s.NH; h++)
                    for (int i = 0; i < s.T; i++) {
                        key = base;
                        for (int moves = 0; moves < 3; moves++) {
                            float& x = key[gen() % HS];
                            const int steps = (int)(gen() % 5) - 2;  // -2..2 ulps
                            for (int u = 0; u < std::abs(steps); u++) x = std::nextafter(x, steps > 0 ? INFINITY : -INFINITY);
                        }
                        std::copy(key.begin(), key.end(), query_of(qkv, s, b, h, i) + s.C);
                    }
            return qkv;
        }
        case BruteInput::Permuted: {
            vector<float> qkv = uniform_qkv(s, seed), base(HS), key(HS), q(HS);
            for (auto& x : base) x = normal(gen);
            for (int b = 0; b < s.B; b++)
                for (int h = 0; h < s.NH; h++)
                    for (int i = 0; i < s.T; i++) {
                        key = base;
                        std::shuffle(key.begin(), key.end(), gen);
                        std::fill(q.begin(), q.end(), normal(gen));
                        set_qk(qkv, b, h, i, q.data(), key.data());
                    }
            return qkv;
        }
        case BruteInput::ZeroQueries: {
            vector<float> qkv = gaussian(1.0f);
            for (int b = 0; b < s.B; b++)
                for (int h = 0; h < s.NH; h++)
                    for (int i = 0; i < s.T; i++)
                        if (gen() % 2) std::fill(query_of(qkv, s, b, h, i), query_of(qkv, s, b, h, i) + HS, 0.0f);
            return qkv;
        }
    }
    return {};
}

const char* brute_input_name(BruteInput kind) {
    static const char* names[] = {"gaussian",   "uniform", "clustered", "interleaved", "integer1",
                                  "integer3",   "duplicates", "ulp-apart", "permuted",   "large",
                                  "tiny",       "subnormal", "zero-queries", "huge"};
    return names[(int)kind];
}

// A fast search `run(qkv, shape, k)` against the reference on every brute input kind, over
// T = 1..5, T not a multiple of the query block (64), several B and NH, HS = 1, 7, 64, 130,
// and `extra` shapes, with k from 1 to k > T; returns the rows compared.
template <class Run>
long long expect_reference_lists(Run run, unsigned seed0, std::vector<Shape> extra, const std::string& what) {
    std::vector<Shape> shapes = {{1, 1, 4, 1},   {1, 2, 7, 1},   {2, 3, 7, 1},    {1, 4, 1, 1},
                                 {1, 5, 130, 1}, {3, 65, 3, 3},  {2, 70, 14, 2},  {1, 130, 64, 1},
                                 {2, 129, 128, 2}, {1, 200, 130, 1}, {1, 64, 64, 1}, {2, 97, 21, 3}};
    shapes.insert(shapes.end(), extra.begin(), extra.end());
    long long rows_compared = 0;
    for (BruteInput kind : kBruteInputs) {
        for (const Shape& s : shapes) {
            const vector<float> qkv = brute_input(kind, s, seed0 + s.T + (unsigned)kind * 7);
            for (int k : {1, 2, 5, 32, s.T - 1, s.T, s.T + 3}) {
                if (k < 1) continue;
                EXPECT_EQ(run(qkv, s, k), run_brute_reference(qkv, s, k))
                    << what << " " << brute_input_name(kind) << " B=" << s.B << " T=" << s.T << " C=" << s.C
                    << " NH=" << s.NH << " k=" << k;
                if (::testing::Test::HasFailure()) return rows_compared;
                rows_compared += (long long)s.B * s.NH * s.T;
            }
        }
    }
    return rows_compared;
}

TEST(TopkBrute, SgemmSearchEqualsTheReferenceBitForBit) {
    auto sgemm = [](const vector<float>& qkv, const Shape& s, int k) { return run_brute_sgemm(qkv, s, k); };
    std::printf("  %lld rows compared\n", expect_reference_lists(sgemm, 1000, {}, "sgemm"));
}

TEST(TopkBrute, SgemmSearchEqualsTheReferenceOnLongerSequences) {
    // several full query blocks, and the bench's head size
    const Shape s{1, 1000, 128, 2};
    for (BruteInput kind : {BruteInput::Gaussian, BruteInput::Interleaved, BruteInput::Integer1, BruteInput::Permuted,
                            BruteInput::UlpApart})
        for (int k : {1, 32})
            ASSERT_EQ(run_brute_sgemm(brute_input(kind, s, 77), s, k), run_brute_reference(brute_input(kind, s, 77), s, k))
                << brute_input_name(kind) << " k=" << k;
}

TEST(TopkBrute, SgemmSearchEqualsTheFullSortOnIntegerScores) {
    // small integers: every fp32 score is exact, so the exact double dot gives the same order
    const Shape s{2, 150, 24, 3};
    const vector<float> qkv = integer_qkv(s, 9, 2);
    for (int k : {1, 4, 33}) EXPECT_EQ(run_brute_sgemm(qkv, s, k), reference_topk_exact(qkv, s, k)) << "k=" << k;
}

TEST(TopkBrute, AShortBisectionGivesALowerBoundOfTheKthLargest) {
    // the prunes before the last stop the bisection early: their threshold must stay at or
    // below the exact k-th largest (so no key the final threshold keeps is dropped), and
    // the exact call must equal a sort's answer; ties, negatives and a narrow range included
    std::mt19937 rng(77);
    long long below = 0, calls = 0;
    for (int trial = 0; trial < 400; trial++) {
        const int n = 1 + (int)(rng() % 300), k = 1 + (int)(rng() % n);
        const int spread = trial % 4 == 0 ? 3 : (trial % 4 == 1 ? 1000 : 2000000000);
        vector<int32_t> key(n);
        for (int32_t& x : key) x = (int32_t)((long long)(rng() % (2u * (unsigned)spread + 1)) - spread);
        vector<int32_t> sorted = key;
        std::sort(sorted.begin(), sorted.end(), std::greater<int32_t>());
        const int32_t exact = sorted[k - 1];
        EXPECT_EQ(cpu::topk_kth_largest_key(key.data(), n, k), exact) << "n " << n << " k " << k;
        for (int steps : {0, 1, 4, 8, 20}) {
            const int32_t bound = cpu::topk_kth_largest_key(key.data(), n, k, steps);
            EXPECT_LE(bound, exact) << "n " << n << " k " << k << " steps " << steps;
            EXPECT_GE(std::count_if(key.begin(), key.end(), [&](int32_t x) { return x >= bound; }), k);
            below += bound < exact;
            calls++;
        }
    }
    std::printf("  %lld of %lld short bisections below the exact k-th\n", below, calls);
    EXPECT_GT(below, 0);  // the early stop is exercised
}

TEST(TopkBrute, TheQuickselectEqualsASort) {
    // topk_kth_largest_select (the final selections' k-th) against a sort: ties, negatives,
    // the extremes of int32, sorted lists, lengths around the 16-lane groups
    std::mt19937 rng(78);
    for (int trial = 0; trial < 2000; trial++) {
        const int n = 1 + (int)(rng() % (trial % 2 ? 40 : 400)), k = 1 + (int)(rng() % n);
        const int spread = trial % 5 == 0 ? 2 : (trial % 5 == 1 ? 1000 : 2000000000);
        vector<int32_t> key(n);
        for (int32_t& x : key) x = (int32_t)((long long)(rng() % (2u * (unsigned)spread + 1)) - spread);
        if (trial % 7 == 0) key[rng() % n] = INT32_MIN;
        if (trial % 11 == 0) key[rng() % n] = INT32_MAX;
        if (trial % 13 == 0) std::sort(key.begin(), key.end());
        vector<int32_t> sorted = key, above(n + 16), below(n + 16);
        std::sort(sorted.begin(), sorted.end(), std::greater<int32_t>());
        const vector<int32_t> before = key;
        ASSERT_EQ(cpu::topk_kth_largest_select(key.data(), n, k, above.data(), below.data()), sorted[k - 1])
            << "n " << n << " k " << k << " trial " << trial;
        ASSERT_EQ(key, before);  // the input is only read
    }
}

TEST(TopkBrute, RescoresAboutKKeysPerRow) {
    // The candidates are the k best by fast score plus the keys within 2 Delta of the
    // k-th: on Gaussian keys (HS = 64, Delta ~ 1e-4 against scores spread over ~8) a few
    // at most. Rows that must fall back (huge norms) rescore every causal key.
    const Shape s{2, 600, 128, 2};
    for (int k : {1, 8, 32}) {
        cpu::TopkStats stats;
        run_brute_sgemm(brute_input(BruteInput::Gaussian, s, 5), s, k, &stats);
        const double rows = (double)s.B * s.NH * (s.T - k);
        const double per_row = stats.scores_rescored / rows;
        std::printf("  k=%d: %.3f keys rescored per row (fast scores %lld)\n", k, per_row, stats.scores_computed);
        EXPECT_EQ(stats.scores_computed, (long long)brute_scores(s, k));
        EXPECT_GE(per_row, k);
        EXPECT_LE(per_row, k + 1.0);
    }
    cpu::TopkStats huge;
    const int k = 4;
    run_brute_sgemm(brute_input(BruteInput::Huge, s, 6), s, k, &huge);
    EXPECT_EQ(huge.scores_rescored, (long long)brute_scores(s, k));
}

// ---------------------------------------------------------------------------
// int8: brute's search with an int8 first pass

TEST(TopkInt8, EqualsTheReferenceBitForBit) {
    // the sgemm test's shapes and inputs (ties, ulp-apart scores, zero queries, subnormal
    // and huge entries), a head size above the int8 pass's limit (every key rescored) and a
    // longer row, with every kernel this build and CPU have
    for (cpu::TopkInt8Kernel kernel : cpu::topk_int8_kernels_here()) {
        auto int8 = [kernel](const vector<float>& qkv, const Shape& s, int k) { return run_int8(qkv, s, k, nullptr, kernel); };
        const long long rows = expect_reference_lists(int8, 2000, {{1, 40, 1100, 1}, {1, 600, 64, 1}},
                                                      cpu::topk_int8_kernel_name(kernel));
        std::printf("  %s: %lld rows compared\n", cpu::topk_int8_kernel_name(kernel), rows);
    }
}

TEST(TopkInt8, EqualsTheReferenceOnLongerSequencesAndWithNonFiniteKeys) {
    const Shape s{1, 1000, 128, 2};
    for (BruteInput kind : {BruteInput::Gaussian, BruteInput::Interleaved, BruteInput::Integer1, BruteInput::Permuted,
                            BruteInput::UlpApart, BruteInput::Clustered})
        for (int k : {1, 32})
            ASSERT_EQ(run_int8(brute_input(kind, s, 78), s, k), run_brute_reference(brute_input(kind, s, 78), s, k))
                << brute_input_name(kind) << " k=" << k;
    // an infinite and a NaN key entry: the rows that see them rescore every key, the
    // others keep the fast pass (the head's key scale ignores non-finite entries)
    vector<float> qkv = brute_input(BruteInput::Gaussian, s, 79);
    key_of(qkv, s, 0, 0, 700)[3] = INFINITY;
    key_of(qkv, s, 0, 1, 300)[5] = NAN;
    cpu::TopkStats stats;
    for (int k : {1, 8}) EXPECT_EQ(run_int8(qkv, s, k, &stats), run_brute_reference(qkv, s, k)) << "k=" << k;
    EXPECT_LT(stats.scores_rescored, stats.scores_computed);
}

// the block's fast scores: every kernel this build and CPU have (AMX tiles, VNNI, the plain
// loop) equals an integer dot product of the quantised values, computed here
TEST(TopkInt8, FastScoresAreTheIntegerDotProductsOfTheQuantisedValues) {
    for (cpu::TopkInt8Kernel kernel : cpu::topk_int8_kernels_here()) {
        for (int HS : {1, 3, 4, 7, 32, 64, 65, 130}) {
            const Shape s{1, 600, HS, 1};
            const vector<float> qkv = brute_input(BruteInput::Gaussian, s, 40 + HS);
            vector<float> keys((size_t)s.T * HS);
            vector<double> kn((size_t)s.T, 1.0);
            for (int j = 0; j < s.T; j++)
                std::copy(key_of(qkv, s, 0, 0, j), key_of(qkv, s, 0, 0, j) + HS, &keys[(size_t)j * HS]);
            const cpu::TopkInt8Pass pass(qkv.data(), 1, s.T, s.C, 1, keys.data(), kn.data(), kernel);
            cpu::TopkInt8Pass::Rows rows(pass);
            const double s_k = pass.key_scale[0];
            vector<float> fast((size_t)128 * cpu::kTopkKeyTile, NAN);
            // the first key tile from row 30 (rows under 16 and partial groups), then a
            // second tile from row 520
            for (auto [i_search, i1, j0, j1] : {std::array<int, 4>{30, 158, 0, 158}, std::array<int, 4>{520, 600, 512, 600}}) {
                rows.begin(0, 0, i_search, i1);
                rows.tile(fast.data(), cpu::kTopkKeyTile, i_search, i1, j0, j1);
                for (int i = i_search; i < i1; i++) {
                    const float* q = query_of(qkv, s, 0, 0, i);
                    float largest = 0.0f;
                    for (int d = 0; d < HS; d++) largest = std::max(largest, std::fabs(q[d]));
                    const double s_q = cpu::topk_int8_scale(largest);
                    for (int j = j0; j <= std::min(i, j1 - 1); j++) {
                        long long dot = 0;
                        for (int d = 0; d < HS; d++)
                            dot += (long long)cpu::topk_int8_quantise(q[d], 1.0 / s_q) *
                                   (long long)cpu::topk_int8_quantise(key_of(qkv, s, 0, 0, j)[d], 1.0 / s_k);
                        ASSERT_EQ(fast[(size_t)(i - i_search) * cpu::kTopkKeyTile + (j - j0)], (float)dot)
                            << cpu::topk_int8_kernel_name(kernel) << " HS " << HS << " i " << i << " j " << j;
                    }
                }
            }
        }
        std::printf("  %s: the integer dot products\n", cpu::topk_int8_kernel_name(kernel));
    }
}

// the bound of the header: |attention_dot(q_i, k_j) / (s_q s_k) - f_ij| <= Delta_i for
// every causal pair, on inputs whose quantisation errors differ (wide and narrow ranges,
// outliers); and it is not vacuous: the largest gap reaches a visible fraction of Delta
TEST(TopkInt8, FastScoresLieWithinTheBoundOfTheExactScores) {
    const Shape s{1, 300, 64, 1};
    for (BruteInput kind : {BruteInput::Gaussian, BruteInput::Uniform, BruteInput::Clustered, BruteInput::Large,
                            BruteInput::Tiny, BruteInput::Integer3}) {
        vector<float> qkv = brute_input(kind, s, 91);
        key_of(qkv, s, 0, 0, 150)[7] *= 40.0f;  // an outlier coarsens every key's quantisation
        vector<float> keys((size_t)s.T * 64);
        vector<double> kn((size_t)s.T);
        double run = 0.0;
        for (int j = 0; j < s.T; j++) {
            std::copy(key_of(qkv, s, 0, 0, j), key_of(qkv, s, 0, 0, j) + 64, &keys[(size_t)j * 64]);
            run = std::max(run, cpu::topk_norm_up(key_of(qkv, s, 0, 0, j), 64));
            kn[j] = run;
        }
        const cpu::TopkInt8Pass pass(qkv.data(), 1, s.T, s.C, 1, keys.data(), kn.data());
        cpu::TopkInt8Pass::Rows rows(pass);
        const double s_k = pass.key_scale[0];
        double worst = 0.0;  // the largest |gap| / Delta seen
        for (int i0 = 0; i0 < s.T; i0 += 128) {
            const int i1 = std::min(i0 + 128, s.T);
            rows.begin(0, 0, i0, i1);
            vector<float> fast((size_t)128 * cpu::kTopkKeyTile);
            for (int j0 = 0; j0 < i1; j0 += cpu::kTopkKeyTile) {
                const int r0 = std::max(i0, j0), j1 = std::min(j0 + cpu::kTopkKeyTile, i1);
                rows.tile(fast.data(), cpu::kTopkKeyTile, r0, i1, j0, j1);
                for (int i = r0; i < i1; i++) {
                    const cpu::TopkBruteMargin m = rows.margin(i);
                    ASSERT_TRUE(m.fast_ok) << brute_input_name(kind) << " row " << i;
                    const float* q = query_of(qkv, s, 0, 0, i);
                    float largest = 0.0f;
                    for (int d = 0; d < 64; d++) largest = std::max(largest, std::fabs(q[d]));
                    const double c = cpu::topk_int8_scale(largest) * s_k;
                    for (int j = j0; j < std::min(i + 1, j1); j++) {
                        const double exact = knngpt::attention_dot(q, key_of(qkv, s, 0, 0, j), 64) / c;
                        const double gap = std::fabs(exact - fast[(size_t)(i - r0) * cpu::kTopkKeyTile + (j - j0)]);
                        ASSERT_LE(gap, m.delta) << brute_input_name(kind) << " i " << i << " j " << j;
                        worst = std::max(worst, gap / m.delta);
                    }
                }
            }
        }
        std::printf("  %-10s largest gap %.3f of Delta\n", brute_input_name(kind), worst);
        EXPECT_GT(worst, 0.01) << brute_input_name(kind);
    }
}

TEST(TopkInt8, RescoresAFewTimesKKeysPerRowOnGaussianKeys) {
    // the candidates are the keys within 2 Delta of the k-th best fast score: with int8
    // quantisation Delta is ~0.05 of the scores' spread on these inputs, so a few k at most
    const Shape s{2, 600, 128, 2};
    for (int k : {1, 8, 32}) {
        cpu::TopkStats stats;
        EXPECT_EQ(run_int8(brute_input(BruteInput::Gaussian, s, 5), s, k, &stats),
                  run_brute_reference(brute_input(BruteInput::Gaussian, s, 5), s, k));
        const double per_row = stats.scores_rescored / ((double)s.B * s.NH * (s.T - k));
        std::printf("  k=%d: %.2f keys rescored per row\n", k, per_row);
        EXPECT_EQ(stats.scores_computed, (long long)brute_scores(s, k));
        EXPECT_GE(per_row, k);
        EXPECT_LE(per_row, 4.0 * k + 16.0);
    }
}

// ---------------------------------------------------------------------------
// 2-means bisection (topk_bisect.h), how ivf cuts its clusters

// Splits `n` rows of `qkv`'s keys (head h) with topk_bisect; returns each row's side (1 for
// the first part) in the input order, and checks the split is a reordering of its input.
vector<int> bisect_sides(const vector<float>& qkv, const Shape& s, int h, int n, int min_side, int* first_part) {
    const int HS = s.HS();
    vector<float> x((size_t)n * HS), scratch((size_t)n * HS), p;
    vector<int> pos(n), order;
    vector<char> side;
    for (int r = 0; r < n; r++) {
        std::copy(key_of(qkv, s, 0, h, r), key_of(qkv, s, 0, h, r) + HS, x.begin() + (size_t)r * HS);
        pos[r] = r;
    }
    const int mid = cpu::topk_bisect(x.data(), pos.data(), 0, n, HS, min_side, scratch.data(), p, side, order);
    *first_part = mid;
    vector<int> sides(n, -1);
    for (int u = 0; u < n; u++) {
        EXPECT_EQ(sides[pos[u]], -1) << "row " << pos[u] << " placed twice";
        sides[pos[u]] = u < mid;
        EXPECT_EQ(std::memcmp(x.data() + (size_t)u * HS, key_of(qkv, s, 0, h, pos[u]), HS * sizeof(float)), 0)
            << "row " << pos[u] << " moved without its key";
    }
    return sides;
}

TEST(TopkBisect, SeparatesTwoWellSeparatedGroupsExactly) {
    // two components with N(0, 1) means in HS = 64 (about 11 apart), noise 0.3, one component
    // per position: the split is the components
    const Shape s{1, 300, 128, 2};
    vector<int> component_of;
    const vector<float> qkv = clustered_qkv(s, 84, 2, 0, 0, 0.3f, &component_of);
    for (int h = 0; h < s.NH; h++) {
        int first = 0;
        const vector<int> sides = bisect_sides(qkv, s, h, s.T, 1, &first);
        ASSERT_GT(first, 0);
        ASSERT_LT(first, s.T);
        for (int r = 1; r < s.T; r++)
            EXPECT_EQ(sides[r] == sides[0], component_of[(size_t)h * s.T + r] == component_of[(size_t)h * s.T])
                << "h=" << h << " row " << r;
    }
}

TEST(TopkBisect, KeepsAtLeastMinSideKeysOnEachSideAndIsAPureFunctionOfItsInput) {
    // one tight group and a few far keys: 2-means alone would cut the few off; min_side
    // moves the keys with the largest projection over to the small side
    const Shape s{1, 120, 32, 1};
    vector<float> qkv = clustered_qkv(s, 85, 1, 0, 0, 0.05f);
    for (int j = 0; j < 3; j++)
        for (int d = 0; d < s.HS(); d++) key_of(qkv, s, 0, 0, j)[d] += 20.0f;
    for (int min_side : {1, 10, 30, 60}) {
        int first = 0;
        const vector<int> sides = bisect_sides(qkv, s, 0, s.T, min_side, &first);
        EXPECT_GE(first, min_side) << "min_side " << min_side;
        EXPECT_GE(s.T - first, min_side) << "min_side " << min_side;
        if (min_side == 1) {
            EXPECT_EQ(std::min(first, s.T - first), 3) << "the three far keys are their own side";
        }
        int again_first = 0;
        EXPECT_EQ(bisect_sides(qkv, s, 0, s.T, min_side, &again_first), sides);
        EXPECT_EQ(again_first, first);
    }
}

// ---------------------------------------------------------------------------
// lsh

TEST(TopkLsh, ReturnsMinKIPlusOneDistinctCausalKeysPerRow) {
    const Shape s{2, 150, 48, 3};
    const vector<float> uniform = uniform_qkv(s, 51);
    const vector<float> clustered = clustered_qkv(s, 52, 4, 20, 60);
    for (const vector<float>* qkv : {&uniform, &clustered}) {
        for (int bits : {1, 6, 12}) {
            for (int tables : {1, 3}) {
                for (int k : {1, 5, 40}) {
                    cpu::LshParams p;
                    p.num_bits = bits;
                    p.num_tables = tables;
                    EXPECT_EQ(count_invalid_rows(run_lsh(*qkv, s, k, p), s, k), 0)
                        << "bits=" << bits << " tables=" << tables << " k=" << k;
                }
            }
        }
    }
}

TEST(TopkLsh, WithOneBucketEqualsBrute) {
    // num_bits = 0: every key is a candidate, ranked by the same score
    const Shape s{2, 97, 40, 2};
    const vector<float> qkv = uniform_qkv(s, 61);
    cpu::LshParams p;
    p.num_bits = 0;
    for (int k : {1, 7, 30}) EXPECT_EQ(run_lsh(qkv, s, k, p), run_brute(qkv, s, k)) << "k=" << k;
}

TEST(TopkLsh, MatchesItsDefinitionGivenTheHashCodes) {
    // candidates = causal keys sharing the query's bucket in any table, best k by
    // (score desc, index asc); too few: the most recent non-candidates fill the row
    const Shape s{1, 120, 32, 2};
    const vector<float> qkv = clustered_qkv(s, 71, 5, 10, 30);
    cpu::LshParams p;
    p.num_bits = 6;  // many buckets: plenty of rows with too few candidates
    p.num_tables = 2;
    p.seed = 99;
    const int k = 12, HS = s.HS(), M = p.num_bits * p.num_tables;
    const vector<int> idx = run_lsh(qkv, s, k, p);
    int rows_filled = 0;
    for (int h = 0; h < s.NH; h++) {
        vector<float> planes((size_t)(HS + 1) * M), proj(M);
        cpu::lsh_hyperplanes(planes.data(), p, s.NH, h, HS);
        double R2 = 0.0;
        for (int j = 0; j < s.T; j++) {
            double n2 = 0.0;
            for (int d = 0; d < HS; d++) n2 += (double)key_of(qkv, s, 0, h, j)[d] * key_of(qkv, s, 0, h, j)[d];
            R2 = std::max(R2, n2);
        }
        vector<uint32_t> key_code((size_t)s.T * p.num_tables), query_code(p.num_tables);
        for (int j = 0; j < s.T; j++) {
            const float* key = key_of(qkv, s, 0, h, j);
            double n2 = 0.0;
            for (int d = 0; d < HS; d++) n2 += (double)key[d] * key[d];
            cpu::lsh_codes(key_code.data() + (size_t)j * p.num_tables, proj.data(), planes.data(), p, key,
                           (float)std::sqrt(std::max(R2 - n2, 0.0)), HS);
        }
        for (int i = k; i < s.T; i++) {
            const float* q = query_of(qkv, s, 0, h, i);
            cpu::lsh_codes(query_code.data(), proj.data(), planes.data(), p, q, 0.0f, HS);
            vector<std::pair<float, int>> candidates;
            for (int j = 0; j <= i; j++) {
                bool shares = false;
                for (int t = 0; t < p.num_tables; t++) shares |= key_code[(size_t)j * p.num_tables + t] == query_code[t];
                if (shares) candidates.push_back({knngpt::attention_dot(q, key_of(qkv, s, 0, h, j), HS), j});
            }
            std::sort(candidates.begin(), candidates.end(), [](const auto& x, const auto& y) {
                return x.first > y.first || (x.first == y.first && x.second < y.second);
            });
            vector<int> expected;
            for (size_t c = 0; c < candidates.size() && (int)expected.size() < k; c++) expected.push_back(candidates[c].second);
            if ((int)expected.size() < k) rows_filled++;
            for (int j = i; (int)expected.size() < k; j--) {
                bool candidate = false;
                for (const auto& c : candidates) candidate |= c.second == j;
                if (!candidate) expected.push_back(j);
            }
            std::sort(expected.begin(), expected.end());
            const int* row = idx.data() + cpu::topk_idx_row(0, h, i, s.T, s.NH, k);
            ASSERT_EQ(vector<int>(row, row + k), expected) << "h=" << h << " i=" << i;
        }
    }
    EXPECT_GT(rows_filled, 10);  // the fill path was exercised
}

TEST(TopkLsh, RecallOnClusteredKeysIsAboveAFloor) {
    const Shape s{1, 2048, 128, 2};  // HS = 64
    const int k = 32;
    const vector<float> qkv = clustered_qkv(s, 81, 8, 128, 512);
    cpu::LshParams p;  // defaults: 8 bits, 4 tables
    cpu::TopkStats stats;
    const vector<int> found = run_lsh(qkv, s, k, p, &stats);
    EXPECT_EQ(count_invalid_rows(found, s, k), 0);
    const double r = recall(found, run_brute(qkv, s, k), s, k);
    const double score_fraction = (double)stats.scores_computed / (2.0 * (double)(s.T - k) * (s.T + k + 1) / 2.0);
    std::printf("  T=%d k=%d bits=%d tables=%d: recall %.3f, candidates %.3f of brute's scores\n", s.T, k, p.num_bits,
                p.num_tables, r, score_fraction);
    RecordProperty("lsh_recall", std::to_string(r));
    EXPECT_GT(r, 0.3);
}

TEST(TopkLsh, IsAPureFunctionOfSeedStepAndLayer) {
    const Shape s{2, 200, 64, 2};
    const vector<float> qkv = clustered_qkv(s, 91, 4, 20, 80);
    const int k = 8;
    cpu::LshParams p;
    p.seed = 1234;
    p.step = 7;
    p.layer = 3;
    const vector<int> base = run_lsh(qkv, s, k, p);
    EXPECT_EQ(run_lsh(qkv, s, k, p), base);
    cpu::LshParams other = p;
    other.seed = 1235;
    EXPECT_NE(run_lsh(qkv, s, k, other), base);
    other = p;
    other.step = 8;
    EXPECT_NE(run_lsh(qkv, s, k, other), base);
    other = p;
    other.layer = 4;
    EXPECT_NE(run_lsh(qkv, s, k, other), base);
}

TEST(TopkLsh, HyperplaneEntriesAreStandardGaussian) {
    // mean 0 and variance 1 within 5 measured standard errors, over 1000 seeds
    const int HS = 31, seeds = 1000;
    cpu::LshParams p;
    p.num_bits = 4;
    p.num_tables = 2;
    const int M = p.num_bits * p.num_tables;
    vector<float> planes((size_t)(HS + 1) * M);
    vector<double> x;
    for (int seed = 0; seed < seeds; seed++) {
        p.seed = 1000 + seed;
        cpu::lsh_hyperplanes(planes.data(), p, 4, 1, HS);
        x.insert(x.end(), planes.begin(), planes.end());
    }
    const double n = (double)x.size();
    double mean = 0.0, m2 = 0.0, m4 = 0.0;
    for (double v : x) mean += v;
    mean /= n;
    for (double v : x) {
        m2 += (v - mean) * (v - mean);
        m4 += std::pow(v - mean, 4);
    }
    m2 /= n;
    m4 /= n;
    EXPECT_LE(std::fabs(mean), 5.0 * std::sqrt(m2 / n));
    EXPECT_LE(std::fabs(m2 - 1.0), 5.0 * std::sqrt((m4 - m2 * m2) / n));  // se of the sample variance
}

TEST(TopkLsh, BitsCollideWithProbabilityOneMinusAngleOverPi) {
    // SimHash: for vectors x, y at angle theta, P(bit(x) == bit(y)) = 1 - theta / pi.
    // x = (v, 0) as a query and y = (w, pad) as a key: fixed vectors, 1000 seeds x 16 bits.
    const int HS = 16, seeds = 1000;
    cpu::LshParams p;
    p.num_bits = 16;
    p.num_tables = 1;
    vector<float> v(HS), w(HS);
    std::mt19937 gen(5);
    std::normal_distribution<float> normal;
    for (int d = 0; d < HS; d++) {
        v[d] = normal(gen);
        w[d] = v[d] + 0.8f * normal(gen);
    }
    const float pad = 1.5f;
    double vw = 0.0, vv = 0.0, ww = (double)pad * pad;
    for (int d = 0; d < HS; d++) {
        vw += (double)v[d] * w[d];
        vv += (double)v[d] * v[d];
        ww += (double)w[d] * w[d];
    }
    const double truth = 1.0 - std::acos(vw / std::sqrt(vv * ww)) / 3.141592653589793;
    vector<float> planes((size_t)(HS + 1) * p.num_bits), proj(p.num_bits);
    vector<double> per_seed;
    for (int seed = 0; seed < seeds; seed++) {
        p.seed = 5000 + seed;
        cpu::lsh_hyperplanes(planes.data(), p, 1, 0, HS);
        uint32_t cv, cw;
        cpu::lsh_codes(&cv, proj.data(), planes.data(), p, v.data(), 0.0f, HS);
        cpu::lsh_codes(&cw, proj.data(), planes.data(), p, w.data(), pad, HS);
        per_seed.push_back((double)(p.num_bits - __builtin_popcount(cv ^ cw)) / p.num_bits);
    }
    double mean = 0.0, var = 0.0;
    for (double x : per_seed) mean += x;
    mean /= seeds;
    for (double x : per_seed) var += (x - mean) * (x - mean);
    var /= seeds - 1;
    std::printf("  collision rate %.4f, 1 - theta/pi = %.4f\n", mean, truth);
    EXPECT_LE(std::fabs(mean - truth), 5.0 * std::sqrt(var / seeds));
}

// ---------------------------------------------------------------------------
// what the approximate indexes' tests share

// Well-formed causal rows from index(qkv, s, k, budget) (budgets 0, 8, 1000) and from its
// defaults, on sequences of the given lengths (T = 1..5: k >= T included; and across the
// index's block or epoch edges), head sizes 1, 7 and 64; sequences of at most 64 keys are
// brute force.
using BudgetIndex = std::function<vector<int>(const vector<float>&, const Shape&, int, int)>;
void expect_well_formed_rows_on_edge_shapes(const BudgetIndex& index,
                                            const std::function<vector<int>(const vector<float>&, const Shape&, int)>& defaults,
                                            std::initializer_list<int> lengths, unsigned seed) {
    for (int T : lengths) {
        for (int HS : {1, 7, 64}) {
            const Shape s{2, T, 2 * HS, 2};
            const vector<float> qkv = uniform_qkv(s, seed + T + HS);
            for (int k : {1, 3, 5, 40}) {
                for (int budget : {0, 8, 1000})
                    ASSERT_EQ(count_invalid_rows(index(qkv, s, k, budget), s, k), 0) << "T=" << T << " HS=" << HS << " k=" << k;
                if (T <= 64) {
                    EXPECT_EQ(index(qkv, s, k, 0), run_brute(qkv, s, k));
                }
            }
            EXPECT_EQ(count_invalid_rows(defaults(qkv, s, 4), s, 4), 0);
        }
    }
}

// index(qkv, s, k, cluster_size) with a budget of every key equals brute force bit for bit,
// for each of cluster_sizes (0: the index's default), on uniform, runs of Gaussian, sphere
// mixture and integer (tied) inputs, T = 700, k = 1, 9, 32.
void expect_every_key_budget_equals_brute(const BudgetIndex& index, std::initializer_list<int> cluster_sizes,
                                          unsigned seed) {
    const Shape s{2, 700, 64, 2};
    const vector<vector<float>> inputs = {uniform_qkv(s, seed), clustered_qkv(s, seed + 1, 6, 20, 80),
                                          sphere_mixture_qkv(s, seed + 2, 16, 3.0f, 0.3f), integer_qkv(s, seed + 3, 2)};
    for (size_t u = 0; u < inputs.size(); u++)
        for (int k : {1, 9, 32}) {
            const vector<int> exact = run_brute(inputs[u], s, k);
            for (int cluster_size : cluster_sizes)
                EXPECT_EQ(index(inputs[u], s, k, cluster_size), exact) << "input " << u << " k=" << k << " cs=" << cluster_size;
        }
}

// Rows 0..P of `index`'s lists are unchanged when the keys and queries after P change,
// and equal the rows of the sequence cut after P (sphere-mixture inputs from `seed`).
void expect_rows_depend_only_on_their_past(const std::function<vector<int>(const vector<float>&, const Shape&)>& index,
                                           unsigned seed, int P) {
    const Shape s{1, 600, 64, 2};
    const int k = 8;
    const vector<float> qkv = sphere_mixture_qkv(s, seed, 8, 3.0f, 0.3f);
    vector<float> changed = qkv;
    const vector<float> noise = uniform_qkv(s, seed + 1);
    for (size_t x = (size_t)(P + 1) * 3 * s.C; x < changed.size(); x++) changed[x] = noise[x];
    const Shape cut{1, P + 1, 64, 2};
    const vector<float> prefix(qkv.begin(), qkv.begin() + (size_t)(P + 1) * 3 * s.C);
    const vector<int> a = index(qkv, s), b = index(changed, s), c = index(prefix, cut);
    for (int h = 0; h < s.NH; h++)
        for (int i = 0; i <= P; i++)
            for (int slot = 0; slot < k; slot++) {
                const int x = a[cpu::topk_idx_row(0, h, i, s.T, s.NH, k) + slot];
                ASSERT_EQ(b[cpu::topk_idx_row(0, h, i, s.T, s.NH, k) + slot], x) << "h=" << h << " i=" << i;
                ASSERT_EQ(c[cpu::topk_idx_row(0, h, i, cut.T, cut.NH, k) + slot], x) << "h=" << h << " i=" << i;
            }
}

// The benchmark's clustered inputs (64 centres of norm 3, noise 0.3), T = 4096, k = 32:
// `index` finds more than min_recall of brute's lists with fewer than max_scores of
// brute's scores.
void expect_recall_on_bench_clusters(const char* name,
                                     const std::function<vector<int>(const vector<float>&, const Shape&, int,
                                                                     cpu::TopkStats*)>& index,
                                     unsigned seed, double min_recall, double max_scores) {
    const Shape s{1, 4096, 64, 1};
    const int k = 32;
    const vector<float> qkv = sphere_mixture_qkv(s, seed, 64, 3.0f, 0.3f);
    cpu::TopkStats stats;
    const vector<int> found = index(qkv, s, k, &stats);
    EXPECT_EQ(count_invalid_rows(found, s, k), 0);
    const double r = recall(found, run_brute(qkv, s, k), s, k);
    const double score_fraction = (double)stats.scores_computed / brute_scores(s, k);
    std::printf("  T=%d k=%d: recall %.3f, scores %.3f of brute's, clusters visited %.3f\n", s.T, k, r, score_fraction,
                (double)stats.blocks_visited / (double)stats.blocks_total);
    ::testing::Test::RecordProperty(std::string(name) + "_recall", std::to_string(r));
    EXPECT_GT(r, min_recall);
    EXPECT_LT(score_fraction, max_scores);
}

// Recall against brute on 32 interleaved clusters (T = 1024, head size 32, k = 16) never
// falls by more than 0.01 as the budget grows over 0, 32, 128, 512, and ends above 0.95.
void expect_recall_grows_with_the_budget(const BudgetIndex& index, unsigned seed) {
    const Shape s{1, 1024, 32, 1};
    const int k = 16;
    const vector<float> qkv = sphere_mixture_qkv(s, seed, 32, 3.0f, 0.3f);
    const vector<int> exact = run_brute(qkv, s, k);
    double last = 0.0;
    for (int budget : {0, 32, 128, 512}) {
        const double r = recall(index(qkv, s, k, budget), exact, s, k);
        std::printf("  budget %d: recall %.3f\n", budget, r);
        EXPECT_GE(r, last - 0.01) << "budget " << budget;
        last = r;
    }
    EXPECT_GT(last, 0.95);
}

// ---------------------------------------------------------------------------
// heavy

TEST(TopkHeavy, ReturnsWellFormedCausalRowsOnEdgeShapes) {
    for (int T : {1, 2, 3, 4, 5, 63, 64, 65, 200, 333}) {
        for (int HS : {1, 7, 64}) {
            const Shape s{2, T, 2 * HS, 2};
            const vector<float> qkv = uniform_qkv(s, 230 + T + HS);
            for (int k : {1, 3, 5, 40})
                for (int prev : {0, 64, 256})
                    for (int recent : {0, 8, 1000})
                        ASSERT_EQ(count_invalid_rows(run_heavy(qkv, s, k, heavy_params(prev, recent)), s, k), 0)
                            << "T=" << T << " HS=" << HS << " k=" << k << " prev=" << prev << " recent=" << recent;
        }
    }
}

TEST(TopkHeavy, WithEveryKeyRecentEqualsBruteBitForBit) {
    const Shape s{2, 700, 64, 2};
    const vector<vector<float>> inputs = {uniform_qkv(s, 241), clustered_qkv(s, 242, 6, 20, 80),
                                          sphere_mixture_qkv(s, 243, 16, 3.0f, 0.3f), integer_qkv(s, 244, 2)};
    for (size_t u = 0; u < inputs.size(); u++)
        for (int k : {1, 9, 32})
            for (int prev : {0, 256})
                EXPECT_EQ(run_heavy(inputs[u], s, k, heavy_params(prev, s.T)), run_brute(inputs[u], s, k))
                    << "input " << u << " k=" << k << " prev=" << prev;
}

// Each row, recomputed from the definition: its block's candidates are the keys in the
// lists (as returned) of the prev_queries rows before the block, the keys i0 - R .. i1 - 1
// and, in a probed block, the top probe_width k causal keys of row i0; the row is their k
// best causal keys by (attention_dot desc, j asc), by a full sort (row i0 of a probed
// block: the best k of every causal key).
TEST(TopkHeavy, EachRowIsTheTopKOfItsCandidates) {
    const Shape s{2, 460, 64, 2};
    const vector<float> qkv = sphere_mixture_qkv(s, 251, 12, 3.0f, 0.3f);
    const int HS = s.C / s.NH;
    struct Case {
        int prev, recent, every, width;
    };
    for (int k : {4, 16}) {
        for (const Case& c : {Case{64, 0, 0, 1}, Case{128, 20, 1, 1}, Case{256, 64, 3, 4}, Case{0, 0, 2, 2}}) {
            cpu::TopkHeavyParams p = heavy_params(c.prev, c.recent);
            p.probe_every = c.every;
            p.probe_width = c.width;
            const vector<int> idx = run_heavy(qkv, s, k, p);
            const int R = std::max(c.recent, k);
            for (int b = 0; b < s.B; b++)
                for (int h = 0; h < s.NH; h++) {
                    // the best n of keys `from` for row i, ascending
                    auto best = [&](int i, const std::set<int>& from, int n) {
                        const float* q = qkv.data() + ((size_t)b * s.T + i) * 3 * s.C + (size_t)h * HS;
                        vector<std::pair<float, int>> ranked;
                        for (int j : from)
                            if (j <= i) ranked.push_back({-knngpt::attention_dot(q, key_of(qkv, s, b, h, j), HS), j});
                        std::sort(ranked.begin(), ranked.end());
                        vector<int> top;
                        for (int u = 0; u < std::min(n, (int)ranked.size()); u++) top.push_back(ranked[u].second);
                        std::sort(top.begin(), top.end());
                        return top;
                    };
                    for (int i0 = 0, blk = 0; i0 < s.T; i0 += 64, blk++) {
                        std::set<int> cand, every_key;
                        for (int j = 0; j <= i0; j++) every_key.insert(j);
                        const bool probed = c.every > 0 && blk % c.every == 0 && i0 + 1 > k;
                        if (probed)
                            for (int j : best(i0, every_key, c.width * k)) cand.insert(j);
                        for (int i = std::max(0, i0 - c.prev); i < i0; i++)
                            for (int slot = 0; slot < k; slot++) {
                                const int j = idx[cpu::topk_idx_row(b, h, i, s.T, s.NH, k) + slot];
                                if (j >= 0) cand.insert(j);
                            }
                        for (int j = std::max(0, i0 - R); j < std::min(s.T, i0 + 64); j++) cand.insert(j);
                        for (int i = i0; i < std::min(s.T, i0 + 64); i++) {
                            vector<int> want = best(i, probed && i == i0 ? every_key : cand, k);
                            while ((int)want.size() < k) want.push_back(-1);
                            const int* row = idx.data() + cpu::topk_idx_row(b, h, i, s.T, s.NH, k);
                            ASSERT_EQ(vector<int>(row, row + k), want)
                                << "b=" << b << " h=" << h << " i=" << i << " k=" << k << " prev=" << c.prev
                                << " every=" << c.every;
                        }
                    }
                }
        }
    }
}

TEST(TopkHeavy, RowsDependOnlyOnTheirPast) {
    // P = 300 lies in block 4, which probes
    expect_rows_depend_only_on_their_past([](const vector<float>& qkv, const Shape& s) { return run_heavy(qkv, s, 8); },
                                          261, 300);
}

// Queries that stay on one topic for a stretch (runs of `run` queries near one of 8
// centres, in turn) and keys of random topics whose weight along their centre varies
// (log-normal): the heaviest keys of a topic are the top keys of every one of its queries,
// the locality the index relies on (trained attention has it: README, `bench_attention`).
// Over a run the lists carry those keys from block to block; at a change of topic the
// new topic's heavy keys, selected too long ago, come back only through a probe.
vector<float> topic_runs_qkv(const Shape& s, unsigned seed, int run, bool weighted) {
    const int HS = s.C / s.NH, topics = 8;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    vector<float> centre((size_t)topics * HS);
    for (int g = 0; g < topics; g++) {
        double n2 = 0.0;
        for (int d = 0; d < HS; d++) n2 += std::pow(centre[(size_t)g * HS + d] = normal(rng), 2);
        for (int d = 0; d < HS; d++) centre[(size_t)g * HS + d] *= 3.0f / (float)std::sqrt(n2);
    }
    vector<float> qkv(s.qkv_size());
    std::uniform_int_distribution<int> topic(0, topics - 1);
    for (int i = 0; i < s.T; i++) {
        const int gq = (i / run) % topics, gk = topic(rng);
        const float weight = weighted ? std::exp(0.7f * normal(rng)) : 1.0f;
        float* row = qkv.data() + (size_t)i * 3 * s.C;
        for (int d = 0; d < HS; d++) {
            row[d] = centre[(size_t)gq * HS + d] + 0.3f * normal(rng);
            row[s.C + d] = weight * centre[(size_t)gk * HS + d] + 0.3f * normal(rng);
            row[2 * s.C + d] = normal(rng);
        }
    }
    return qkv;
}

TEST(TopkHeavy, RecallIsHighWhenNearbyQueriesShareTheirTopKeys) {
    const Shape s{1, 4096, 64, 1};
    const int k = 32;
    const vector<float> long_runs = topic_runs_qkv(s, 271, 1000, true);
    cpu::TopkStats stats;
    const vector<int> found = run_heavy(long_runs, s, k, cpu::TopkHeavyParams(), &stats);
    EXPECT_EQ(count_invalid_rows(found, s, k), 0);
    const double r = recall(found, run_brute(long_runs, s, k), s, k);
    const double score_fraction = (double)stats.scores_computed / brute_scores(s, k);
    std::printf("  runs of 1000: recall %.3f at %.3f of brute's scores\n", r, score_fraction);
    RecordProperty("heavy_recall", std::to_string(r));
    EXPECT_GT(r, 0.9);
    EXPECT_LT(score_fraction, 0.2);
    // runs of 300: probes find the new topic's keys; without them recall stays low
    const vector<float> short_runs = topic_runs_qkv(s, 272, 300, true);
    const vector<int> exact = run_brute(short_runs, s, k);
    double r_every[3];
    const int every[3] = {0, 4, 1};
    for (int u = 0; u < 3; u++) {
        cpu::TopkHeavyParams p;
        p.probe_every = every[u];
        r_every[u] = recall(run_heavy(short_runs, s, k, p), exact, s, k);
    }
    const vector<float> unweighted = topic_runs_qkv(s, 273, 1000, false);
    std::printf("  runs of 300: recall %.3f without probes, %.3f with one every 4 blocks, %.3f every block; "
                "keys of weight 1 (runs of 1000): %.3f\n",
                r_every[0], r_every[1], r_every[2], recall(run_heavy(unweighted, s, k), run_brute(unweighted, s, k), s, k));
    EXPECT_GT(r_every[1], r_every[0] + 0.1);
    EXPECT_GT(r_every[2], r_every[1] + 0.1);
}

// ---------------------------------------------------------------------------
// ivf

TEST(TopkIvf, ReturnsWellFormedCausalRowsOnEdgeShapes) {
    // (T <= 64: every row before the first epoch; 520 crosses the epochs 128, 256 and 512)
    expect_well_formed_rows_on_edge_shapes(
        [](const vector<float>& qkv, const Shape& s, int k, int budget) {
            return run_ivf(qkv, s, k, small_ivf_params(budget));
        },
        [](const vector<float>& qkv, const Shape& s, int k) { return run_ivf(qkv, s, k); },
        {1, 2, 3, 5, 63, 64, 65, 128, 200, 333, 520}, 330);
}

TEST(TopkIvf, WithABudgetOfEveryKeyEqualsBruteBitForBit) {
    expect_every_key_budget_equals_brute(
        [](const vector<float>& qkv, const Shape& s, int k, int cluster_size) {
            cpu::TopkIvfParams p = small_ivf_params(s.T);
            p.cluster_size = cluster_size;  // 0: 1.5 sqrt(S)
            return run_ivf(qkv, s, k, p);
        },
        {1, 8, 64, 0}, 341);
    // the default epochs and clusters, past the first epoch
    const Shape longer{1, 2200, 32, 1};
    const vector<float> qkv = sphere_mixture_qkv(longer, 345, 16, 3.0f, 0.3f);
    cpu::TopkIvfParams p;
    p.budget = longer.T;
    EXPECT_EQ(run_ivf(qkv, longer, 16, p), run_brute(qkv, longer, 16));
}

TEST(TopkIvf, RowsDependOnlyOnTheirPast) {
    // cut in the middle of an epoch (256..511), on its last row and on its first
    for (int P : {389, 255, 256})
        expect_rows_depend_only_on_their_past(
            [](const vector<float>& qkv, const Shape& s) { return run_ivf(qkv, s, 8, small_ivf_params(24)); }, 351, P);
}

// The build against its definition: epochs double from first_epoch; each epoch's clusters
// partition its keys, ascending; the keys before its start are those of a cluster of the
// epoch before, cut into pieces of at most the cut size (the first epoch: of one cluster);
// a centroid is the mean of its keys before the start; a later key is in the cluster of the
// nearest centroid (distances in double, to a tolerance for the fp32 search's rounding);
// the panel holds each cluster's keys in order.
TEST(TopkIvf, ClustersFollowTheirDefinition) {
    const Shape s{1, 1100, 24, 1};
    const int HS = s.HS();
    const vector<float> qkv = sphere_mixture_qkv(s, 361, 12, 3.0f, 0.4f);
    for (int cluster_size : {1, 7, 40, 0}) {  // 0: 1.5 sqrt(S) keys at epoch start S (at least 16)
        cpu::TopkIvfParams p = small_ivf_params(0);
        p.cluster_size = cluster_size;
        const vector<cpu::TopkIvfEpoch> epochs = cpu::topk_ivf_head_build(key_of(qkv, s, 0, 0, 0), 3 * (size_t)s.C, s.T, HS, p);
        ASSERT_EQ(epochs.size(), 5u);  // 64, 128, 256, 512, 1024
        vector<int> previous(s.T, 0);  // each key's cluster in the epoch before (one cluster first)
        for (size_t e = 0; e < epochs.size(); e++) {
            const cpu::TopkIvfEpoch& ep = epochs[e];
            EXPECT_EQ(ep.start, 64 << e);
            EXPECT_EQ(ep.end, std::min(s.T, 128 << e));
            vector<int> cluster_of(ep.end, -1);
            for (int c = 0; c < ep.num_clusters; c++) {
                int before = 0, parent = -1;
                vector<double> mean(HS, 0.0);
                for (int u = ep.key_start[c]; u < ep.key_start[c + 1]; u++) {
                    const int j = ep.keys[u];
                    ASSERT_TRUE(j >= 0 && j < ep.end && cluster_of[j] < 0) << "key " << j;
                    if (u > ep.key_start[c]) {
                        EXPECT_LT(ep.keys[u - 1], j);
                    }
                    cluster_of[j] = c;
                    if (j >= ep.start) continue;
                    if (parent < 0) parent = previous[j];
                    EXPECT_EQ(previous[j], parent) << "epoch " << e << " cluster " << c << ": keys of two earlier clusters";
                    before++;
                    for (int d = 0; d < HS; d++) mean[d] += key_of(qkv, s, 0, 0, j)[d];
                }
                ASSERT_GE(before, 1) << "epoch " << e << " cluster " << c;
                EXPECT_LE(before, cpu::topk_ivf_cluster_size(p, ep.start)) << "epoch " << e << " cluster " << c;
                for (int d = 0; d < HS; d++)
                    EXPECT_NEAR(ep.centroids[(size_t)c * HS + d], mean[d] / before, 1e-5) << "epoch " << e << " c " << c;
                // the panel: key u of the cluster in chunk u / 8, lane u % 8
                const int n = ep.key_start[c + 1] - ep.key_start[c];
                for (int u = 0; u < n; u++)
                    for (int d = 0; d < HS; d++)
                        ASSERT_EQ(ep.panel[((size_t)(ep.chunk_start[c] + u / 8) * HS + d) * 8 + u % 8],
                                  key_of(qkv, s, 0, 0, ep.keys[ep.key_start[c] + u])[d]);
            }
            for (int j = 0; j < ep.end; j++) ASSERT_GE(cluster_of[j], 0) << "key " << j << " in no cluster";
            // the epoch's own keys: the nearest centroid
            auto dist2 = [&](int j, int c) {
                double sum = 0.0;
                for (int d = 0; d < HS; d++) {
                    const double x = (double)key_of(qkv, s, 0, 0, j)[d] - ep.centroids[(size_t)c * HS + d];
                    sum += x * x;
                }
                return sum;
            };
            for (int j = ep.start; j < ep.end; j++) {
                double best = INFINITY;
                for (int c = 0; c < ep.num_clusters; c++) best = std::min(best, dist2(j, c));
                EXPECT_LE(dist2(j, cluster_of[j]), best + 1e-4 * (1.0 + best)) << "epoch " << e << " key " << j;
            }
            for (int j = 0; j < ep.end; j++) previous[j] = cluster_of[j];
        }
    }
}

// Each row against its definition, recomputed from the build: its clusters in the order
// of q . c (in double here; rows where two of the scores that decide the order lie within
// 1e-4 of each other are skipped, as fp32 may order them either way), whole clusters'
// keys j < i0 until the budget is spent, then the row's own keys i0..i; its list the top k
// of those by a full sort. A mutant that probes one cluster too few fails it.
TEST(TopkIvf, EachRowIsTheTopKOfTheClustersItProbes) {
    const Shape s{1, 900, 32, 1};
    const int HS = s.HS(), k = 8;
    const vector<float> qkv = sphere_mixture_qkv(s, 371, 10, 3.0f, 0.4f);
    for (int budget : {0, 20, 60}) {
        const cpu::TopkIvfParams p = small_ivf_params(budget);
        const vector<int> idx = run_ivf(qkv, s, k, p);
        const vector<int> exact = run_brute(qkv, s, k);
        const vector<cpu::TopkIvfEpoch> epochs = cpu::topk_ivf_head_build(key_of(qkv, s, 0, 0, 0), 3 * (size_t)s.C, s.T, HS, p);
        int checked = 0, skipped = 0;
        for (int i = k; i < s.T; i++) {
            const int* row = idx.data() + cpu::topk_idx_row(0, 0, i, s.T, s.NH, k);
            if (i < p.first_epoch) {
                EXPECT_TRUE(std::equal(row, row + k, exact.begin() + cpu::topk_idx_row(0, 0, i, s.T, s.NH, k))) << "i=" << i;
                continue;
            }
            const cpu::TopkIvfEpoch* ep = nullptr;
            for (const cpu::TopkIvfEpoch& e : epochs)
                if (e.start <= i && i < e.end) ep = &e;
            ASSERT_NE(ep, nullptr);
            const int i0 = i / 64 * 64;
            const float* q = query_of(qkv, s, 0, 0, i);
            vector<std::pair<double, int>> order;  // (-q . c, c) over clusters with keys j < i0
            vector<int> causal(ep->num_clusters);
            for (int c = 0; c < ep->num_clusters; c++) {
                causal[c] = (int)(std::lower_bound(ep->keys.begin() + ep->key_start[c], ep->keys.begin() + ep->key_start[c + 1], i0) -
                                  (ep->keys.begin() + ep->key_start[c]));
                if (causal[c] == 0) continue;
                double dot = 0.0;
                for (int d = 0; d < HS; d++) dot += (double)q[d] * ep->centroids[(size_t)c * HS + d];
                order.push_back({-dot, c});
            }
            std::sort(order.begin(), order.end());
            const int row_budget = std::max(budget, k - (i + 1 - i0));
            vector<int> cand;
            bool near_tie = false;
            for (int u = 0, spent = 0; u < (int)order.size() && spent < row_budget; u++) {
                if (u + 1 < (int)order.size() && order[u + 1].first - order[u].first < 1e-4) near_tie = true;
                if (u > 0 && order[u].first - order[u - 1].first < 1e-4) near_tie = true;
                const int c = order[u].second;
                cand.insert(cand.end(), ep->keys.begin() + ep->key_start[c], ep->keys.begin() + ep->key_start[c] + causal[c]);
                spent += causal[c];
            }
            if (near_tie) {
                skipped++;
                continue;
            }
            for (int j = i0; j <= i; j++) cand.push_back(j);
            vector<std::pair<float, int>> ranked;  // (-score, j): a full sort, ties to the smaller key
            for (int j : cand) ranked.push_back({-knngpt::attention_dot(q, key_of(qkv, s, 0, 0, j), HS), j});
            std::sort(ranked.begin(), ranked.end());
            vector<int> want;
            for (int u = 0; u < k; u++) want.push_back(ranked[u].second);
            std::sort(want.begin(), want.end());
            EXPECT_TRUE(std::equal(row, row + k, want.begin())) << "budget " << budget << " i=" << i;
            checked++;
        }
        std::printf("  budget %d: %d rows checked, %d with near-tied centroid scores skipped\n", budget, checked, skipped);
        EXPECT_GT(checked, 700);
    }
}

TEST(TopkIvf, RecallOnClusteredKeysIsAboveAFloor) {
    // the default parameters: exact rows below 1024, epochs from 1024 and 2048
    expect_recall_on_bench_clusters(
        "ivf",
        [](const vector<float>& qkv, const Shape& s, int k, cpu::TopkStats* stats) {
            return run_ivf(qkv, s, k, cpu::TopkIvfParams(), stats);
        },
        381, 0.9, 0.2);
}

TEST(TopkIvf, RecallGrowsWithTheBudget) {
    expect_recall_grows_with_the_budget(
        [](const vector<float>& qkv, const Shape& s, int k, int budget) {
            return run_ivf(qkv, s, k, small_ivf_params(budget));
        },
        391);
}

// ---------------------------------------------------------------------------
// what the inverted-file indexes share (topk_probe.h)

// topk_pop_best hands out the entries in the order (key desc, index asc), never an
// INT32_MIN, then -1; on keys with many ties, and at lengths around a vector's 16
TEST(TopkProbe, PopBestGivesTheLargestFirstAndTiesToTheEarlierOne) {
    std::mt19937 gen(401);
    for (int n : {1, 2, 15, 16, 17, 33, 240}) {
        for (int trial = 0; trial < 20; trial++) {
            vector<int32_t> key(n);
            for (int32_t& x : key) {
                const int32_t base = trial % 2 ? INT32_MAX - 8 : 0;  // near the top of the range, or around 0
                x = gen() % 3 == 0 ? INT32_MIN : base + (int32_t)(gen() % 7) - 3;
            }
            vector<int> want;
            for (int u = 0; u < n; u++)
                if (key[u] != INT32_MIN) want.push_back(u);
            std::stable_sort(want.begin(), want.end(), [&](int a, int b) { return key[a] > key[b]; });
            vector<int32_t> work = key;
            for (int w : want) ASSERT_EQ(cpu::topk_pop_best(work.data(), n), w) << "n=" << n;
            EXPECT_EQ(cpu::topk_pop_best(work.data(), n), -1);
        }
    }
    const float v[5] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
    EXPECT_EQ(cpu::topk_first_largest(v, 5), 1);
}

// TopkScoredKeys: keys offered in batches of any size, with settles between them, give
// the top k of all of them by (score desc, key asc), as TopkSelector does; scores with
// many ties, -0 beside +0, and keys in no particular order
TEST(TopkProbe, ScoredKeysKeepTheTopKOfEveryKeyOffered) {
    std::mt19937 gen(411);
    for (int trial = 0; trial < 300; trial++) {
        const int k = 1 + gen() % 40, n = k + gen() % 300;
        vector<float> score(n);
        vector<int> key(n);
        for (int u = 0; u < n; u++) {
            const int r = gen() % 9;
            score[u] = r == 0 ? -0.0f : r == 1 ? 0.0f : (float)((int)(gen() % 11) - 5) * 0.25f;
            key[u] = u;
        }
        std::shuffle(key.begin(), key.end(), gen);
        cpu::TopkScoredKeys cand(k, n);
        cpu::TopkSelector reference(k);
        for (int u = 0; u < n;) {
            const int count = std::min(n - u, 1 + (int)(gen() % 40));
            if (gen() % 2) {
                cand.append(score.data() + u, key.data() + u, 0, count);
            } else {  // keys first_key + v, as the own block's
                const int first = 1000 + u;
                for (int v = 0; v < count; v++) key[u + v] = first + v;
                cand.append(score.data() + u, nullptr, first, count);
            }
            for (int v = u; v < u + count; v++) reference.offer(score[v] + 0.0f, key[v]);
            u += count;
            if (gen() % 3 == 0) cand.settle();
        }
        vector<int> got(k), want(k);
        cand.write(got.data());
        reference.write_sorted(want.data());
        ASSERT_EQ(got, want) << "trial " << trial << " k=" << k << " n=" << n;
    }
}

// ---------------------------------------------------------------------------
// forced keys: the local window and the attention sinks joined to the top k

TEST(ForcedKeys, EachRowIsTheSortedUnionOfItsTopKItsSinksAndItsWindow) {
    for (int T : {1, 5, 40, 130}) {
        const Shape s{2, T, 16, 2};
        const vector<float> qkv = uniform_qkv(s, 60 + T);
        for (int k : {1, 4, 16})
            for (const auto& [window, sinks] : std::vector<std::pair<int, int>>{
                     {0, 0}, {3, 0}, {0, 2}, {4, 3}, {1, 1}, {20, 20}, {T + 3, 1}}) {
                const vector<int> topk = run_brute(qkv, s, k);
                const int K = k + window + sinks + 2;  // a wider row: its last slots must stay as they were
                vector<int> lists(s.idx_size(K), -7);
                cpu::add_forced_keys(lists.data(), K, topk.data(), k, s.B, s.T, s.NH, window, sinks);
                for (size_t row = 0; row < s.rows(); row++) {
                    const int i = (int)(row % T);
                    std::set<int> keys;
                    for (int t = 0; t < k; t++)
                        if (topk[row * k + t] >= 0) keys.insert(topk[row * k + t]);
                    for (int j = 0; j < std::min(sinks, i + 1); j++) keys.insert(j);
                    for (int j = std::max(0, i - window + 1); j <= i; j++) keys.insert(j);
                    vector<int> want(keys.begin(), keys.end());
                    want.resize(k + window + sinks, -1);
                    want.insert(want.end(), {-7, -7});
                    ASSERT_EQ(vector<int>(lists.begin() + row * K, lists.begin() + (row + 1) * K), want)
                        << "T " << T << " k " << k << " window " << window << " sinks " << sinks << " i " << i;
                }
            }
    }
}

// ---------------------------------------------------------------------------
// dispatch, statistics, threads

TEST(TopkEntries, EachEntryRunsItsIndex) {
    const Shape s{1, 140, 32, 2};
    const vector<float> qkv = clustered_qkv(s, 101, 3, 10, 40);
    const int k = 6;
    cpu::LshParams p;
    p.seed = 5;
    vector<int> idx(s.idx_size(k));
    cpu::topk_search_brute(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, p, nullptr);
    EXPECT_EQ(idx, run_brute(qkv, s, k));
    cpu::topk_search_lsh(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, p, nullptr);
    EXPECT_EQ(idx, run_lsh(qkv, s, k, p));
    cpu::topk_search_heavy(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, p, nullptr);
    EXPECT_EQ(idx, run_heavy(qkv, s, k));
    // ivf past its first epoch (up to 1024 keys it is brute force): not another index's lists
    const Shape longer{1, 1300, 16, 1};
    const vector<float> mixture = sphere_mixture_qkv(longer, 102, 12, 3.0f, 0.4f);
    vector<int> ivf_idx(longer.idx_size(k));
    cpu::TopkStats stats;
    cpu::topk_search_ivf(ivf_idx.data(), mixture.data(), longer.B, longer.T, longer.C, longer.NH, k, p, &stats);
    EXPECT_EQ(ivf_idx, run_ivf(mixture, longer, k));
    EXPECT_NE(ivf_idx, run_brute(mixture, longer, k));
    EXPECT_GT(stats.blocks_total, 0);
}

TEST(TopkEntries, BruteTakesTheInt8PassWhereItPaysWithTheSameLists) {
    // below kTopkInt8MinKeys the sgemm pass, from there the int8 one where AMX or VNNI has
    // it: the reference's lists either way; the int8 pass rescores other keys than sgemm's,
    // which tells the passes apart
    const int k = 16;
    for (int T : {cpu::kTopkInt8MinKeys - 1, cpu::kTopkInt8MinKeys + 5}) {
        const Shape s{1, T, 64, 2};
        const vector<float> qkv = sphere_mixture_qkv(s, 103, 16, 3.0f, 0.3f);
        vector<int> idx(s.idx_size(k));
        cpu::TopkStats entry_stats, sgemm_stats, int8_stats;
        cpu::topk_search_brute(idx.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, cpu::LshParams(), &entry_stats);
        EXPECT_EQ(idx, run_brute_reference(qkv, s, k)) << "T=" << T;
        run_brute_sgemm(qkv, s, k, &sgemm_stats);
        run_int8(qkv, s, k, &int8_stats);
        ASSERT_NE(sgemm_stats.scores_rescored, int8_stats.scores_rescored) << "the passes cannot be told apart";
        const bool int8 = cpu::topk_int8_kernel() != cpu::TopkInt8Kernel::Plain && T >= cpu::kTopkInt8MinKeys;
        EXPECT_EQ(entry_stats.scores_rescored, int8 ? int8_stats.scores_rescored : sgemm_stats.scores_rescored)
            << "T=" << T << ": expected the " << (int8 ? "int8" : "sgemm") << " pass";
    }
    std::printf("  int8 kernel here: %s\n", cpu::topk_int8_kernel_name(cpu::topk_int8_kernel()));
}

TEST(TopkAllIndices, ResultsAndStatisticsDoNotDependOnTheThreadCount) {
    const Shape s{2, 260, 64, 4};
    const vector<float> qkv = clustered_qkv(s, 111, 4, 30, 90);
    const int k = 9;
    cpu::LshParams p;
    const vector<float> interleaved = sphere_mixture_qkv(s, 112, 8, 3.0f, 0.3f);
    vector<int> results[2][6];
    cpu::TopkStats stats[2][6];
    const int saved = omp_get_max_threads();
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t == 0 ? 1 : 3);
        results[t][0] = run_brute_sgemm(qkv, s, k, &stats[t][0]);
        results[t][1] = run_lsh(qkv, s, k, p, &stats[t][1]);
        results[t][2] = run_brute_reference(interleaved, s, k, &stats[t][2]);
        results[t][3] = run_int8(interleaved, s, k, &stats[t][3]);
        results[t][4] = run_heavy(interleaved, s, k, heavy_params(128, 16), &stats[t][4]);
        results[t][5] = run_ivf(interleaved, s, k, small_ivf_params(40), &stats[t][5]);
    }
    omp_set_num_threads(saved);
    for (int m = 0; m < 6; m++) {
        EXPECT_EQ(results[0][m], results[1][m]) << "index " << m;
        EXPECT_EQ(stats[0][m].scores_computed, stats[1][m].scores_computed) << "index " << m;
        EXPECT_EQ(stats[0][m].blocks_visited, stats[1][m].blocks_visited) << "index " << m;
        EXPECT_EQ(stats[0][m].scores_rescored, stats[1][m].scores_rescored) << "index " << m;
    }
}

// attention_scores<W> (kernels/common/attention_score.h: on an AVX2 host, W = 8, 16, 24,
// 32 run the chains in vector lanes over transposed 8-float loads) equals attention_score
// bit for bit, for every head size, lane count and key stride, the unused lanes included.
template <int W>
void expect_scores_equal_one_by_one(const vector<float>& q, const vector<float>& k, int keys, int stride, int HS) {
    const float tau = knngpt::attention_tau(HS);
    for (int count = 1; count <= W; count++) {
        const float* ptrs[W];
        for (int w = 0; w < W; w++) ptrs[w] = k.data() + (size_t)((w * 7 + count) % keys) * stride;
        float s[W];
        knngpt::attention_scores<W>(s, q.data(), ptrs, count, HS, tau);
        for (int w = 0; w < count; w++) {
            const float one = knngpt::attention_score(q.data(), ptrs[w], HS, tau);
            ASSERT_EQ(std::memcmp(&s[w], &one, sizeof one), 0) << "W " << W << ", HS " << HS << ", lane " << w
                                                               << " of " << count;
        }
    }
}

TEST(AttentionScores, SideBySideChainsEqualOneByOne) {
    std::mt19937 gen(91);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int HS = 1; HS <= 130; HS += (HS < 20 ? 1 : 7)) {
        const int keys = 40, stride = HS + 3;  // rows not 32-byte aligned
        vector<float> q(HS), k((size_t)keys * stride);
        for (float& x : q) x = normal(gen) * 3.0f;
        for (float& x : k) x = normal(gen);
        expect_scores_equal_one_by_one<3>(q, k, keys, stride, HS);
        expect_scores_equal_one_by_one<8>(q, k, keys, stride, HS);
        expect_scores_equal_one_by_one<16>(q, k, keys, stride, HS);
        expect_scores_equal_one_by_one<24>(q, k, keys, stride, HS);
    }
}
