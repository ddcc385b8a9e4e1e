// model/attention_registry.h — every attention mode, gradient and top-k index, one row
// each: the name its flag takes, exact or approximate, core or experimental with the
// measured figure behind that, the builds that have it, its kernel entries and the id a
// checkpoint stores. Flag parsing, error messages, --help, the capability checks, the
// checkpoint reader and bench_attention read these tables; no other file lists them.
//
//   core          wins somewhere measured (speed or quality)
//   experimental  a seed paper defines it, but it loses today; choosing it prints its verdict
//   retired       dominated at every measured point and defined by no seed paper: its name
//                 and checkpoint id still resolve, to the index that replaces it
//
// Adding an index: a TopkIndex value (kernels/common/attention_params.h), its kernel, one
// entry with TopkSearchFn's signature per build that has it (kernels/cpu/topk_index.h,
// kernels/cuda/backend.cuh) and one row below. Every figure is from tools/README.md.
#pragma once
#include <string>

#include "kernels/common/attention_params.h"
#include "model/backend.h"

namespace knngpt {

enum class Tier { Core, Experimental };

// The builds, as bits of a row's `builds`.
constexpr unsigned kBuildCpu = 1u, kBuildCuda = 2u;
#if defined(KNNGPT_CUDA)
constexpr unsigned kThisBuild = kBuildCuda;
// the entry of the build being compiled: the CUDA one here, the CPU one in train_gpt_cpu
#define KNNGPT_ENTRY(cpu_entry, cuda_entry) cuda_entry
#else
constexpr unsigned kThisBuild = kBuildCpu;
#define KNNGPT_ENTRY(cpu_entry, cuda_entry) cpu_entry
#endif
inline const char* build_name(unsigned build) { return build == kBuildCuda ? "the CUDA build" : "train_gpt_cpu"; }

// ---- top-k indexes (--attn-index) ------------------------------------------------

struct TopkIndexInfo {
    TopkIndex id;         // (int)id is what checkpoints store
    const char* name;     // --attn-index NAME
    bool exact;           // the exact top k: brute's lists, bit for bit
    Tier tier;
    unsigned builds;      // kBuildCpu | kBuildCuda
    TopkSearchFn entry;   // this build's search; nullptr where `builds` leaves this build out
    const char* help;     // what it does, for --help
    const char* verdict;  // the measured figure behind its tier
};

inline const TopkIndexInfo kTopkIndexes[] = {
    {TopkIndex::Brute, "brute", true, Tier::Core, kBuildCpu | kBuildCuda,
     KNNGPT_ENTRY(cpu::topk_search_brute, cuda::topk_search_brute),
     "exact: every causal key scored by a fast first pass (sgemm, or int8 where AVX-512 VNNI or AMX pays), "
     "the candidates it cannot rule out rescored",
     "the exact top k: 4.0x exact's forward at n = 16K, k = 32 with the int8 first pass"},
    {TopkIndex::Ivf, "ivf", false, Tier::Core, kBuildCpu, KNNGPT_ENTRY(cpu::topk_search_ivf, nullptr),
     "approximate: about sqrt(i) clusters of the keys, cut at i = 1024, 2048, ..; a query scores whole "
     "clusters in centroid order up to max(128, 4k) keys, then its own block (= brute below 1024 keys)",
     "13.2x exact's forward, 28.6x forward + backward at n = 16K, k = 32, recall 0.955 (clustered keys)"},
    {TopkIndex::Heavy, "heavy", false, Tier::Core, kBuildCpu, KNNGPT_ENTRY(cpu::topk_search_heavy, nullptr),
     "approximate: the keys the previous 256 queries selected, the 64 most recent and an exact probe every "
     "256 queries",
     "15.2x exact's forward at recall 0.977 on a model trained at n = 16K (k = 32); trains 0.01 below brute at "
     "T = 1024; recall ~0.5 on keys without locality"},
    {TopkIndex::Lsh, "lsh", false, Tier::Experimental, kBuildCpu, KNNGPT_ENTRY(cpu::topk_search_lsh, nullptr),
     "approximate: SimHash buckets of the norm-padded keys, 4 tables of 8 bits (the seed paper's example index)",
     "Recall 0.18 at n = 16K, k = 32 (3.5x exact's forward), where ivf finds 0.955 at 13.2x"},
};

// Indexes since retired: their names and checkpoint ids resolve to the replacement.
struct RetiredTopkIndex {
    int id;                 // the checkpoint id it had
    const char* name;
    TopkIndex replacement;
    const char* why;
};
inline const RetiredTopkIndex kRetiredTopkIndexes[] = {
    {1, "block", TopkIndex::Brute, "brute gives the same lists faster; block ran at 0.79x exact's forward at n = 16K, k = 32"},
    {3, "cluster", TopkIndex::Ivf, "ivf is faster at the same recall: 13.2x against 4.0x exact's forward at n = 16K, k = 32"},
    {4, "int8", TopkIndex::Brute, "brute takes the int8 first pass itself where it pays, with the same lists"},
};

// ---- forward modes (--attn) and gradients (--attn-grad) ----------------------------

struct AttnModeInfo {
    AttnMode id;  // (int)id is what checkpoints store
    const char* name;
    Tier tier;
    unsigned builds;
    const char* help;
    const char* verdict;
};
inline const AttnModeInfo kAttnModes[] = {
    {AttnMode::Exact, "exact", Tier::Core, kBuildCpu | kBuildCuda, "softmax over every causal key (the default)",
     "the reference"},
    {AttnMode::Knn, "knn", Tier::Core, kBuildCpu | kBuildCuda, "softmax over the top-k keys of the index",
     "within seed noise of exact at T = 64 (k >= 8); at T = 1024 +0.45 nats from the first step, -0.05 with "
     "--attn-window 32 --attn-sinks 4 and a dense warm-up of 1/10 of the steps"},
    {AttnMode::KnnTail, "knn-tail", Tier::Core, kBuildCpu | kBuildCuda,
     "top-k + m up-weighted uniform tail samples (--attn-tail M)",
     "half knn's gap at T = 1024 from the first step (+0.22 against +0.45 nats, k = m = 32); behind knn once "
     "both keep a local window (+0.17 against +0.07)"},
    {AttnMode::Gumbel, "gumbel", Tier::Experimental, kBuildCpu | kBuildCuda,
     "median of means of lazy Gumbel samples over the top-k set (needs --attn-grad sampled)",
     "+0.48 nats against exact on the baby config, 0.14x exact's forward at n = 16K"},
    {AttnMode::Kmv, "kmv", Tier::Experimental, kBuildCpu,
     "heavy keys found by LSH (--attn-k budget) + m uniformly sampled light keys (--attn-tail M)",
     "+0.39 nats against exact on the baby config with the paper's threshold (+0.038 with relative threshold, "
     "4 levels, alpha 1), 0.65x exact's forward at n = 16K"},
};

struct AttnGradInfo {
    AttnGrad id;
    const char* name;
    Tier tier;
    const char* help;
    const char* verdict;
};
inline const AttnGradInfo kAttnGrads[] = {
    {AttnGrad::Exact, "exact", Tier::Core, "the exact gradient of what the forward computed (the default)",
     "the reference"},
    {AttnGrad::Sampled, "sampled", Tier::Experimental,
     "randomised estimators of exact attention's gradient (--attn-grad-samples S)",
     "+0.037 nats with the exact forward, +0.057 with knn (T = 64, s = 16); +0.53 with knn at T = 1024"},
    {AttnGrad::Stratified, "stratified", Tier::Experimental,
     "after knn or knn-tail: exact attention's gradient from the list's head exactly and m up-weighted uniform "
     "tail keys (--attn-grad-samples M)",
     "knn + stratified +0.47 nats at T = 1024 against knn alone's +0.45; its tail samples add more variance than "
     "the head's bias they remove"},
};

// ---- lookups -------------------------------------------------------------------------

inline bool in_this_build(unsigned builds) { return (builds & kThisBuild) != 0; }

// A table's row by name (a flag's value) or by id (what a checkpoint stores); null if none.
template <class Row, size_t N>
const Row* find_row(const Row (&rows)[N], const std::string& name) {
    for (const Row& row : rows)
        if (name == row.name) return &row;
    return nullptr;
}
template <class Row, size_t N>
const Row* find_row(const Row (&rows)[N], int id) {
    for (const Row& row : rows)
        if (id == (int)row.id) return &row;
    return nullptr;
}
inline const TopkIndexInfo* find_topk_index(const std::string& name) { return find_row(kTopkIndexes, name); }
inline const TopkIndexInfo* find_topk_index(int id) { return find_row(kTopkIndexes, id); }
inline const RetiredTopkIndex* find_retired_topk_index(const std::string& name) {
    return find_row(kRetiredTopkIndexes, name);
}
inline const RetiredTopkIndex* find_retired_topk_index(int id) { return find_row(kRetiredTopkIndexes, id); }
inline const AttnModeInfo* find_attn_mode(const std::string& name) { return find_row(kAttnModes, name); }
inline const AttnModeInfo* find_attn_mode(int id) { return find_row(kAttnModes, id); }
inline const AttnGradInfo* find_attn_grad(const std::string& name) { return find_row(kAttnGrads, name); }

// The row of a value (every TopkIndex, AttnMode and AttnGrad value has one:
// test_attention_registry checks it; the first row is a safe answer otherwise).
inline const TopkIndexInfo& topk_index_info(TopkIndex id) {
    const TopkIndexInfo* row = find_row(kTopkIndexes, (int)id);
    return row ? *row : kTopkIndexes[0];
}
inline const AttnModeInfo& attn_mode_info(AttnMode id) {
    const AttnModeInfo* row = find_row(kAttnModes, (int)id);
    return row ? *row : kAttnModes[0];
}
inline const AttnGradInfo& attn_grad_info(AttnGrad id) {
    const AttnGradInfo* row = find_row(kAttnGrads, (int)id);
    return row ? *row : kAttnGrads[0];
}

inline const char* attn_mode_name(AttnMode m) { return attn_mode_info(m).name; }
inline const char* attn_index_name(TopkIndex i) { return topk_index_info(i).name; }

// "a, b, c": the names of a table's rows that `keep` keeps, or of all of them
template <class Row, size_t N, class Keep>
std::string registry_names(const Row (&rows)[N], Keep keep) {
    std::string s;
    for (const Row& row : rows)
        if (keep(row)) s += (s.empty() ? "" : ", ") + std::string(row.name);
    return s;
}
template <class Row, size_t N>
std::string registry_names(const Row (&rows)[N]) {
    return registry_names(rows, [](const Row&) { return true; });
}
inline std::string exact_topk_index_names() {
    return registry_names(kTopkIndexes, [](const TopkIndexInfo& row) { return row.exact; });
}

}  // namespace knngpt
