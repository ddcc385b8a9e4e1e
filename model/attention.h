// model/attention.h — AttnConfig and the dispatch over attention modes.
//
// AttnConfig is the typed attention setting of a run; the trainer fills it from its
// flags and checks which settings combine (train/attention_flags.h). The model
// calls attention_layer_forward / attention_layer_backward below once per layer, and
// they pick the backend ops for the configured mode (ALGORITHMS.md §9.1):
//
//   mode       forward                                   backward with exact gradients
//   exact      softmax over keys j <= i (flash style)    exact
//   knn        softmax over the top-k keys (§2)          exact gradient of the top-k softmax (§2.3)
//   knn-tail   top-k + m up-weighted tail samples (§3)   exact gradient with the samples fixed (§3.5)
//   gumbel     median of means of lazy Gumbel samples    none: needs sampled gradients
//   kmv        heavy keys (LSH) + sampled light part (§7) exact gradient with the samples fixed
//
// Sampled gradients replace every backward by the randomised estimators of §5,
// which estimate the gradient of EXACT attention (samples from the exact row, or
// from lazy Gumbel on the top-k set); after an approximate forward their Delta_i
// comes from its output, which shifts the dQ, dK means (§5.2). The stratified
// backward (after knn or knn-tail) estimates it too: each list's head exactly and
// the rest of the row from m fresh, up-weighted tail keys (§5.5).
//
// knn, knn-tail and kmv all produce key lists in one form, idx (B, NH, T, K)
// with log-weights logw (B, NH, T, K), and share the sparse softmax kernel. The
// head of a knn or knn-tail list is the top k joined by the forced keys, a local
// window and attention sinks, when the configuration has them.
// Every random draw is a Philox function of (seed, step, layer, head, batch,
// query, draw index) (kernels/common/draws.h): the caller names the step of each
// forward, and the layer's backward reuses it, so both see the same samples.
#pragma once
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/common/attention_params.h"
#include "model/attention_registry.h"
#include "model/backend.h"

namespace knngpt {

enum class AttnGradSource { Auto, ExactRow, LazyGumbel };

struct AttnConfig {
    AttnMode mode = AttnMode::Exact;
    int k = 16;     // nearest keys per query (kmv: the heavy-key budget)
    int tail = 0;   // m: tail samples (knn-tail) or light samples (kmv) per query
    TopkIndex index = TopkIndex::Brute;                 // the top-k search (model/attention_registry.h)
    int window = 0;  // the most recent keys every knn / knn-tail list holds besides its top k
    int sinks = 0;   // the first keys (attention sinks) every knn / knn-tail list holds
    AttnGrad grad = AttnGrad::Exact;                    // exact, sampled or stratified gradients
    int grad_samples = 16;                              // s: samples per query of the sampled gradients,
                                                        // m: tail samples per query of the stratified one
    AttnGradSource grad_source = AttnGradSource::Auto;  // where the sampled gradients draw from
    bool grad_signed_dv = false;                        // signed-start dV instead of row-wise
    int gumbel_groups = 3, gumbel_samples = 8;          // median-of-means groups x samples of gumbel
    KmvThreshold kmv_threshold = KmvThreshold::Absolute;  // kmv's heavy test (ALGORITHMS.md §7.4)
    int kmv_levels = 1;                                 // kmv's LSH width levels (§7.4; 1 = [P2]'s one width)
    float kmv_alpha = kKmvDefaultAlpha;                 // kmv's heavy exponent alpha (§7.4; [P2]'s 1/3)
    uint64_t seed = 0;                                  // key of every attention draw

    // do the lists hold forced keys (a window, sinks) besides the top k?
    bool forced_keys() const { return window > 0 || sinks > 0; }
    // slots of a list's head: the top k, and the forced keys of knn and knn-tail
    int head_size() const { return mode == AttnMode::Knn || mode == AttnMode::KnnTail ? k + window + sinks : k; }
    // slots per key list (0 when the mode keeps none)
    int list_size() const {
        switch (mode) {
            case AttnMode::Exact: return 0;
            case AttnMode::Knn: case AttnMode::Gumbel: return head_size();
            case AttnMode::KnnTail: case AttnMode::Kmv: return head_size() + tail;
        }
        return 0;
    }
    // does the backward need the top-k lists for lazy Gumbel samples?
    bool sampled_from_lazy_gumbel() const {
        if (grad != AttnGrad::Sampled) return false;
        if (grad_source == AttnGradSource::Auto) return mode != AttnMode::Exact;
        return grad_source == AttnGradSource::LazyGumbel;
    }
    // does any pass search the top-k keys (the forward's lists, or the sampler's)?
    bool uses_topk_index() const { return mode != AttnMode::Exact || sampled_from_lazy_gumbel(); }
    // is the index approximate (its lists need not be the exact top k)?
    bool index_is_approximate() const { return !topk_index_info(index).exact; }
};

// The rules an AttnConfig must keep, checked once here: the model refuses a
// configuration that breaks one (gpt_set_attention), and the trainer words each in
// terms of its flags (train/attention_flags.h).
enum class AttnProblem {
    None,
    KBelowOne,                // k < 1
    TailNegative,             // tail < 0
    TailWithoutTailMode,      // tail > 0 but the mode is neither knn-tail nor kmv
    KmvWithoutLightSamples,   // kmv with tail < 1
    KmvThresholdWithoutKmv,   // the relative kmv threshold with a mode other than kmv
    KmvLevelsOutOfRange,      // kmv_levels outside 1..8
    KmvLevelsWithoutKmv,      // more than one kmv width level with a mode other than kmv
    KmvAlphaOutOfRange,       // kmv_alpha not in (0, 4]
    KmvAlphaWithoutKmv,       // a kmv alpha other than 1/3 with a mode other than kmv
    GradSamplesBelowOne,      // grad_samples < 1
    ForcedKeysNegative,       // window < 0 or sinks < 0
    ForcedKeysWithoutKnn,     // a window or sinks with a mode other than knn or knn-tail
    ForcedKeysWithSampledGrad,  // a window or sinks with sampled gradients (their lazy Gumbel needs pure top-k lists)
    StratifiedWithoutKnn,     // the stratified backward after a mode other than knn or knn-tail
    GumbelCountsBelowOne,     // gumbel_groups or gumbel_samples < 1
    LazyGumbelNeedsExactIndex,  // lazy Gumbel samples (gumbel forward or sampler) on an approximate index:
                                // exact only when the top-k set is the top k (ALGORITHMS.md §4.3)
    GumbelWithoutSampledGrad,   // gumbel has no exact gradient (its samples are discrete)
    ModeNotInBuild,             // this build has no kernels for the mode (model/attention_registry.h)
    IndexNotInBuild,            // this build has no kernels for the top-k index named
    TooManyGumbelGroups,        // more median-of-means groups than this backend's gumbel kernel holds
};

inline AttnProblem attn_config_problem(const AttnConfig& a) {
    if (a.k < 1) return AttnProblem::KBelowOne;
    if (a.tail < 0) return AttnProblem::TailNegative;
    if (a.tail > 0 && a.mode != AttnMode::KnnTail && a.mode != AttnMode::Kmv) return AttnProblem::TailWithoutTailMode;
    if (a.mode == AttnMode::Kmv && a.tail < 1) return AttnProblem::KmvWithoutLightSamples;
    if (a.kmv_threshold != KmvThreshold::Absolute && a.mode != AttnMode::Kmv) return AttnProblem::KmvThresholdWithoutKmv;
    if (!kmv_width_levels_ok(a.kmv_levels)) return AttnProblem::KmvLevelsOutOfRange;
    if (a.kmv_levels != 1 && a.mode != AttnMode::Kmv) return AttnProblem::KmvLevelsWithoutKmv;
    if (!kmv_alpha_ok(a.kmv_alpha)) return AttnProblem::KmvAlphaOutOfRange;
    if (a.kmv_alpha != kKmvDefaultAlpha && a.mode != AttnMode::Kmv) return AttnProblem::KmvAlphaWithoutKmv;
    if (a.grad_samples < 1) return AttnProblem::GradSamplesBelowOne;
    const bool knn_lists = a.mode == AttnMode::Knn || a.mode == AttnMode::KnnTail;
    if (a.window < 0 || a.sinks < 0) return AttnProblem::ForcedKeysNegative;
    if (a.forced_keys() && !knn_lists) return AttnProblem::ForcedKeysWithoutKnn;
    if (a.forced_keys() && a.grad == AttnGrad::Sampled) return AttnProblem::ForcedKeysWithSampledGrad;
    if (a.grad == AttnGrad::Stratified && !knn_lists) return AttnProblem::StratifiedWithoutKnn;
    if (a.gumbel_groups < 1 || a.gumbel_samples < 1) return AttnProblem::GumbelCountsBelowOne;
    if (a.index_is_approximate() && (a.mode == AttnMode::Gumbel || a.sampled_from_lazy_gumbel()))
        return AttnProblem::LazyGumbelNeedsExactIndex;
    if (a.mode == AttnMode::Gumbel && a.grad == AttnGrad::Exact) return AttnProblem::GumbelWithoutSampledGrad;
    if (!in_this_build(attn_mode_info(a.mode).builds)) return AttnProblem::ModeNotInBuild;
    if (a.uses_topk_index() && !in_this_build(topk_index_info(a.index).builds)) return AttnProblem::IndexNotInBuild;
    const AttnCapabilities can = ops::attention_capabilities();
    if (a.mode == AttnMode::Gumbel && a.gumbel_groups > can.max_gumbel_groups) return AttnProblem::TooManyGumbelGroups;
    return AttnProblem::None;
}

// The rule a problem breaks, in the configuration's own terms (the trainer has its
// flags' wording).
inline const char* attn_problem_text(AttnProblem p) {
    switch (p) {
        case AttnProblem::None: return "none";
        case AttnProblem::KBelowOne: return "k < 1";
        case AttnProblem::TailNegative: return "tail < 0";
        case AttnProblem::TailWithoutTailMode: return "tail samples with a mode other than knn-tail or kmv";
        case AttnProblem::KmvWithoutLightSamples: return "kmv without light samples";
        case AttnProblem::KmvThresholdWithoutKmv: return "a kmv threshold with a mode other than kmv";
        case AttnProblem::KmvLevelsOutOfRange: return "kmv width levels outside 1..8";
        case AttnProblem::KmvLevelsWithoutKmv: return "kmv width levels with a mode other than kmv";
        case AttnProblem::KmvAlphaOutOfRange: return "a kmv alpha outside (0, 4]";
        case AttnProblem::KmvAlphaWithoutKmv: return "a kmv alpha with a mode other than kmv";
        case AttnProblem::GradSamplesBelowOne: return "grad_samples < 1";
        case AttnProblem::ForcedKeysNegative: return "window or sinks < 0";
        case AttnProblem::ForcedKeysWithoutKnn: return "a window or sinks with a mode other than knn or knn-tail";
        case AttnProblem::ForcedKeysWithSampledGrad: return "a window or sinks with sampled gradients";
        case AttnProblem::StratifiedWithoutKnn: return "the stratified backward with a mode other than knn or knn-tail";
        case AttnProblem::GumbelCountsBelowOne: return "gumbel groups or samples < 1";
        case AttnProblem::LazyGumbelNeedsExactIndex: return "lazy Gumbel samples on an approximate index";
        case AttnProblem::GumbelWithoutSampledGrad: return "gumbel with exact gradients";
        case AttnProblem::ModeNotInBuild: return "a mode this build has no kernels for";
        case AttnProblem::IndexNotInBuild: return "a top-k index this build has no kernels for";
        case AttnProblem::TooManyGumbelGroups: return "more gumbel groups than this build's kernel holds";
    }
    return "?";
}

// One line for run headers and logs.
inline std::string attn_description(const AttnConfig& a) {
    std::string s = attn_mode_name(a.mode);
    if (a.mode != AttnMode::Exact) s += " k " + std::to_string(a.k) + " index " + attn_index_name(a.index);
    if (a.window > 0) s += " window " + std::to_string(a.window);
    if (a.sinks > 0) s += " sinks " + std::to_string(a.sinks);
    if (a.mode == AttnMode::KnnTail) s += " tail " + std::to_string(a.tail);
    if (a.mode == AttnMode::Kmv) s += " light " + std::to_string(a.tail);
    if (a.mode == AttnMode::Kmv && a.kmv_threshold == KmvThreshold::Relative) s += " threshold relative";
    if (a.mode == AttnMode::Kmv && a.kmv_levels != 1) s += " levels " + std::to_string(a.kmv_levels);
    if (a.mode == AttnMode::Kmv && a.kmv_alpha != kKmvDefaultAlpha) {
        char alpha[32];
        std::snprintf(alpha, sizeof(alpha), " alpha %g", (double)a.kmv_alpha);
        s += alpha;
    }
    if (a.mode == AttnMode::Gumbel)
        s += " groups " + std::to_string(a.gumbel_groups) + " x " + std::to_string(a.gumbel_samples);
    if (a.grad == AttnGrad::Sampled) {
        s += ", grad sampled s " + std::to_string(a.grad_samples) +
             (a.sampled_from_lazy_gumbel() ? " lazy-gumbel" : " exact-row") + (a.grad_signed_dv ? " signed-dv" : "");
    } else if (a.grad == AttnGrad::Stratified) {
        s += ", grad stratified m " + std::to_string(a.grad_samples);
    } else {
        s += ", grad exact";
    }
    if (a.mode != AttnMode::Exact || a.grad != AttnGrad::Exact) s += ", seed " + std::to_string(a.seed);
    return s;
}

// Per-layer state an attention mode saves for its backward: the key lists.
struct AttnLayerState {
    int* idx = nullptr;     // (B, NH, T, K)
    float* logw = nullptr;  // (B, NH, T, K)
    int K = 0;
};

// Scratch the dispatch needs besides the saved state, shared by the layers: top-k lists
// of (B, NH, T, k) ints (knn-tail's head, forced keys' input, lazy-Gumbel gradient
// samples); the stratified backward's lists (B, NH, T, head + m) and the estimates of the
// full attention's output (B, T, C) and log normaliser (B, NH, T) it computes from them.
struct AttnScratch {
    int* topk = nullptr;
    int* grad_idx = nullptr;
    float* grad_logw = nullptr;
    float* grad_out = nullptr;
    float* grad_lse = nullptr;
};

// The top-k lists (rows of k) and the first k slots of K-slot key lists, both
// ways: a strided copy of k columns, done by the backend (its memory).
inline void topk_into_lists(int* lists, int K, const int* topk, int k, size_t rows) {
    ops::copy_columns(lists, K, topk, k, k, rows);
}
inline void topk_from_lists(int* topk, int k, const int* lists, int K, size_t rows) {
    ops::copy_columns(topk, k, lists, K, k, rows);
}

// One layer's attention call: the configuration, the Philox step of this forward
// and the global batch row of its row 0 (the backward of the same layer gets the
// same; kernels/common/draws.h), the layer, its saved key lists and the scratch
// shared by the layers.
struct AttnLayerCall {
    const AttnConfig& config;
    uint32_t draw_step;
    int draw_batch0;
    int layer;
    AttnLayerState state;
    AttnScratch scratch;
};

inline LshParams lsh_params(const AttnLayerCall& call) {
    LshParams p;
    p.seed = call.config.seed;
    p.step = call.draw_step;
    p.layer = call.layer;
    return p;
}

// idx (B, NH, T, k): the top-k lists of the configured index, by this build's entry
inline void causal_topk(int* idx, const AttnLayerCall& call, const float* qkv, int B, int T, int C, int NH) {
    const TopkIndexInfo& index = topk_index_info(call.config.index);
    if (!index.entry)  // refused before a run starts (attn_config_problem); a caller that skipped the check
        throw std::invalid_argument(std::string("causal_topk: index ") + index.name + " has no kernel in " +
                                    build_name(kThisBuild));
    index.entry(idx, qkv, B, T, C, NH, call.config.k, lsh_params(call), nullptr);
}

// The heads of knn and knn-tail lists: the top k, and the window and sinks where the
// configuration forces them (kernels/common/forced_keys.h), in the first head_size()
// slots of every list.
inline void knn_heads(const AttnLayerState& st, const AttnLayerCall& call, const float* qkv, int B, int T, int C,
                      int NH) {
    const AttnConfig& a = call.config;
    if (!a.forced_keys() && st.K == a.k) {  // knn without forced keys: the lists are the top k
        causal_topk(st.idx, call, qkv, B, T, C, NH);
        return;
    }
    causal_topk(call.scratch.topk, call, qkv, B, T, C, NH);
    if (a.forced_keys())
        ops::add_forced_keys(st.idx, st.K, call.scratch.topk, a.k, B, T, NH, a.window, a.sinks);
    else
        topk_into_lists(st.idx, st.K, call.scratch.topk, a.k, (size_t)B * NH * T);
}

// The stratified backward (ALGORITHMS.md §5.5): every row's head exactly and m tail keys
// drawn uniformly from the rest of its causal keys (DRAW_GRADIENT_TAIL, fresh draws),
// up-weighted by |R_i| / m; the full row's normaliser and output estimated from the same
// keys (a sparse forward over the lists), then the key-list backward with them.
inline void stratified_attention_backward(const AttnLayerCall& call, float* dqkv, const float* dout, const float* qkv,
                                          int B, int T, int C, int NH) {
    const AttnConfig& a = call.config;
    const AttnScratch& sc = call.scratch;
    const int H = a.head_size(), K = H + a.grad_samples;
    ops::copy_columns(sc.grad_idx, K, call.state.idx, call.state.K, H, (size_t)B * NH * T);
    ops::sample_tail_keys(sc.grad_idx, sc.grad_logw, B, T, NH, H, a.grad_samples, false, a.seed, call.draw_step,
                          call.layer, call.draw_batch0, DRAW_GRADIENT_TAIL);
    ops::sparse_attention_forward(sc.grad_out, sc.grad_lse, qkv, sc.grad_idx, sc.grad_logw, B, T, C, NH, K);
    ops::sparse_attention_backward(dqkv, dout, qkv, sc.grad_out, sc.grad_lse, sc.grad_idx, sc.grad_logw, B, T, C, NH,
                                   K);
}

// out (B, T, C), lse (B, NH, T), qkv (B, T, 3C).
inline void attention_layer_forward(const AttnLayerCall& call, float* out, float* lse, const float* qkv, int B, int T,
                                    int C, int NH) {
    const AttnConfig& a = call.config;
    const AttnLayerState& st = call.state;
    const int layer = call.layer;
    switch (a.mode) {
        case AttnMode::Exact:
            ops::attention_forward(out, lse, qkv, B, T, C, NH);
            return;
        case AttnMode::Knn:
            knn_heads(st, call, qkv, B, T, C, NH);
            ops::sparse_attention_forward(out, lse, qkv, st.idx, nullptr, B, T, C, NH, st.K);
            return;
        case AttnMode::KnnTail: {
            // the head (top k and forced keys) in the first slots of each list, then the tail samples
            knn_heads(st, call, qkv, B, T, C, NH);
            ops::sample_tail_keys(st.idx, st.logw, B, T, NH, a.head_size(), a.tail, false, a.seed, call.draw_step,
                                  layer, call.draw_batch0);
            ops::sparse_attention_forward(out, lse, qkv, st.idx, st.logw, B, T, C, NH, st.K);
            return;
        }
        case AttnMode::Gumbel:
            causal_topk(st.idx, call, qkv, B, T, C, NH);
            ops::gumbel_attention_forward(out, qkv, st.idx, B, T, C, NH, a.k, a.gumbel_groups, a.gumbel_samples,
                                          a.seed, call.draw_step, layer, call.draw_batch0);
            return;
        case AttnMode::Kmv: {
            ops::KmvParams p;
            p.light_samples = a.tail;
            p.threshold = a.kmv_threshold;
            p.width_levels = a.kmv_levels;
            p.heavy_alpha = a.kmv_alpha;
            p.seed = a.seed;
            p.step = call.draw_step;
            p.layer = layer;
            p.batch0 = call.draw_batch0;
            ops::kmv_select_keys(st.idx, st.logw, qkv, B, T, C, NH, st.K, p);
            ops::sparse_attention_forward(out, lse, qkv, st.idx, st.logw, B, T, C, NH, st.K);
            return;
        }
    }
}

// dqkv (B, T, 3C) +=, given dout (B, T, C) and the forward's out, lse, lists.
inline void attention_layer_backward(const AttnLayerCall& call, float* dqkv, const float* dout, const float* qkv,
                                     const float* out, const float* lse, int B, int T, int C, int NH) {
    const AttnConfig& a = call.config;
    const AttnLayerState& st = call.state;
    if (a.grad == AttnGrad::Stratified) {
        stratified_attention_backward(call, dqkv, dout, qkv, B, T, C, NH);
        return;
    }
    if (a.grad == AttnGrad::Sampled) {
        const int* topk = nullptr;
        if (a.sampled_from_lazy_gumbel()) {
            if (a.mode == AttnMode::Knn || a.mode == AttnMode::Gumbel) {
                topk = st.idx;  // the lists are the top-k
            } else if (a.mode == AttnMode::KnnTail) {
                topk_from_lists(call.scratch.topk, a.k, st.idx, st.K, (size_t)B * NH * T);
                topk = call.scratch.topk;
            } else {  // exact or kmv forward: find the top-k for the sampler
                causal_topk(call.scratch.topk, call, qkv, B, T, C, NH);
                topk = call.scratch.topk;
            }
        }
        ops::sampled_attention_backward(dqkv, dout, qkv, out, topk, a.k, B, T, C, NH, a.grad_samples,
                                        topk ? ops::GradSampleSource::LazyGumbel : ops::GradSampleSource::ExactRow,
                                        a.grad_signed_dv, a.seed, call.draw_step, call.layer, call.draw_batch0);
        return;
    }
    switch (a.mode) {
        case AttnMode::Exact:
            ops::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
            return;
        case AttnMode::Knn:
            ops::sparse_attention_backward(dqkv, dout, qkv, out, lse, st.idx, nullptr, B, T, C, NH, st.K);
            return;
        case AttnMode::KnnTail:
        case AttnMode::Kmv:
            ops::sparse_attention_backward(dqkv, dout, qkv, out, lse, st.idx, st.logw, B, T, C, NH, st.K);
            return;
        case AttnMode::Gumbel:
            throw std::invalid_argument("attention_layer_backward: gumbel attention has no exact gradient");
    }
}

}  // namespace knngpt
