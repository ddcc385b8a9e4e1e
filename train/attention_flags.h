// train/attention_flags.h — the trainer's --attn* flags: their values as typed
// settings (model/attention.h's AttnConfig), the checks of which settings combine
// and which this build's kernels have, each failing with one line that names the
// flag, and the --attn-eval list.
#pragma once
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/attention.h"
#include "train/flag_values.h"

namespace knngpt {

// The attention flags as given on the command line (defaults as in --help).
struct AttnFlags {
    std::string mode = "exact";          // --attn
    int k = 16;                          // --attn-k
    int tail = 0;                        // --attn-tail
    std::string index = "brute";         // --attn-index
    int window = 0;                      // --attn-window
    int sinks = 0;                       // --attn-sinks
    std::string grad = "exact";          // --attn-grad
    int grad_samples = 16;               // --attn-grad-samples
    std::string grad_source = "auto";    // --attn-grad-source
    std::string grad_dv = "rowwise";     // --attn-grad-dv
    int gumbel_groups = 3;               // --attn-gumbel-groups
    int gumbel_samples = 8;              // --attn-gumbel-samples
    std::string kmv_threshold = "absolute";  // --attn-kmv-threshold
    int kmv_levels = 1;                  // --attn-kmv-levels
    float kmv_alpha = kKmvDefaultAlpha;  // --attn-kmv-alpha
    uint64_t seed = 0;                   // --attn-seed
    std::string eval;                    // --attn-eval
    int warmup = 0;                      // --attn-warmup: exact attention for the first steps
};

// ---- --help -----------------------------------------------------------------------

// One --help entry: `lead` (the flag) padded to the help column, then `text` wrapped at
// spaces into lines of at most `width` characters, each further line indented to the
// column; "x = y" stays on one line.
inline std::string help_entry(const std::string& lead, const std::string& text, size_t width = 100) {
    const size_t column = 19;
    std::vector<std::string> words;
    std::istringstream in(text);
    for (std::string w; in >> w;) {
        const bool glue = !words.empty() && (w == "=" || words.back().back() == '=');
        if (glue) words.back() += " " + w;
        else words.push_back(w);
    }
    std::string out = lead + std::string(lead.size() < column ? column - lead.size() : 1, ' ');
    size_t line = out.size();  // the current line's length
    for (size_t u = 0; u < words.size(); u++) {
        if (u > 0 && line + 1 + words[u].size() > width) {
            out += "\n" + std::string(column, ' ');
            line = column;
        } else if (u > 0) {
            out += ' ';
            line++;
        }
        out += words[u];
        line += words[u].size();
    }
    return out + "\n";
}

// The attention flags' part of --help: the core flags, or the "Experimental" block. The
// modes, gradients and indexes, and what each is measured to cost, come from the registry.
inline std::string attention_help(bool experimental) {
    std::string s;
    const auto tier = experimental ? Tier::Experimental : Tier::Core;
    if (!experimental) {
        s += "Attention (core: each wins somewhere measured; the experimental ones are listed at the end)\n";
        s += help_entry("  --attn MODE", "the attention of the forward (default exact):");
        for (const AttnModeInfo& m : kAttnModes)
            if (m.tier == tier) s += help_entry(std::string("    ") + m.name, m.help);
        s += help_entry("  --attn-k K", "nearest keys per query of every mode with a top-k set (kmv: its heavy-key "
                                        "budget) (default 16)");
        s += help_entry("  --attn-tail M", "tail samples per query of knn-tail (kmv: light samples) (default 0)");
        s += help_entry("  --attn-index I", "the top-k search (default brute):");
        for (const TopkIndexInfo& i : kTopkIndexes)
            if (i.tier == tier) s += help_entry(std::string("    ") + i.name, i.help);
        s += help_entry("  --attn-window W", "knn and knn-tail lists also hold the W most recent keys i - W + 1 .. i "
                                             "(the local window; default 0)");
        s += help_entry("  --attn-sinks S", "knn and knn-tail lists also hold the first S keys (attention sinks; "
                                            "default 0)");
        s += help_entry("  --attn-warmup N", "exact attention (forward and gradient) for the first N steps, then the "
                                             "--attn settings (default 0); validations and samples always run the "
                                             "--attn settings");
        s += help_entry("  --attn-seed N", "seed of every attention random draw (Philox; default 0)");
        s += help_entry("  --attn-eval LIST", "also report the validation loss under other attention settings, a "
                                              "comma-separated list of MODE[:k=K][:m=M][:index=I][:w=W][:sinks=S] (e.g. "
                                              "exact,knn:k=8,knn-tail:k=8:m=8)");
        return s;
    }
    s += "Experimental (defined by the seed papers, but losing to exact attention today; each prints its\n"
         "measured cost when chosen)\n";
    for (const AttnModeInfo& m : kAttnModes)
        if (m.tier == tier) s += help_entry(std::string("  --attn ") + m.name, std::string(m.help) + ". " + m.verdict);
    for (const TopkIndexInfo& i : kTopkIndexes)
        if (i.tier == tier)
            s += help_entry(std::string("  --attn-index ") + i.name, std::string(i.help) + ". " + i.verdict);
    for (const AttnGradInfo& g : kAttnGrads)
        if (g.tier == tier)
            s += help_entry(std::string("  --attn-grad ") + g.name,
                            std::string(g.help) + ", instead of exact (the default). " + g.verdict);
    s += help_entry("  --attn-grad-samples S", "samples per query of --attn-grad sampled, tail keys per query of "
                                               "--attn-grad stratified (default 16)");
    s += help_entry("  --attn-grad-source SRC", "where gradient samples come from: auto (lazy Gumbel on the top-k "
                                                "set when the forward has one, else the exact row), exact-row, "
                                                "lazy-gumbel (default auto)");
    s += help_entry("  --attn-grad-dv V", "rowwise (default) or signed: the signed-start one-pass dV estimator");
    s += help_entry("  --attn-gumbel-groups R", "median-of-means groups for gumbel (default 3)");
    s += help_entry("  --attn-gumbel-samples N", "samples per group for gumbel (default 8)");
    s += help_entry("  --attn-kmv-threshold TH", "which keys kmv counts as heavy: absolute (K_ij >= n^-alpha, the "
                                                 "paper's; default) or relative (K_ij >= n^-alpha times the largest "
                                                 "kernel value among the row's candidates)");
    s += help_entry("  --attn-kmv-levels N", "kmv's LSH bucket widths w, 2w, ..., 2^(N-1) w; each row reads the "
                                             "narrowest with at least 2k candidates (1..8; default 1: the paper's "
                                             "one width w)");
    s += help_entry("  --attn-kmv-alpha A", "kmv's heavy exponent: heavy iff K_ij >= n^-A (times the row's largest "
                                            "candidate's with the relative threshold); also sets the width w "
                                            "(0 < A <= 4; default 1/3, the paper's)");
    return s;
}

// One line per experimental choice of a configuration: what it is measured to cost.
inline std::vector<std::string> experimental_notes(const AttnConfig& a) {
    std::vector<std::string> notes;
    const AttnModeInfo& mode = attn_mode_info(a.mode);
    if (mode.tier == Tier::Experimental)
        notes.push_back(std::string("--attn ") + mode.name + " is experimental: " + mode.verdict);
    const TopkIndexInfo& index = topk_index_info(a.index);
    if (a.uses_topk_index() && index.tier == Tier::Experimental)
        notes.push_back(std::string("--attn-index ") + index.name + " is experimental: " + index.verdict);
    const AttnGradInfo& grad = attn_grad_info(a.grad);
    if (grad.tier == Tier::Experimental)
        notes.push_back(std::string("--attn-grad ") + grad.name + " is experimental: " + grad.verdict);
    return notes;
}

// The attention a training step runs: exact (forward and gradient, same draw seed)
// during the first `warmup` steps, then the configured one. Dense-then-sparse is
// how DeepSeek's sparse attention is trained; the steps are counted from 0, so a
// resumed run switches at the same step as an uninterrupted one.
inline AttnConfig attn_for_step(const AttnConfig& configured, int warmup, int step) {
    if (step >= warmup) return configured;
    AttnConfig dense;
    dense.seed = configured.seed;
    return dense;
}

// The names the registry (model/attention_registry.h) knows; a retired index's name stops
// with one line naming the index that replaces it.
inline AttnMode parse_attn_mode(const std::string& name) {
    if (const AttnModeInfo* row = find_attn_mode(name)) return row->id;
    throw std::runtime_error("--attn: unknown attention mode '" + name + "' (known: " + registry_names(kAttnModes) + ")");
}
inline TopkIndex parse_attn_index(const std::string& name) {
    if (const TopkIndexInfo* row = find_topk_index(name)) return row->id;
    if (const RetiredTopkIndex* retired = find_retired_topk_index(name))
        throw std::runtime_error("--attn-index " + name + " is retired: use --attn-index " +
                                 attn_index_name(retired->replacement) + " (" + retired->why + ")");
    throw std::runtime_error("--attn-index: unknown index '" + name + "' (known: " + registry_names(kTopkIndexes) + ")");
}
inline AttnGrad parse_attn_grad(const std::string& name) {
    if (const AttnGradInfo* row = find_attn_grad(name)) return row->id;
    throw std::runtime_error("--attn-grad: unknown gradient mode '" + name + "' (known: " + registry_names(kAttnGrads) +
                             ")");
}
inline AttnGradSource parse_attn_grad_source(const std::string& name) {
    if (name == "auto") return AttnGradSource::Auto;
    if (name == "exact-row") return AttnGradSource::ExactRow;
    if (name == "lazy-gumbel") return AttnGradSource::LazyGumbel;
    throw std::runtime_error("--attn-grad-source: unknown source '" + name + "' (known: auto, exact-row, lazy-gumbel)");
}
inline KmvThreshold parse_attn_kmv_threshold(const std::string& name) {
    if (name == "absolute") return KmvThreshold::Absolute;
    if (name == "relative") return KmvThreshold::Relative;
    throw std::runtime_error("--attn-kmv-threshold: unknown threshold '" + name + "' (known: absolute, relative)");
}
inline bool parse_attn_grad_dv(const std::string& name) {
    if (name == "rowwise") return false;
    if (name == "signed") return true;
    throw std::runtime_error("--attn-grad-dv: unknown estimator '" + name + "' (known: rowwise, signed)");
}

// Checks a configuration against the rules of model/attention.h
// (attn_config_problem, which includes the kernels this build has); throws one
// line naming the flag.
inline void check_attn_config(const AttnConfig& a) {
    const AttnCapabilities can = ops::attention_capabilities();
    const std::string missing = std::string(" is not available in ") + can.build + " yet (" +
                                build_name(kThisBuild == kBuildCpu ? kBuildCuda : kBuildCpu) + " has it)";
    switch (attn_config_problem(a)) {
        case AttnProblem::None: return;
        case AttnProblem::KBelowOne: throw std::runtime_error("--attn-k must be >= 1, got " + std::to_string(a.k));
        case AttnProblem::TailNegative:
            throw std::runtime_error("--attn-tail must be >= 0, got " + std::to_string(a.tail));
        case AttnProblem::TailWithoutTailMode:
            throw std::runtime_error(std::string("--attn-tail needs --attn knn-tail or kmv (the mode is ") +
                                     attn_mode_name(a.mode) + ")");
        case AttnProblem::KmvWithoutLightSamples:
            throw std::runtime_error("--attn kmv needs --attn-tail >= 1 light samples per query");
        case AttnProblem::KmvThresholdWithoutKmv:
            throw std::runtime_error(std::string("--attn-kmv-threshold relative needs --attn kmv (the mode is ") +
                                     attn_mode_name(a.mode) + ")");
        case AttnProblem::KmvLevelsOutOfRange:
            throw std::runtime_error("--attn-kmv-levels must be in 1.." + std::to_string(kKmvMaxWidthLevels) +
                                     ", got " + std::to_string(a.kmv_levels));
        case AttnProblem::KmvLevelsWithoutKmv:
            throw std::runtime_error(std::string("--attn-kmv-levels needs --attn kmv (the mode is ") +
                                     attn_mode_name(a.mode) + ")");
        case AttnProblem::KmvAlphaOutOfRange:
            throw std::runtime_error("--attn-kmv-alpha must be in (0, 4], got " + std::to_string(a.kmv_alpha));
        case AttnProblem::KmvAlphaWithoutKmv:
            throw std::runtime_error(std::string("--attn-kmv-alpha needs --attn kmv (the mode is ") +
                                     attn_mode_name(a.mode) + ")");
        case AttnProblem::GradSamplesBelowOne:
            throw std::runtime_error("--attn-grad-samples must be >= 1, got " + std::to_string(a.grad_samples));
        case AttnProblem::ForcedKeysNegative:
            throw std::runtime_error("--attn-window and --attn-sinks must be >= 0, got " + std::to_string(a.window) +
                                     " and " + std::to_string(a.sinks));
        case AttnProblem::ForcedKeysWithoutKnn:
            throw std::runtime_error(std::string("--attn-window and --attn-sinks need --attn knn or knn-tail (the mode "
                                                 "is ") +
                                     attn_mode_name(a.mode) + ")");
        case AttnProblem::ForcedKeysWithSampledGrad:
            throw std::runtime_error("--attn-window and --attn-sinks do not combine with --attn-grad sampled (its lazy "
                                     "Gumbel samples need lists that are the top k)");
        case AttnProblem::StratifiedWithoutKnn:
            throw std::runtime_error(std::string("--attn-grad stratified needs --attn knn or knn-tail (the mode is ") +
                                     attn_mode_name(a.mode) + ")");
        case AttnProblem::GumbelCountsBelowOne:
            throw std::runtime_error("--attn-gumbel-groups and --attn-gumbel-samples must be >= 1");
        case AttnProblem::LazyGumbelNeedsExactIndex:
            throw std::runtime_error("lazy Gumbel sampling needs an exact top-k index (--attn-index " +
                                     exact_topk_index_names() + "), not " + attn_index_name(a.index));
        case AttnProblem::GumbelWithoutSampledGrad:
            throw std::runtime_error(
                "--attn gumbel has no exact gradient (its samples are discrete): use --attn-grad sampled");
        case AttnProblem::ModeNotInBuild: throw std::runtime_error(std::string("--attn ") + attn_mode_name(a.mode) + missing);
        case AttnProblem::IndexNotInBuild:
            throw std::runtime_error(std::string("--attn-index ") + attn_index_name(a.index) + missing);
        case AttnProblem::TooManyGumbelGroups:
            throw std::runtime_error("--attn-gumbel-groups " + std::to_string(a.gumbel_groups) + ": " + can.build +
                                     " takes at most " + std::to_string(can.max_gumbel_groups));
    }
}

// The attention settings of the flags, checked.
inline AttnConfig attn_config_from_flags(const AttnFlags& f) {
    AttnConfig a;
    a.mode = parse_attn_mode(f.mode);
    a.k = f.k;
    a.tail = f.tail;
    a.index = parse_attn_index(f.index);
    a.window = f.window;
    a.sinks = f.sinks;
    a.grad = parse_attn_grad(f.grad);
    a.grad_samples = f.grad_samples;
    a.grad_source = parse_attn_grad_source(f.grad_source);
    a.grad_signed_dv = parse_attn_grad_dv(f.grad_dv);
    a.gumbel_groups = f.gumbel_groups;
    a.gumbel_samples = f.gumbel_samples;
    a.kmv_threshold = parse_attn_kmv_threshold(f.kmv_threshold);
    a.kmv_levels = f.kmv_levels;
    a.kmv_alpha = f.kmv_alpha;
    a.seed = f.seed;
    check_attn_config(a);
    return a;
}

// --attn-eval: MODE[:k=K][:m=M][:index=I][:w=W][:sinks=S], comma separated; unspecified fields
// come from the training settings. (The forward only: the gradient settings do
// not matter for a validation loss.)
inline std::vector<std::pair<std::string, AttnConfig>> parse_attn_eval(const std::string& list, const AttnConfig& base) {
    std::vector<std::pair<std::string, AttnConfig>> out;
    size_t start = 0;
    while (start <= list.size() && !list.empty()) {
        size_t comma = list.find(',', start);
        std::string spec = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        start = comma == std::string::npos ? list.size() + 1 : comma + 1;
        if (spec.empty()) throw std::runtime_error("--attn-eval: empty entry in '" + list + "'");
        AttnConfig a = base;
        a.grad = AttnGrad::Exact;
        size_t colon = spec.find(':');
        a.mode = parse_attn_mode(spec.substr(0, colon));
        if (a.mode != AttnMode::KnnTail && a.mode != AttnMode::Kmv) a.tail = 0;
        if (a.mode != AttnMode::Knn && a.mode != AttnMode::KnnTail) a.window = 0, a.sinks = 0;
        if (a.mode != AttnMode::Kmv) a.kmv_threshold = KmvThreshold::Absolute, a.kmv_levels = 1, a.kmv_alpha = kKmvDefaultAlpha;
        if (a.mode == AttnMode::Gumbel) a.grad = AttnGrad::Sampled;  // validation needs a gradient mode it has
        while (colon != std::string::npos) {
            size_t next = spec.find(':', colon + 1);
            std::string field = spec.substr(colon + 1, next == std::string::npos ? std::string::npos : next - colon - 1);
            colon = next;
            size_t eq = field.find('=');
            if (eq == std::string::npos) throw std::runtime_error("--attn-eval: expected key=value in '" + field + "'");
            std::string key = field.substr(0, eq), value = field.substr(eq + 1);
            if (key == "k") a.k = (int)parse_flag_long("--attn-eval k", value.c_str());
            else if (key == "m") a.tail = (int)parse_flag_long("--attn-eval m", value.c_str());
            else if (key == "index") a.index = parse_attn_index(value);
            else if (key == "w") a.window = (int)parse_flag_long("--attn-eval w", value.c_str());
            else if (key == "sinks") a.sinks = (int)parse_flag_long("--attn-eval sinks", value.c_str());
            else throw std::runtime_error("--attn-eval: unknown field '" + key + "' (known: k, m, index, w, sinks)");
        }
        check_attn_config(a);
        out.push_back({spec, a});
    }
    return out;
}

}  // namespace knngpt
