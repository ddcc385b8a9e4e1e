// kernels/common/attention_params.h — the small parameter types of the
// attention modes, shared by every backend so that model/attention.h names one
// type whichever backend `ops` is (kernels/cpu and kernels/cuda both re-export
// them into their namespace).
//
//   AttnMode, AttnGrad  the forward estimator and the backward (--attn, --attn-grad)
//   TopkIndex         which causal top-k search selects the keys (ALGORITHMS.md §6)
//   LshParams         hyperplane LSH index: tables, bits, Philox site
//   KmvParams         the heavy/light split of kernel matrix-vector products (§7)
//   GradSampleSource  where the sampled backward draws its keys (§5)
//   AttnRequest       what a run needs of a backend's attention kernels
#pragma once
#include <cstdint>

namespace knngpt {

enum class AttnMode { Exact, Knn, KnnTail, Gumbel, Kmv };
enum class AttnGrad { Exact, Sampled };

enum class TopkIndex { Brute, Block, Lsh };

struct LshParams {
    int num_bits = 8;    // hyperplanes per table, 0..16 (2^num_bits buckets)
    int num_tables = 4;  // >= 1
    uint64_t seed = 1;
    uint32_t step = 0;
    int layer = 0;
};

struct KmvParams {
    int num_tables = 8;      // LSH tables (L)
    int num_bits = 6;        // hash functions concatenated per table
    int light_samples = 16;  // m, light samples per estimated row
    float heavy_alpha = 1.0f / 3;  // heavy threshold K_ij >= n_i^-alpha
    uint64_t seed = 1;
    uint32_t step = 0;
    int layer = 0;
};

enum class GradSampleSource { ExactRow, LazyGumbel };

// What a run asks of the backend's attention kernels, checked before it starts
// (ops::attention_unsupported): the parts of AttnConfig a backend may lack.
struct AttnRequest {
    AttnMode mode = AttnMode::Exact;
    TopkIndex index = TopkIndex::Brute;
    AttnGrad grad = AttnGrad::Exact;
    bool lazy_gumbel_grad = false;  // sampled backward drawing lazy Gumbel samples from top-k lists
    bool signed_dv = false;         // --attn-grad-dv signed
    int gumbel_groups = 0;          // --attn-gumbel-groups of a gumbel forward
};

}  // namespace knngpt
