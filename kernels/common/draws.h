// kernels/common/draws.h — where every random draw of knngpt lives: the whole
// Philox counter layout (ALGORITHMS.md §9.3), defined once for both backends.
//
//   key     = the 64-bit --attn-seed
//   counter = (step, site, row, (purpose << 28) | index)      index < 2^28
//
// Every draw is a pure function of (seed, step, layer, head, global batch row,
// query, purpose, index): forward and backward, CPU and CUDA, W processes of B
// rows, one of W B rows and one of B rows with W micro-batches a step regenerate the
// same numbers. A Philox call gives four 32-bit words; a draw uses words 0 (and 1
// for 64 bits) or, where a sampler takes two fp64 uniforms per call, words 0,1 and
// 2,3, so no two draws share a word. The parts of the counter are laid out below,
// each above its definitions: purposes and their index ranges, steps, sites.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/philox.h"

namespace knngpt {

// purpose and index: one stream per use:
//   DRAW_HEAD_GUMBEL, DRAW_GEOMETRIC_SKIP, DRAW_TRUNCATED_GUMBEL
//                   lazy Gumbel sample number n owns a block of calls per purpose
//                   (lazy_gumbel.h); the `gumbel` forward uses the even numbers
//                   gumbel_forward_sample_number, the sampled backward the odd
//                   numbers sampled_grad_sample_number, so the backward's samples
//                   are fresh (§9.1)
//   DRAW_TAIL_POSITION    index t: tail sample t of a knn-tail row
//   DRAW_GRADIENT_TAIL    index t: tail sample t of a row of the stratified backward
//                         (fresh keys, apart from the forward's tail)
//   DRAW_GRADIENT_SAMPLE  index m < kWalkStartDrawIndex: exact-row backward sample m
//                         of a row; kWalkStartDrawIndex + c N + n at the head's site:
//                         the start of signed-start walk n of column c (N = T s)
//   DRAW_HASH             LSH: m (HS + 1) + d, entry d of hyperplane m; KMV: f (D + 2) + c
//   DRAW_LIGHT_SAMPLE     index t: light sample t of a KMV row
//
// What a draw is for: the top 4 bits of the counter's last word.
enum DrawPurpose : uint32_t {
    DRAW_HEAD_GUMBEL = 0,       // Gumbel noise on the top-k keys (lazy Gumbel)
    DRAW_TAIL_POSITION = 1,     // uniform tail keys (knn-tail)
    DRAW_TRUNCATED_GUMBEL = 2,  // truncated Gumbels of the tail (lazy Gumbel)
    DRAW_GEOMETRIC_SKIP = 3,    // geometric skips over the tail (lazy Gumbel)
    DRAW_GRADIENT_SAMPLE = 4,   // sampled attention gradients
    DRAW_HASH = 5,              // LSH hyperplanes, KMV hash functions
    DRAW_LIGHT_SAMPLE = 6,      // KMV light-part samples
    DRAW_GRADIENT_TAIL = 7,     // uniform tail keys of the stratified backward
};

// step: the trainer's call, in three namespaces that never meet
//   training    the optimizer step t (from 0), the same for all its micro-batches (< 2^30)
//   sampling    kSamplingDrawStep + position of the generated token
//   evaluation  kEvaluationDrawStep + validation batch number, so every
//               evaluation draws the same samples
//
// Step namespaces (the training steps count from 0 below kSamplingDrawStep).
constexpr uint32_t kSamplingDrawStep = 0x40000000u;
constexpr uint32_t kEvaluationDrawStep = 0x80000000u;

// The step of every forward of optimizer step `step` (from 0), whichever micro-batch.
inline uint32_t training_draw_step(long step) { return (uint32_t)step; }
// The global batch row of a forward's local row 0: micro-batch `micro` of a step,
// on rank `rank` of `world` processes of B rows each, holds rows
// (micro * world + rank) * B .. + B - 1 of the step's whole batch. Evaluation
// passes micro 0 (the validation batch number is in its step), sampling 0.
inline long long draw_batch0(int micro, int world, int rank, int B) {
    return ((long long)micro * world + rank) * B;
}
// Whether global batch rows below batch0_end fit the counter at sequence length
// T: every row index (batch0 + b) * T + query < 2^32, i.e. batch0_end * T <= 2^32,
// and batch0 an int.
inline bool draw_rows_fit(long long batch0_end, int T) {
    return batch0_end >= 0 && batch0_end <= 0x7FFFFFFFll && batch0_end * (long long)T <= (1ll << 32);
}
// The step of the forward that generates token `position` of a sample.
inline uint32_t sampling_draw_step(int position) { return kSamplingDrawStep + (uint32_t)position; }
// The step of validation batch `batch` (the same at every evaluation).
inline uint32_t evaluation_draw_step(int batch) { return kEvaluationDrawStep + (uint32_t)batch; }

// site, row: which attention row a draw belongs to; b is a forward's local batch
//   row, batch0 the global row of its row 0 in the step's whole batch (draw_batch0),
//   so a step draws the same samples for a sequence however its batch is split over
//   processes and micro-batches; (batch0 + B) * T <= 2^32 (draw_rows_fit)
//   per query row   (layer * NH + head, (batch0 + b) * T + query)      row_draw_site
//   per head        the site of the head's query 0: row (batch0 + b) * T  head_draw_site
//                   (signed-start walk starts, KMV hash functions)
//   LSH tables      (layer * NH + head, table)                         lsh_table_draw_site
//                   (one set of hyperplanes serves every batch row of a head; LSH
//                   and KMV both hash with DRAW_HASH, and their sites can coincide
//                   (row (batch0 + b) T equal to a table number), but never in one
//                   forward)
//
// Where a random stream lives: one (seed, step, site, row).
struct DrawSite {
    uint64_t seed;
    uint32_t step, layer_head, batch_query;
};

// row: the global batch row, batch0 + b (draw_batch0); unsigned arithmetic, so any
// row that draw_rows_fit admits.
KNNGPT_HD DrawSite row_draw_site(uint64_t seed, uint32_t step, int layer, int NH, int h, int row, int T, int i) {
    return DrawSite{seed, step, (uint32_t)(layer * NH + h), (uint32_t)row * (uint32_t)T + (uint32_t)i};
}
KNNGPT_HD DrawSite head_draw_site(uint64_t seed, uint32_t step, int layer, int NH, int h, int row, int T) {
    return row_draw_site(seed, step, layer, NH, h, row, T, 0);
}
KNNGPT_HD DrawSite lsh_table_draw_site(uint64_t seed, uint32_t step, int layer, int NH, int h, int table) {
    return DrawSite{seed, step, (uint32_t)(layer * NH + h), (uint32_t)table};
}

// The four words of draw `index` of `purpose` at `site`.
KNNGPT_HD Philox4 philox_draw(const DrawSite& site, uint32_t purpose, uint32_t index) {
    Philox4 c{{site.step, site.layer_head, site.batch_query, (purpose << 28) | (index & 0x0FFFFFFFu)}};
    return philox4x32_10(c, (uint32_t)site.seed, (uint32_t)(site.seed >> 32));
}

// DRAW_GRADIENT_SAMPLE: exact-row samples take the indices below this, the
// signed-start walk starts the ones from it.
constexpr uint32_t kWalkStartDrawIndex = 1u << 27;
KNNGPT_HD uint32_t walk_start_draw_index(int column, long long walks, long long n) {
    return kWalkStartDrawIndex + (uint32_t)(column * walks + n);
}

// Lazy Gumbel sample numbers: even for the gumbel forward, odd for the sampled backward.
KNNGPT_HD uint32_t gumbel_forward_sample_number(uint32_t n) { return 2u * n; }
KNNGPT_HD uint32_t sampled_grad_sample_number(uint32_t m) { return 2u * m + 1u; }

// Philox calls per purpose reserved for one lazy Gumbel sample of a row with n_i
// keys: sample number n owns calls n D .. n D + D - 1, D = ceil(n_i / 2).
KNNGPT_HD uint32_t lazy_gumbel_calls_per_sample(int n_i) { return (uint32_t)(n_i + 1) / 2; }

// How many lazy Gumbel sample numbers a row with n_i keys supports: 2^28 / ceil(n_i / 2).
KNNGPT_HD uint64_t lazy_gumbel_sample_capacity(int n_i) {
    return (1ull << 28) / (uint64_t)lazy_gumbel_calls_per_sample(n_i < 1 ? 1 : n_i);
}

// Whether the sampled backward's draws fit their index ranges at sequence length T:
// a row draws s samples, or with signed-start dV up to all N = T s walks of one column
// (below kWalkStartDrawIndex, and as lazy Gumbel sample numbers 2m + 1), and the walk
// starts take kWalkStartDrawIndex + c N + n for the HS columns.
inline bool sampled_grad_draws_fit(int T, int HS, int samples, bool signed_start_dv, bool lazy_gumbel) {
    const long long walks = (long long)T * samples;
    const long long row_samples_max = signed_start_dv ? (walks > samples ? walks : samples) : samples;
    const bool exact_fits = row_samples_max <= (long long)kWalkStartDrawIndex &&
                            (!signed_start_dv || (long long)HS * walks <= (long long)kWalkStartDrawIndex);
    const bool lazy_fits = 2ull * (uint64_t)row_samples_max <= lazy_gumbel_sample_capacity(T);
    return exact_fits && (!lazy_gumbel || lazy_fits);
}

// How far a draw was from being decided otherwise: the smallest gap of the
// comparisons that decided it (a target against a cumulative sum, two perturbed
// scores, a skip's quotient against an integer), relative to the size of what was
// compared and divided by how much the computation before the comparison can
// magnify a relative error of its inputs (`amplification`: n for a sum of n
// terms, 1 / (1 - p) for log(1 - p), ...). The CPU computes the fp64
// transcendentals with glibc, a GPU with its own exp and log, which agree to an
// ulp or two (~1e-16 relative; the lazy Gumbel sampler's per-draw logarithms are
// sampler_log.h's, the same bits everywhere, and their margins are kept anyway): so a draw whose margin exceeds
// kDrawMarginOfAgreement picks the same key on every device, and tests that demand
// equal samples natively check first that every draw clears it (a draw closer
// than that could go either way; on random inputs that happens with probability
// ~1e-12 per comparison). tests/test_draw_margin.cpp checks the samplers record
// every deciding comparison: perturbing their exp and log moves only draws whose
// margin is of the perturbation's order. Only tests ask for margins; the kernels
// pass none.
constexpr double kDrawMarginOfAgreement = 1e-12;

struct DrawMargin {
    double smallest = (double)INFINITY;
    // the comparison a > b (or a < b) of two fp64 values, computed from terms whose
    // magnitudes add up to `magnitude` (e.g. |s| + |g| for a = s + g)
    KNNGPT_HD void compare(double a, double b, double magnitude = 0.0, double amplification = 1.0) {
        if (!(a > -(double)INFINITY) || !(b > -(double)INFINITY)) return;  // against -inf: never close
        const double scale = fmax(fmax(1.0, magnitude), fmax(fabs(a), fabs(b)));
        smallest = fmin(smallest, fabs(a - b) / (scale * amplification));
    }
    // floor(x): how close x is to an integer (the integer just above decides too)
    KNNGPT_HD void floor_of(double x, double amplification = 1.0) {
        if (!(fabs(x) < 9007199254740992.0)) return;  // inf, or beyond 2^53: floor is x itself
        const double nearest = floor(x + 0.5);
        smallest = fmin(smallest, fabs(x - nearest) / (fmax(1.0, fabs(x)) * amplification));
    }
};

}  // namespace knngpt
