// kernels/cuda/head_size.cuh — the head sizes HS = C / NH the CUDA attention
// kernels take: every limit is named here once, with what sets it. The
// launchers check theirs (one line on stderr that names the limit, exit(1));
// the tiled exact attention instead runs the one-warp-per-row reference above
// its bound.
#pragma once

namespace knngpt::cuda {

// One warp per row (warp_row.cuh: the reference exact attention,
// sparse_attention, gumbel_attention, sampled_grad): 32 lanes x 8 register
// slots (kWarpRowSlots).
constexpr int kWarpRowMaxHeadSize = 256;

// Tiled fp32 exact attention (attention.cuh): the largest head-size bound with
// tiles (AttentionTiles) that fit the 48 KB of static shared memory.
constexpr int kAttentionTiledMaxHeadSize = 128;

// Tensor-core attention (attention_bf16.cuh): HS a multiple of the wmma tile's
// 16 channels, up to 128, where a warp's dK and dV accumulators take 128
// registers a lane and the backward 120 KB of shared memory.
constexpr int kAttentionBf16HeadSizeStep = 16;
constexpr int kAttentionBf16MaxHeadSize = 128;

// Exact top-k (topk_index.cuh): its query and key tiles in dynamic shared memory
// (topk_shared_bytes), which at HS 256 still lets two blocks share an SM.
constexpr int kTopkMaxHeadSize = 256;

}  // namespace knngpt::cuda
