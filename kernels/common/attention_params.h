// kernels/common/attention_params.h — the small parameter types of the
// attention modes, shared by every backend so that model/attention.h names one
// type whichever backend `ops` is (kernels/cpu and kernels/cuda both re-export
// them into their namespace).
//
//   AttnMode, AttnGrad  the forward estimator and the backward (--attn, --attn-grad)
//   TopkIndex         which causal top-k search selects the keys (ALGORITHMS.md §6)
//   LshParams         hyperplane LSH index: tables, bits, Philox site
//   TopkStats         counters of a top-k search
//   TopkSearchFn      the signature of every top-k search entry
//   KmvParams         the heavy/light split of kernel matrix-vector products (§7)
//   GradSampleSource  where the sampled backward draws its keys (§5)
//   AttnCapabilities  the limits of a backend's attention kernels
// Which mode and index each build has, and what each is called, is model/attention_registry.h.
#pragma once
#include <cstdint>

namespace knngpt {

enum class AttnMode { Exact, Knn, KnnTail, Gumbel, Kmv };
enum class AttnGrad { Exact, Sampled, Stratified };  // numbered as stored in checkpoints

// The value is the id a checkpoint stores; the ids between (1, 3, 4) belonged to indexes
// since retired, which model/attention_registry.h maps to their replacements.
enum class TopkIndex { Brute = 0, Lsh = 2, Heavy = 5, Ivf = 6 };

struct LshParams {
    int num_bits = 8;    // hyperplanes per table, 0..16 (2^num_bits buckets)
    int num_tables = 4;  // >= 1
    uint64_t seed = 1;
    uint32_t step = 0;
    int layer = 0;
};

// Counters of a top-k search, accumulated with +=, over the rows that search (i + 1 > k);
// the CUDA search keeps none.
struct TopkStats {
    long long scores_computed = 0;  // query-key scores evaluated (brute: i + 1 a row; others: their candidates)
    long long scores_rescored = 0;  // brute: candidates scored again with attention_dot after its fast pass
    long long blocks_total = 0;     // ivf: clusters holding a key before the row's query block, summed over rows
    long long blocks_visited = 0;   // ivf: those of them the row scored
};

// A top-k search: idx (B, NH, T, k) from qkv (B, T, 3C), k >= 1; lsh names the draws of a
// randomised index; stats may be null.
using TopkSearchFn = void (*)(int* idx, const float* qkv, int B, int T, int C, int NH, int k, const LshParams& lsh,
                              TopkStats* stats);

// Which kernel entries count as heavy (ALGORITHMS.md §7.4): Absolute is [P2]'s
// K_ij >= n_i^-alpha; Relative (ours) is K_ij >= n_i^-alpha times the largest
// kernel value among the row's LSH candidates.
enum class KmvThreshold { Absolute, Relative };

// kmv's settings that every entry point (trainer flags, checkpoints, tools, the kernel)
// checks the same way: width levels 1..8 (widths up to 128 w), alpha in (0, 4], [P2]'s 1/3
// by default
constexpr int kKmvMaxWidthLevels = 8;
constexpr float kKmvDefaultAlpha = 1.0f / 3;
constexpr float kKmvMaxAlpha = 4.0f;
inline bool kmv_width_levels_ok(int levels) { return levels >= 1 && levels <= kKmvMaxWidthLevels; }
inline bool kmv_alpha_ok(float alpha) { return alpha > 0.0f && alpha <= kKmvMaxAlpha; }  // false for NaN

struct KmvParams {
    int num_tables = 8;      // LSH tables (L)
    int num_bits = 6;        // hash functions concatenated per table
    int light_samples = 16;  // m, light samples per estimated row
    float heavy_alpha = kKmvDefaultAlpha;  // heavy threshold: K_ij >= n_i^-alpha (times the row's largest, Relative)
    KmvThreshold threshold = KmvThreshold::Absolute;
    // LSH bucket widths w, 2w, ..., 2^(width_levels - 1) w (ours, not [P2]'s, §7.4): each
    // row reads the narrowest level whose candidates fill the heavy budget; 1 = w only
    int width_levels = 1;
    uint64_t seed = 1;
    uint32_t step = 0;
    int layer = 0;
    int batch0 = 0;  // the global batch row of local row 0 (kernels/common/draws.h)
};

enum class GradSampleSource { ExactRow, LazyGumbel };

// The limits of a backend's attention kernels (ops::attention_capabilities()), which the
// trainer checks a run's settings against before anything starts; which modes and indexes
// a build has at all is model/attention_registry.h.
struct AttnCapabilities {
    const char* build = "";           // the build, as messages name it
    int max_gumbel_groups = 1 << 30;  // median-of-means groups of the gumbel forward
};

}  // namespace knngpt
