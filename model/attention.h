// model/attention.h — AttnConfig and the dispatch over attention modes.
//
// The trainer's --attn* flags fill AttnConfig; the model calls
// attention_forward / attention_backward below once per layer, and they pick
// the backend ops for the configured mode (ALGORITHMS.md §9.1):
//
//   mode       forward                                   backward with --attn-grad exact
//   exact      softmax over keys j <= i (flash style)    exact
//   knn        softmax over the top-k keys (§2)          exact gradient of the top-k softmax (§2.3)
//   knn-tail   top-k + m up-weighted tail samples (§3)   exact gradient with the samples fixed (§3.5)
//   gumbel     median of means of lazy Gumbel samples    none: needs --attn-grad sampled
//   kmv        heavy keys (LSH) + sampled light part (§7) exact gradient with the samples fixed
//
// --attn-grad sampled replaces every backward by the randomised estimators of
// §5, which estimate the gradient of EXACT attention (samples from the exact
// row, or from lazy Gumbel on the top-k set); after an approximate forward
// their Delta_i comes from its output, which shifts the dQ, dK means (§5.2).
//
// knn, knn-tail and kmv all produce key lists in one form, idx (B, NH, T, K)
// with log-weights logw (B, NH, T, K), and share the sparse softmax kernel.
// Every random draw is a Philox function of (seed, step, layer, head, batch,
// query, draw index), so the backward and another backend see the same samples.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/common/attention_params.h"
#include "model/backend.h"

namespace knngpt {

enum class AttnGradSource { Auto, ExactRow, LazyGumbel };

struct AttnConfig {
    AttnMode mode = AttnMode::Exact;
    int k = 16;                      // --attn-k: nearest keys per query (kmv: heavy-key budget)
    int tail = 0;                    // --attn-tail: m tail samples (knn-tail) or light samples (kmv)
    ops::TopkIndex index = ops::TopkIndex::Brute;  // --attn-index
    AttnGrad grad = AttnGrad::Exact;               // --attn-grad
    int grad_samples = 16;                         // --attn-grad-samples
    AttnGradSource grad_source = AttnGradSource::Auto;  // --attn-grad-source
    bool grad_signed_dv = false;                   // --attn-grad-dv signed
    int gumbel_groups = 3, gumbel_samples = 8;     // --attn-gumbel-groups, --attn-gumbel-samples
    uint64_t seed = 0;                             // --attn-seed
    // set by the caller before each forward: the Philox step counter
    uint32_t step = 0;

    // slots per key list (0 when the mode keeps none)
    int list_size() const {
        switch (mode) {
            case AttnMode::Exact: return 0;
            case AttnMode::Knn: case AttnMode::Gumbel: return k;
            case AttnMode::KnnTail: case AttnMode::Kmv: return k + tail;
        }
        return 0;
    }
    // does the backward need the top-k lists for lazy Gumbel samples?
    bool sampled_from_lazy_gumbel() const {
        if (grad != AttnGrad::Sampled) return false;
        if (grad_source == AttnGradSource::Auto) return mode != AttnMode::Exact;
        return grad_source == AttnGradSource::LazyGumbel;
    }
};

inline const char* attn_mode_name(AttnMode m) {
    switch (m) {
        case AttnMode::Exact: return "exact";
        case AttnMode::Knn: return "knn";
        case AttnMode::KnnTail: return "knn-tail";
        case AttnMode::Gumbel: return "gumbel";
        case AttnMode::Kmv: return "kmv";
    }
    return "?";
}
inline const char* attn_index_name(ops::TopkIndex i) {
    switch (i) {
        case ops::TopkIndex::Brute: return "brute";
        case ops::TopkIndex::Block: return "block";
        case ops::TopkIndex::Lsh: return "lsh";
    }
    return "?";
}

inline AttnMode parse_attn_mode(const std::string& name) {
    if (name == "exact") return AttnMode::Exact;
    if (name == "knn") return AttnMode::Knn;
    if (name == "knn-tail") return AttnMode::KnnTail;
    if (name == "gumbel") return AttnMode::Gumbel;
    if (name == "kmv") return AttnMode::Kmv;
    throw std::runtime_error("--attn: unknown attention mode '" + name + "' (known: exact, knn, knn-tail, gumbel, kmv)");
}
inline ops::TopkIndex parse_attn_index(const std::string& name) {
    if (name == "brute") return ops::TopkIndex::Brute;
    if (name == "block") return ops::TopkIndex::Block;
    if (name == "lsh") return ops::TopkIndex::Lsh;
    throw std::runtime_error("--attn-index: unknown index '" + name + "' (known: brute, block, lsh)");
}
inline AttnGrad parse_attn_grad(const std::string& name) {
    if (name == "exact") return AttnGrad::Exact;
    if (name == "sampled") return AttnGrad::Sampled;
    throw std::runtime_error("--attn-grad: unknown gradient mode '" + name + "' (known: exact, sampled)");
}
inline AttnGradSource parse_attn_grad_source(const std::string& name) {
    if (name == "auto") return AttnGradSource::Auto;
    if (name == "exact-row") return AttnGradSource::ExactRow;
    if (name == "lazy-gumbel") return AttnGradSource::LazyGumbel;
    throw std::runtime_error("--attn-grad-source: unknown source '" + name + "' (known: auto, exact-row, lazy-gumbel)");
}

// Checks a configuration; throws one line naming the bad setting.
inline void validate_attn_config(const AttnConfig& a) {
    if (a.k < 1) throw std::runtime_error("--attn-k must be >= 1, got " + std::to_string(a.k));
    if (a.tail < 0) throw std::runtime_error("--attn-tail must be >= 0, got " + std::to_string(a.tail));
    if (a.tail > 0 && a.mode != AttnMode::KnnTail && a.mode != AttnMode::Kmv)
        throw std::runtime_error(std::string("--attn-tail needs --attn knn-tail or kmv (the mode is ") +
                                 attn_mode_name(a.mode) + ")");
    if (a.mode == AttnMode::Kmv && a.tail < 1)
        throw std::runtime_error("--attn kmv needs --attn-tail >= 1 light samples per query");
    if (a.grad_samples < 1)
        throw std::runtime_error("--attn-grad-samples must be >= 1, got " + std::to_string(a.grad_samples));
    if (a.gumbel_groups < 1 || a.gumbel_samples < 1)
        throw std::runtime_error("--attn-gumbel-groups and --attn-gumbel-samples must be >= 1");
    // lazy Gumbel is exact only when the top-k set really is the top k (ALGORITHMS.md §4.3):
    // the approximate lsh index may miss keys, and the widened threshold is not implemented
    if (a.index == ops::TopkIndex::Lsh && (a.mode == AttnMode::Gumbel || a.sampled_from_lazy_gumbel()))
        throw std::runtime_error("lazy Gumbel sampling needs an exact top-k index (--attn-index brute or block), "
                                 "not lsh");
    if (a.mode == AttnMode::Gumbel && a.grad == AttnGrad::Exact)
        throw std::runtime_error("--attn gumbel has no exact gradient (its samples are discrete): use --attn-grad sampled");
    // what this build's kernels cover (the CPU backend: everything)
    AttnRequest request;
    request.mode = a.mode;
    request.index = a.index;
    request.grad = a.grad;
    request.lazy_gumbel_grad = a.sampled_from_lazy_gumbel();
    request.signed_dv = a.grad_signed_dv;
    request.gumbel_groups = a.mode == AttnMode::Gumbel ? a.gumbel_groups : 0;
    std::string unsupported = ops::attention_unsupported(request);
    if (!unsupported.empty()) throw std::runtime_error(unsupported);
}

// One line for run headers and logs.
inline std::string attn_description(const AttnConfig& a) {
    std::string s = attn_mode_name(a.mode);
    if (a.mode != AttnMode::Exact) s += " k " + std::to_string(a.k) + " index " + attn_index_name(a.index);
    if (a.mode == AttnMode::KnnTail) s += " tail " + std::to_string(a.tail);
    if (a.mode == AttnMode::Kmv) s += " light " + std::to_string(a.tail);
    if (a.mode == AttnMode::Gumbel)
        s += " groups " + std::to_string(a.gumbel_groups) + " x " + std::to_string(a.gumbel_samples);
    if (a.grad == AttnGrad::Sampled) {
        s += ", grad sampled s " + std::to_string(a.grad_samples) +
             (a.sampled_from_lazy_gumbel() ? " lazy-gumbel" : " exact-row") + (a.grad_signed_dv ? " signed-dv" : "");
    } else {
        s += ", grad exact";
    }
    if (a.mode != AttnMode::Exact || a.grad == AttnGrad::Sampled) s += ", seed " + std::to_string(a.seed);
    return s;
}

// Per-layer state an attention mode saves for its backward: the key lists.
struct AttnLayerState {
    int* idx = nullptr;     // (B, NH, T, K)
    float* logw = nullptr;  // (B, NH, T, K)
    int K = 0;
};

// Scratch the dispatch needs besides the saved state: top-k lists of
// (B, NH, T, k) ints (knn-tail's head, lazy-Gumbel gradient samples).
struct AttnScratch {
    int* topk = nullptr;
};

// The top-k lists (rows of k) and the first k slots of K-slot key lists, both
// ways: a strided copy of k columns, done by the backend (its memory).
inline void topk_into_lists(int* lists, int K, const int* topk, int k, size_t rows) {
    ops::copy_columns(lists, K, topk, k, k, rows);
}
inline void topk_from_lists(int* topk, int k, const int* lists, int K, size_t rows) {
    ops::copy_columns(topk, k, lists, K, k, rows);
}

inline ops::LshParams lsh_params(const AttnConfig& a, int layer) {
    ops::LshParams p;
    p.seed = a.seed;
    p.step = a.step;
    p.layer = layer;
    return p;
}

// out (B, T, C), lse (B, NH, T), qkv (B, T, 3C).
inline void attention_forward(const AttnConfig& a, const AttnLayerState& st, const AttnScratch& scratch, float* out, float* lse, const float* qkv,
                              int B, int T, int C, int NH, int layer) {
    switch (a.mode) {
        case AttnMode::Exact:
            ops::attention_forward(out, lse, qkv, B, T, C, NH);
            return;
        case AttnMode::Knn:
            ops::causal_topk(st.idx, qkv, B, T, C, NH, a.k, a.index, lsh_params(a, layer));
            ops::sparse_attention_forward(out, lse, qkv, st.idx, nullptr, B, T, C, NH, st.K);
            return;
        case AttnMode::KnnTail: {
            // top-k into the first k slots of each (k + m)-slot list, then the tail samples
            ops::causal_topk(scratch.topk, qkv, B, T, C, NH, a.k, a.index, lsh_params(a, layer));
            topk_into_lists(st.idx, st.K, scratch.topk, a.k, (size_t)B * NH * T);
            ops::sample_tail_keys(st.idx, st.logw, B, T, NH, a.k, a.tail, false, a.seed, a.step, layer);
            ops::sparse_attention_forward(out, lse, qkv, st.idx, st.logw, B, T, C, NH, st.K);
            return;
        }
        case AttnMode::Gumbel:
            ops::causal_topk(st.idx, qkv, B, T, C, NH, a.k, a.index, lsh_params(a, layer));
            ops::gumbel_attention_forward(out, qkv, st.idx, B, T, C, NH, a.k, a.gumbel_groups, a.gumbel_samples,
                                          a.seed, a.step, layer);
            return;
        case AttnMode::Kmv: {
            ops::KmvParams p;
            p.light_samples = a.tail;
            p.seed = a.seed;
            p.step = a.step;
            p.layer = layer;
            ops::kmv_select_keys(st.idx, st.logw, qkv, B, T, C, NH, st.K, p);
            ops::sparse_attention_forward(out, lse, qkv, st.idx, st.logw, B, T, C, NH, st.K);
            return;
        }
    }
}

// dqkv (B, T, 3C) +=, given dout (B, T, C) and the forward's out, lse, lists.
inline void attention_backward(const AttnConfig& a, const AttnLayerState& st, const AttnScratch& scratch, float* dqkv,
                               const float* dout, const float* qkv, const float* out, const float* lse, int B, int T,
                               int C, int NH, int layer) {
    if (a.grad == AttnGrad::Sampled) {
        const int* topk = nullptr;
        if (a.sampled_from_lazy_gumbel()) {
            if (a.mode == AttnMode::Knn || a.mode == AttnMode::Gumbel) {
                topk = st.idx;  // the lists are the top-k
            } else if (a.mode == AttnMode::KnnTail) {
                topk_from_lists(scratch.topk, a.k, st.idx, st.K, (size_t)B * NH * T);
                topk = scratch.topk;
            } else {  // exact or kmv forward: find the top-k for the sampler
                ops::causal_topk(scratch.topk, qkv, B, T, C, NH, a.k, a.index, lsh_params(a, layer));
                topk = scratch.topk;
            }
        }
        ops::sampled_attention_backward(dqkv, dout, qkv, out, topk, a.k, B, T, C, NH, a.grad_samples,
                                        topk ? ops::GradSampleSource::LazyGumbel : ops::GradSampleSource::ExactRow,
                                        a.grad_signed_dv, a.seed, a.step, layer);
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
            throw std::runtime_error("attention_backward: gumbel needs --attn-grad sampled");
    }
}

}  // namespace knngpt
