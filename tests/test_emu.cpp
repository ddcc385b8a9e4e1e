// tests/test_emu.cpp — the CUDA emulator (kernels/emu) against CPU references:
// shared-memory reductions and scans, every warp shuffle and vote, atomics
// under contention, 2-D/3-D indexing, wmma, deadlock reports, and the host
// memory, stream and event API. The kernels are ordinary __global__ functions
// launched with launch(...), exactly as kernels/cuda writes them.
#define KNNGPT_CUDA_EMU

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "tests/device_array.h"

using knngpt::cuda::ceil_div;
using knngpt::cuda::warp_reduce_max;
using knngpt::cuda::warp_reduce_sum;
using knngpt_test::DeviceArray;

namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Small integers stored as floats, so that every sum below is exact in fp32
// whatever its order.
std::vector<float> small_integers(size_t n, int seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> value(-8, 8);
    std::vector<float> v(n);
    for (float& x : v) x = (float)value(rng);
    return v;
}

// The launch's std::runtime_error message, or "" when it did not throw.
template <typename Launch>
std::string launch_error(Launch&& run) {
    try {
        run();
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    return "";
}

// ---- shared-memory reductions ----------------------------------------------

constexpr int kReduceThreads = 256;

// The sum of the block's inputs in[blockIdx.x * blockDim.x + tid] (zero past
// n), by a tree over partial (blockDim.x floats of shared memory), in partial[0].
__device__ void block_tree_sum(float* partial, const float* in, int n) {
    const int tid = threadIdx.x, i = blockIdx.x * blockDim.x + threadIdx.x;
    partial[tid] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (tid < stride) partial[tid] += partial[tid + stride];
        __syncthreads();
    }
}

// block_sums[b] = sum of in[b * 256 .. b * 256 + 255] (zero past n), by a
// tree over a static shared array.
__global__ void block_sum_static_shared(const float* in, float* block_sums, int n) {
    __shared__ float partial[kReduceThreads];
    block_tree_sum(partial, in, n);
    if (threadIdx.x == 0) block_sums[blockIdx.x] = partial[0];
}

// *total += the sum of in[0 .. n), each block reducing blockDim.x inputs in
// dynamic shared memory (blockDim.x floats) and adding its sum atomically.
__global__ void sum_dynamic_shared(const float* in, float* total, int n) {
    KNNGPT_DYNAMIC_SHARED(float, partial);
    block_tree_sum(partial, in, n);
    if (threadIdx.x == 0) atomicAdd(total, partial[0]);
}

TEST(EmuSharedMemory, StaticSharedTreeReductionMatchesCpuSums) {
    const int n = 100003;  // not a multiple of 256: the last block is partial
    const std::vector<float> in = small_integers(n, 1);
    const int blocks = ceil_div(n, kReduceThreads);
    DeviceArray<float> d_in(in), d_sums(blocks);
    launch(block_sum_static_shared, blocks, kReduceThreads, 0, nullptr, d_in.ptr, d_sums.ptr, n);
    const std::vector<float> sums = d_sums.to_host();
    for (int b = 0; b < blocks; b++) {
        const int end = std::min(n, (b + 1) * kReduceThreads);
        EXPECT_EQ(sums[b], std::accumulate(in.begin() + b * kReduceThreads, in.begin() + end, 0.0f)) << "block " << b;
    }
}

TEST(EmuSharedMemory, DynamicSharedTreeReductionMatchesCpuSum) {
    const int n = 5000, threads = 128;
    const std::vector<float> in = small_integers(n, 2);
    DeviceArray<float> d_in(in), d_total(std::vector<float>{0.0f});
    launch(sum_dynamic_shared, ceil_div(n, threads), threads, threads * sizeof(float), nullptr, d_in.ptr, d_total.ptr,
           n);
    EXPECT_EQ(d_total.to_host()[0], std::accumulate(in.begin(), in.end(), 0.0f));
}

__global__ void copy_dynamic_shared(float* out) {
    KNNGPT_DYNAMIC_SHARED(float, never_written);
    out[threadIdx.x] = never_written[threadIdx.x];
}

TEST(EmuSharedMemory, UnwrittenDynamicSharedMemoryReadsAsNaN) {
    DeviceArray<float> out(32);
    launch(copy_dynamic_shared, 1, 32, 32 * sizeof(float), nullptr, out.ptr);
    for (float x : out.to_host()) EXPECT_TRUE(std::isnan(x));
}

__global__ void fill_with_block_index(int* out) {
    KNNGPT_DYNAMIC_SHARED(int, big);
    big[threadIdx.x * 1000] = blockIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = big[threadIdx.x * 1000];
}

TEST(EmuSharedMemory, DynamicSharedMemoryAbove48KiBNeedsTheOptIn) {
    const size_t bytes = 32 * 1000 * sizeof(int);  // 128 000 bytes
    DeviceArray<int> out(2 * 32);
    EXPECT_EXIT(launch(fill_with_block_index, 2, 32, bytes, nullptr, out.ptr), testing::ExitedWithCode(1),
                "CUDA error in kernel fill_with_block_index: invalid argument");
    CUDA_CHECK(cudaFuncSetAttribute(fill_with_block_index, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    launch(fill_with_block_index, 2, 32, bytes, nullptr, out.ptr);
    const std::vector<int> got = out.to_host();
    for (int i = 0; i < 64; i++) EXPECT_EQ(got[i], i / 32);
}

// ---- warp shuffles and votes -----------------------------------------------

// Per thread of 64 (two warps): the warp sum by an xor butterfly and by
// shfl_down, the inclusive warp scan by shfl_up, and lane 7's value.
__global__ void warp_shuffles(const float* in, float* xor_sum, float* down_sum, float* up_scan, float* lane7) {
    const int t = threadIdx.x, lane = t % 32;
    const float v = in[t];
    xor_sum[t] = warp_reduce_sum(v);
    float down = v;
    for (int offset = 16; offset > 0; offset /= 2) down += __shfl_down_sync(kFullMask, down, offset);
    down_sum[t] = down;
    float scan = v;
    for (int offset = 1; offset < 32; offset *= 2) {
        const float below = __shfl_up_sync(kFullMask, scan, offset);
        if (lane >= offset) scan += below;
    }
    up_scan[t] = scan;
    lane7[t] = __shfl_sync(kFullMask, v, 7);
}

TEST(EmuWarp, ShufflesReduceScanAndBroadcastLikeTheirCpuModels) {
    const std::vector<float> in = small_integers(64, 3);
    DeviceArray<float> d_in(in), xor_sum(64), down_sum(64), up_scan(64), lane7(64);
    launch(warp_shuffles, 1, 64, 0, nullptr, d_in.ptr, xor_sum.ptr, down_sum.ptr, up_scan.ptr, lane7.ptr);
    const std::vector<float> x = xor_sum.to_host(), d = down_sum.to_host(), u = up_scan.to_host(), b = lane7.to_host();
    for (int w = 0; w < 2; w++) {
        const float* v = in.data() + 32 * w;
        // shfl_down model: lane l adds lane l + offset, or itself past lane 31
        std::vector<float> down(v, v + 32);
        for (int offset = 16; offset > 0; offset /= 2) {
            std::vector<float> next(32);
            for (int l = 0; l < 32; l++) next[l] = down[l] + down[l + offset < 32 ? l + offset : l];
            down = next;
        }
        std::vector<float> scan(32);
        std::partial_sum(v, v + 32, scan.begin());
        for (int l = 0; l < 32; l++) {
            const int t = 32 * w + l;
            EXPECT_EQ(x[t], scan[31]) << "xor butterfly, thread " << t;
            EXPECT_EQ(d[t], down[l]) << "shfl_down, thread " << t;
            EXPECT_EQ(u[t], scan[l]) << "shfl_up scan, thread " << t;
            EXPECT_EQ(b[t], v[7]) << "broadcast, thread " << t;
        }
        EXPECT_EQ(d[32 * w], scan[31]) << "lane 0 holds the warp sum";
    }
}

// width 8: four independent 8-lane segments per warp.
__global__ void segmented_shuffles(const int* in, int* segment_sum, int* down3, int* up2, int* idx10, int* xor8) {
    const int t = threadIdx.x;
    const int v = in[t];
    int sum = v;
    for (int offset = 4; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset, 8);
    segment_sum[t] = sum;
    down3[t] = __shfl_down_sync(kFullMask, v, 3, 8);
    up2[t] = __shfl_up_sync(kFullMask, v, 2, 8);
    idx10[t] = __shfl_sync(kFullMask, v, 10, 8);
    xor8[t] = __shfl_xor_sync(kFullMask, v, 8, 8);
}

TEST(EmuWarp, WidthBelow32SplitsTheWarpIntoSegments) {
    std::vector<int> in(32);
    for (int l = 0; l < 32; l++) in[l] = 100 + l * l;
    DeviceArray<int> d_in(in), sum(32), down3(32), up2(32), idx10(32), xor8(32);
    launch(segmented_shuffles, 1, 32, 0, nullptr, d_in.ptr, sum.ptr, down3.ptr, up2.ptr, idx10.ptr, xor8.ptr);
    const std::vector<int> s = sum.to_host(), d = down3.to_host(), u = up2.to_host(), i = idx10.to_host(),
                           x = xor8.to_host();
    for (int l = 0; l < 32; l++) {
        const int first = l / 8 * 8;
        EXPECT_EQ(s[l], std::accumulate(in.begin() + first, in.begin() + first + 8, 0)) << "lane " << l;
        EXPECT_EQ(d[l], l + 3 < first + 8 ? in[l + 3] : in[l]) << "lane " << l;
        EXPECT_EQ(u[l], l - 2 >= first ? in[l - 2] : in[l]) << "lane " << l;
        EXPECT_EQ(i[l], in[first + 10 % 8]) << "lane " << l;
        // xor 8 reaches the lower segment but not the higher one
        EXPECT_EQ(x[l], (l ^ 8) < l ? in[l ^ 8] : in[l]) << "lane " << l;
    }
}

__global__ void typed_shuffles(double* doubles, unsigned* unsigneds, int* ints, float* maxima) {
    const int lane = threadIdx.x;
    doubles[lane] = __shfl_sync(kFullMask, 1.0 / 3.0 + lane, 31 - lane);
    unsigneds[lane] = __shfl_xor_sync(kFullMask, 0x80000000u + lane, 1);
    ints[lane] = __shfl_down_sync(kFullMask, -lane, 1);
    maxima[lane] = warp_reduce_max((float)((lane * 7) % 32) - 10.5f);
}

TEST(EmuWarp, ShufflesCarryDoublesUnsignedsAndIntsBitExactly) {
    DeviceArray<double> doubles(32);
    DeviceArray<unsigned> unsigneds(32);
    DeviceArray<int> ints(32);
    DeviceArray<float> maxima(32);
    launch(typed_shuffles, 1, 32, 0, nullptr, doubles.ptr, unsigneds.ptr, ints.ptr, maxima.ptr);
    const std::vector<double> d = doubles.to_host();
    const std::vector<unsigned> u = unsigneds.to_host();
    const std::vector<int> i = ints.to_host();
    const std::vector<float> m = maxima.to_host();
    for (int l = 0; l < 32; l++) {
        EXPECT_EQ(d[l], 1.0 / 3.0 + (31 - l));
        EXPECT_EQ(u[l], 0x80000000u + (unsigned)(l ^ 1));
        EXPECT_EQ(i[l], l < 31 ? -(l + 1) : -l);
        EXPECT_EQ(m[l], 31 - 10.5f);
    }
}

__global__ void warp_votes(unsigned* ballots, int* any_none_all_most, unsigned* even_lane_ballot) {
    const int t = threadIdx.x, lane = t % 32;
    ballots[t] = __ballot_sync(kFullMask, lane % 3 == 0);
    any_none_all_most[4 * t + 0] = __any_sync(kFullMask, lane == 17);
    any_none_all_most[4 * t + 1] = __any_sync(kFullMask, 0);
    any_none_all_most[4 * t + 2] = __all_sync(kFullMask, lane < 32);
    any_none_all_most[4 * t + 3] = __all_sync(kFullMask, lane != 5);
    // odd lanes leave; the even ones vote among themselves
    if (lane % 2) return;
    even_lane_ballot[t] = __ballot_sync(0x55555555u, lane % 4 == 0);
}

TEST(EmuWarp, BallotAnyAndAllGiveTheExpectedBitPatterns) {
    DeviceArray<unsigned> ballots(64), even(64);
    DeviceArray<int> votes(4 * 64);
    launch(warp_votes, 1, 64, 0, nullptr, ballots.ptr, votes.ptr, even.ptr);
    unsigned every_third = 0;
    for (int l = 0; l < 32; l += 3) every_third |= 1u << l;
    const std::vector<unsigned> b = ballots.to_host(), e = even.to_host();
    const std::vector<int> v = votes.to_host();
    for (int t = 0; t < 64; t++) {
        EXPECT_EQ(b[t], every_third);
        EXPECT_EQ(v[4 * t + 0], 1);
        EXPECT_EQ(v[4 * t + 1], 0);
        EXPECT_EQ(v[4 * t + 2], 1);
        EXPECT_EQ(v[4 * t + 3], 0);
        if (t % 2 == 0) {
            EXPECT_EQ(e[t], 0x11111111u);
        }
    }
}

// Each lane writes its slot, then reads the mirror lane's: __syncwarp makes
// the writes of the whole warp land first.
__global__ void mirror_through_shared(int* out) {
    __shared__ int slots[64];
    const int t = threadIdx.x, warp_base = t / 32 * 32;
    slots[t] = 1000 + t;
    __syncwarp();
    out[t] = slots[warp_base + 31 - t % 32];
}

TEST(EmuWarp, SyncwarpOrdersSharedMemoryExchangesWithinAWarp) {
    DeviceArray<int> out(64);
    launch(mirror_through_shared, 1, 64, 0, nullptr, out.ptr);
    const std::vector<int> got = out.to_host();
    for (int t = 0; t < 64; t++) EXPECT_EQ(got[t], 1000 + t / 32 * 32 + 31 - t % 32);
}

// ---- block barriers with values ----------------------------------------------

__global__ void barrier_votes(int* out) {
    const int t = threadIdx.x;
    out[4 * t + 0] = __syncthreads_count(t % 5 == 0);
    out[4 * t + 1] = __syncthreads_and(t >= 0);
    out[4 * t + 2] = __syncthreads_and(t != 77);
    out[4 * t + 3] = __syncthreads_or(t == 77);
}

TEST(EmuBarrier, SyncthreadsCountAndOrVoteOverTheWholeBlock) {
    const int threads = 200;
    DeviceArray<int> out(4 * threads);
    launch(barrier_votes, 1, threads, 0, nullptr, out.ptr);
    const std::vector<int> got = out.to_host();
    for (int t = 0; t < threads; t++) {
        EXPECT_EQ(got[4 * t + 0], 40);
        EXPECT_EQ(got[4 * t + 1], 1);
        EXPECT_EQ(got[4 * t + 2], 0);
        EXPECT_EQ(got[4 * t + 3], 1);
    }
}

// ---- atomics -------------------------------------------------------------------

__global__ void contended_atomics(int* per_residue, float* float_count, double* double_sum, unsigned* unsigned_sum,
                                  int* maximum, int* minimum) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&per_residue[i % 4], 1);
    atomicAdd(float_count, 1.0f);
    atomicAdd(double_sum, 0.25);
    atomicAdd(unsigned_sum, 3u);
    atomicMax(maximum, (i * 7919) % 10007);
    atomicMin(minimum, (i * 7919) % 10007 - 5000);
}

TEST(EmuAtomics, EveryThreadOfManyBlocksIsCountedUnderContention) {
    const int blocks = 64, threads = 256, n = blocks * threads;
    DeviceArray<int> per_residue(std::vector<int>(4, 0)), maximum(std::vector<int>{INT32_MIN}),
        minimum(std::vector<int>{INT32_MAX});
    DeviceArray<float> float_count(std::vector<float>{0.0f});
    DeviceArray<double> double_sum(std::vector<double>{0.0});
    DeviceArray<unsigned> unsigned_sum(std::vector<unsigned>{0u});
    launch(contended_atomics, blocks, threads, 0, nullptr, per_residue.ptr, float_count.ptr, double_sum.ptr,
           unsigned_sum.ptr, maximum.ptr, minimum.ptr);
    for (int count : per_residue.to_host()) EXPECT_EQ(count, n / 4);
    EXPECT_EQ(float_count.to_host()[0], (float)n);
    EXPECT_EQ(double_sum.to_host()[0], 0.25 * n);
    EXPECT_EQ(unsigned_sum.to_host()[0], 3u * n);
    int want_max = INT32_MIN, want_min = INT32_MAX;
    for (int i = 0; i < n; i++) {
        want_max = std::max(want_max, (i * 7919) % 10007);
        want_min = std::min(want_min, (i * 7919) % 10007 - 5000);
    }
    EXPECT_EQ(maximum.to_host()[0], want_max);
    EXPECT_EQ(minimum.to_host()[0], want_min);
}

// atomicExch hands each thread the previous holder's id; atomicCAS lets
// exactly one thread claim the owner slot.
__global__ void exchange_and_claim(int* holder, int* previous, int* owner, int* winners) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    previous[i] = atomicExch(holder, i);
    if (atomicCAS(owner, -1, i) == -1) atomicAdd(winners, 1);
}

TEST(EmuAtomics, ExchangeChainsEveryValueOnceAndCasHasOneWinner) {
    const int blocks = 8, threads = 96, n = blocks * threads;
    DeviceArray<int> holder(std::vector<int>{-1}), previous(n), owner(std::vector<int>{-1}),
        winners(std::vector<int>{0});
    launch(exchange_and_claim, blocks, threads, 0, nullptr, holder.ptr, previous.ptr, owner.ptr, winners.ptr);
    std::vector<int> seen = previous.to_host();
    seen.push_back(holder.to_host()[0]);
    std::sort(seen.begin(), seen.end());
    for (int k = 0; k <= n; k++) EXPECT_EQ(seen[k], k - 1);
    EXPECT_EQ(winners.to_host()[0], 1);
    const int claimed = owner.to_host()[0];
    EXPECT_TRUE(claimed >= 0 && claimed < n);
}

// ---- block-wide prefix sum -----------------------------------------------------

// Inclusive scan of each block's blockDim.x inputs (Hillis-Steele, double
// buffered in 2 * blockDim.x ints of dynamic shared memory).
__global__ void block_inclusive_scan(const int* in, int* out, int n) {
    KNNGPT_DYNAMIC_SHARED(int, buffers);
    const int tid = threadIdx.x, i = blockIdx.x * blockDim.x + threadIdx.x;
    int* src = buffers;
    int* dst = buffers + blockDim.x;
    src[tid] = i < n ? in[i] : 0;
    __syncthreads();
    for (int offset = 1; offset < (int)blockDim.x; offset *= 2) {
        dst[tid] = src[tid] + (tid >= offset ? src[tid - offset] : 0);
        __syncthreads();
        int* written = dst;
        dst = src;
        src = written;
    }
    if (i < n) out[i] = src[tid];
}

TEST(EmuBarrier, BlockPrefixSumMatchesPartialSumForFullAndRaggedBlocks) {
    for (int threads : {1024, 96}) {
        const int n = 3000;
        std::vector<int> in(n);
        for (int i = 0; i < n; i++) in[i] = (i * 37) % 11 - 5;
        DeviceArray<int> d_in(in), d_out(n);
        launch(block_inclusive_scan, ceil_div(n, threads), threads, 2 * threads * sizeof(int), nullptr, d_in.ptr,
               d_out.ptr, n);
        const std::vector<int> got = d_out.to_host();
        std::vector<int> want(n);
        for (int start = 0; start < n; start += threads)
            std::partial_sum(in.begin() + start, in.begin() + std::min(n, start + threads), want.begin() + start);
        EXPECT_EQ(got, want) << "block of " << threads;
    }
}

// ---- 2-D and 3-D indexing --------------------------------------------------------

constexpr int kTile = 32, kTileRows = 8;

// out (cols, rows) = in (rows, cols) transposed, through 32 x 33 shared tiles
// (the padding column keeps the column reads off one bank); 32 x 8 threads
// per tile, each moving four elements.
__global__ void transpose_tiled(const float* in, float* out, int rows, int cols) {
    __shared__ float tile[kTile][kTile + 1];
    int col = blockIdx.x * kTile + threadIdx.x;
    int row = blockIdx.y * kTile + threadIdx.y;
    for (int j = 0; j < kTile; j += kTileRows)
        if (col < cols && row + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(row + j) * cols + col];
    __syncthreads();
    col = blockIdx.y * kTile + threadIdx.x;  // a column of out is a row of in
    row = blockIdx.x * kTile + threadIdx.y;
    for (int j = 0; j < kTile; j += kTileRows)
        if (col < rows && row + j < cols) out[(row + j) * rows + col] = tile[threadIdx.x][threadIdx.y + j];
}

TEST(EmuIndexing, TiledTransposeCoversA2DGridWithRaggedEdges) {
    const int rows = 70, cols = 45;
    std::vector<float> in(rows * cols);
    std::iota(in.begin(), in.end(), 0.0f);
    DeviceArray<float> d_in(in), d_out(rows * cols);
    launch(transpose_tiled, dim3(ceil_div(cols, kTile), ceil_div(rows, kTile)), dim3(kTile, kTileRows), 0, nullptr,
           d_in.ptr, d_out.ptr, rows, cols);
    const std::vector<float> out = d_out.to_host();
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) ASSERT_EQ(out[c * rows + r], in[r * cols + c]) << r << "," << c;
}

// Every thread of a 3-D grid of 3-D blocks counts itself at its global
// (x, y, z) and records the dimensions it saw.
__global__ void count_3d_positions(int* hits, unsigned* dims) {
    const unsigned x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y,
                   z = blockIdx.z * blockDim.z + threadIdx.z;
    const unsigned width = gridDim.x * blockDim.x, height = gridDim.y * blockDim.y;
    atomicAdd(&hits[(z * height + y) * width + x], 1);
    if (x == 0 && y == 0 && z == 0) {
        const unsigned seen[6] = {gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z};
        for (int k = 0; k < 6; k++) dims[k] = seen[k];
    }
}

TEST(EmuIndexing, ThreeDimensionalGridsVisitEveryPositionOnce) {
    const dim3 grid(3, 2, 2), block(4, 3, 2);
    const int n = 3 * 2 * 2 * 4 * 3 * 2;
    DeviceArray<int> hits(std::vector<int>(n, 0));
    DeviceArray<unsigned> dims(6);
    launch(count_3d_positions, grid, block, 0, nullptr, hits.ptr, dims.ptr);
    for (int count : hits.to_host()) EXPECT_EQ(count, 1);
    EXPECT_EQ(dims.to_host(), (std::vector<unsigned>{3, 2, 2, 4, 3, 2}));
}

// ---- wmma ------------------------------------------------------------------------

// d (16x16, row-major) = a (16x16 bf16, row-major) * b (16x16 bf16,
// col-major) + c (row-major), one warp.
__global__ void wmma_tile_product(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a_frag;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b_frag;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(a_frag, a, 16);
    wmma::load_matrix_sync(b_frag, b, 16);
    wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
    wmma::mma_sync(acc, a_frag, b_frag, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// out (M=32, N=32, col-major) = a (32 x K, col-major) * b (K x 32,
// row-major), K a multiple of 16; four warps, warp w owns the output tile
// (w / 2, w % 2).
__global__ void wmma_gemm_four_warps(const __nv_bfloat16* a, const __nv_bfloat16* b, float* out, int K) {
    using namespace nvcuda;
    const int warp = threadIdx.x / 32, tile_m = warp / 2 * 16, tile_n = warp % 2 * 16;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> a_frag;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b_frag;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(a_frag, a + k * 32 + tile_m, 32);
        wmma::load_matrix_sync(b_frag, b + k * 32 + tile_n, 32);
        wmma::mma_sync(acc, a_frag, b_frag, acc);
    }
    wmma::store_matrix_sync(out + tile_n * 32 + tile_m, acc, 32, wmma::mem_col_major);
}

std::vector<__nv_bfloat16> random_bf16(size_t n, int seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    std::vector<__nv_bfloat16> v(n);
    for (auto& x : v) x = __float2bfloat16(value(rng));
    return v;
}

// The tolerance of a GPU's tensor cores, which add the K exact products in an
// order (and internal precision) of their own: K * 2^-24 * sum |a b|. The
// emulator adds them in k order, like the references, so it matches exactly.
double mma_tolerance(double sum_abs_products, int K) { return K * std::ldexp(1.0, -24) * sum_abs_products + 1e-30; }

TEST(EmuWmma, Bf16TileProductMatchesCpuProductOfTheRoundedInputs) {
    const std::vector<__nv_bfloat16> a = random_bf16(256, 4), b = random_bf16(256, 5);
    std::vector<float> c(256);
    for (int i = 0; i < 256; i++) c[i] = 0.125f * (i % 9) - 0.5f;
    DeviceArray<__nv_bfloat16> d_a(a), d_b(b);
    DeviceArray<float> d_c(c), d_d(256);
    launch(wmma_tile_product, 1, 32, 0, nullptr, d_a.ptr, d_b.ptr, d_c.ptr, d_d.ptr);
    const std::vector<float> d = d_d.to_host();
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float want = c[m * 16 + n];
            double sum_abs = 0.0;
            for (int k = 0; k < 16; k++) {
                const float product = __bfloat162float(a[m * 16 + k]) * __bfloat162float(b[n * 16 + k]);
                want += product;
                sum_abs += std::fabs(product);
            }
            EXPECT_NEAR(d[m * 16 + n], want, mma_tolerance(sum_abs, 16)) << m << "," << n;
        }
}

TEST(EmuWmma, FourWarpGemmOverThreeKTilesMatchesCpuProduct) {
    const int K = 48;
    const std::vector<__nv_bfloat16> a = random_bf16(32 * K, 6), b = random_bf16(K * 32, 7);
    DeviceArray<__nv_bfloat16> d_a(a), d_b(b);
    DeviceArray<float> d_out(32 * 32);
    launch(wmma_gemm_four_warps, 1, 128, 0, nullptr, d_a.ptr, d_b.ptr, d_out.ptr, K);
    const std::vector<float> out = d_out.to_host();
    for (int m = 0; m < 32; m++)
        for (int n = 0; n < 32; n++) {
            float want = 0.0f;
            double sum_abs = 0.0;
            for (int k = 0; k < K; k++) {
                const float product = __bfloat162float(a[k * 32 + m]) * __bfloat162float(b[k * 32 + n]);
                want += product;
                sum_abs += std::fabs(product);
            }
            EXPECT_NEAR(out[n * 32 + m], want, mma_tolerance(sum_abs, K)) << m << "," << n;
        }
}

// ---- deadlocks and early exits -----------------------------------------------------

int divergent_site_upper = 0, divergent_site_lower = 0;

// In block 1 only, the upper half of the threads waits at another
// __syncthreads than the lower half.
__global__ void divergent_barrier_kernel(int* out) {
    if (blockIdx.x == 1 && threadIdx.x >= 32) {
        divergent_site_upper = __LINE__; __syncthreads();
    } else {
        divergent_site_lower = __LINE__; __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

TEST(EmuDeadlock, DivergentSyncthreadsIsReportedNamingKernelBlockAndThreads) {
    DeviceArray<int> out(std::vector<int>(3 * 64, 0));
    const std::string error = launch_error([&] { launch(divergent_barrier_kernel, 3, 64, 0, nullptr, out.ptr); });
    const std::string want = std::string("emu: deadlock in kernel divergent_barrier_kernel, block (1,0,0), ") +
                             "thread (0,0,0): __syncthreads at " + __FILE__ + ":" + std::to_string(divergent_site_lower) +
                             " while thread (32,0,0) waits at __syncthreads at " + __FILE__ + ":" +
                             std::to_string(divergent_site_upper);
    EXPECT_EQ(error, want);
    const std::vector<int> got = out.to_host();
    EXPECT_EQ(std::count(got.begin(), got.begin() + 64, 1), 64) << "block 0 ran to completion";
    EXPECT_EQ(std::count(got.begin() + 64, got.end(), 1), 0) << "nothing ran past the deadlock";
}

// Lanes past n leave before a full-mask warp reduction that still names them.
__global__ void reduce_after_early_exit(const float* in, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = warp_reduce_sum(in[i]);
}

TEST(EmuDeadlock, ShuffleWhoseMaskNamesAnExitedLaneIsReported) {
    DeviceArray<float> in(std::vector<float>(40, 1.0f)), out(40);
    const std::string error = launch_error([&] { launch(reduce_after_early_exit, 1, 64, 0, nullptr, in.ptr, out.ptr, 40); });
    EXPECT_NE(error.find("emu: deadlock in kernel reduce_after_early_exit, block (0,0,0), thread (32,0,0): "
                         "__shfl_xor_sync(mask 0xffffffff) at "),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("common.cuh:"), std::string::npos) << "the site inside warp_reduce_sum: " << error;
    EXPECT_NE(error.find(" while thread (40,0,0) in its mask has exited"), std::string::npos) << error;
}

// Half a warp shuffles while the other half waits at a block barrier.
template <int Split>
__global__ void shuffle_against_barrier(int* out) {
    if ((int)threadIdx.x < Split) {
        out[threadIdx.x] = __shfl_xor_sync(kFullMask, (int)threadIdx.x, 1);
    } else {
        __syncthreads();
    }
}

TEST(EmuDeadlock, ShuffleAgainstABarrierNamesTheTemplateKernelAndBothSites) {
    DeviceArray<int> out(32);
    const std::string error = launch_error([&] { launch(shuffle_against_barrier<16>, 1, 32, 0, nullptr, out.ptr); });
    EXPECT_EQ(error.find(std::string("emu: deadlock in kernel shuffle_against_barrier<16>, block (0,0,0), ") +
                         "thread (0,0,0): __shfl_xor_sync(mask 0xffffffff) at " + __FILE__ + ":"),
              0u)
        << error;
    EXPECT_NE(error.find(std::string(" while thread (16,0,0) waits at __syncthreads at ") + __FILE__ + ":"),
              std::string::npos)
        << error;
}

// Lanes 8..15 of a half-warp mask read lanes 16..23, outside the mask.
__global__ void shuffle_outside_mask(int* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_down_sync(0x0000FFFFu, (int)threadIdx.x, 8);
}

TEST(EmuDeadlock, ShuffleReadingALaneOutsideItsMaskIsReported) {
    DeviceArray<int> out(32);
    const std::string error = launch_error([&] { launch(shuffle_outside_mask, 1, 32, 0, nullptr, out.ptr); });
    EXPECT_EQ(error.find(std::string("emu: kernel shuffle_outside_mask, block (0,0,0), thread (8,0,0): ") +
                         "__shfl_down_sync(mask 0x0000ffff) at " + __FILE__ + ":"),
              0u)
        << error;
    EXPECT_NE(error.find(" reads lane 16, which is not in the mask"), std::string::npos) << error;
}

// Half the warp at mma.sync, the other half at ldmatrix: one warp round of two
// instructions whose registers cannot be exchanged, reported instead of mixed.
__global__ void mixed_warp_collectives(float* out) {
    __align__(16) __shared__ __nv_bfloat16 tile[16 * 16];
    for (int i = threadIdx.x; i < 256; i += 32) tile[i] = __float2bfloat16(1.0f);
    __syncthreads();
    uint32_t r[4] = {0, 0, 0, 0};
    if (threadIdx.x < 16) {
        const uint32_t b[2] = {0, 0};
        float d[4], c[4] = {0, 0, 0, 0};
        knngpt::cuda::mma_bf16_16816(d, r, b, c);
        out[threadIdx.x] = d[0];
    } else {
        knngpt::cuda::ldmatrix_x4(r, tile + (threadIdx.x % 16) * 16);
        out[threadIdx.x] = (float)r[0];
    }
}

TEST(EmuDeadlock, LanesAtDifferentWarpCollectivesAreReported) {
    DeviceArray<float> out(32);
    const std::string error = launch_error([&] { launch(mixed_warp_collectives, 1, 32, 0, nullptr, out.ptr); });
    EXPECT_EQ(error.find("emu: kernel mixed_warp_collectives, block (0,0,0), thread ("), 0u) << error;
    EXPECT_NE(error.find("is at another warp-collective instruction than"), std::string::npos) << error;
}

TEST(EmuDeadlock, EmulatorRunsNormalLaunchesAfterAReportedDeadlock) {
    DeviceArray<int> out(64);
    EXPECT_THROW(launch(divergent_barrier_kernel, 2, 64, 0, nullptr, out.ptr), std::runtime_error);
    const int n = 1000;
    const std::vector<float> in = small_integers(n, 8);
    DeviceArray<float> d_in(in), d_total(std::vector<float>{0.0f});
    launch(sum_dynamic_shared, ceil_div(n, 256), 256, 256 * sizeof(float), nullptr, d_in.ptr, d_total.ptr, n);
    EXPECT_EQ(d_total.to_host()[0], std::accumulate(in.begin(), in.end(), 0.0f));
}

// Threads past n return before the barrier the others still use.
__global__ void double_then_shift_left(const float* in, float* out, int n) {
    __shared__ float staged[kReduceThreads];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    staged[threadIdx.x] = 2.0f * in[i];
    __syncthreads();
    const bool has_right = threadIdx.x + 1 < blockDim.x && i + 1 < n;
    out[i] = staged[has_right ? threadIdx.x + 1 : threadIdx.x];
}

TEST(EmuBarrier, ThreadsThatReturnEarlyCountAsArrived) {
    const int n = 300;  // block 1 keeps 44 of its 256 threads
    std::vector<float> in(n);
    std::iota(in.begin(), in.end(), 1.0f);
    DeviceArray<float> d_in(in), d_out(n);
    launch(double_then_shift_left, ceil_div(n, kReduceThreads), kReduceThreads, 0, nullptr, d_in.ptr, d_out.ptr, n);
    const std::vector<float> out = d_out.to_host();
    for (int i = 0; i < n; i++) {
        const bool has_right = (i + 1) % kReduceThreads != 0 && i + 1 < n;
        EXPECT_EQ(out[i], 2.0f * in[has_right ? i + 1 : i]) << i;
    }
}

// ---- CUDA_CHECK and the host API ---------------------------------------------------

__global__ void do_nothing() {}

TEST(EmuDeathTest, CudaCheckOnAFailingCallPrintsOneLineAndExits) {
    EXPECT_EXIT(
        {
            void* p = nullptr;
            CUDA_CHECK(cudaMalloc(&p, (size_t)1 << 62));
        },
        testing::ExitedWithCode(1), "^[^\n]*test_emu\\.cpp:[0-9]+: CUDA error: out of memory\n$");
}

// (the note on earlier kernels is left out where CUDA_LAUNCH_BLOCKING=1 is set)
TEST(EmuDeathTest, LaunchWithTooManyThreadsFailsNamingTheKernel) {
    EXPECT_EXIT(launch(do_nothing, 1, 2048, 0, nullptr), testing::ExitedWithCode(1),
                "^[^\n]*test_emu\\.cpp:[0-9]+: CUDA error in kernel do_nothing: invalid configuration argument"
                "( \\(or in an earlier kernel still running: CUDA_LAUNCH_BLOCKING=1 names the one\\))?\n$");
}

// The kernel of a launch text is its first top-level item, template
// arguments (with their own commas) included.
TEST(EmuLaunchText, KernelIsTheFirstItemOutsideBrackets) {
    using knngpt::cuda::kernel_expression;
    EXPECT_EQ(kernel_expression("do_nothing, 1, 2048, 0, nullptr"), "do_nothing");
    EXPECT_EQ(kernel_expression(" tiled_kernel<Tiles<64, 2>, true>, grid, block, 0, nullptr, q"),
              "tiled_kernel<Tiles<64, 2>, true>");
    EXPECT_EQ(kernel_expression("kernels[i], grid"), "kernels[i]");
    EXPECT_EQ(kernel_expression(", grid"), "?");
}

// With blocking launches (CUDA_LAUNCH_BLOCKING=1) the error is the kernel's
// own, and the line says nothing of earlier kernels.
TEST(EmuLaunchText, BlockingLaunchErrorNamesOnlyTheKernel) {
    EXPECT_EQ(knngpt::cuda::launch_error_message("kernels/cuda/x.cuh", 12, "scatter_kernel<4>, grid, 64, 0, nullptr, p",
                                                 "an illegal memory access was encountered", true),
              "kernels/cuda/x.cuh:12: CUDA error in kernel scatter_kernel<4>: an illegal memory access was encountered");
}

TEST(EmuRuntime, MemoryRoundTripsThroughMallocMemcpyAndMemset) {
    const size_t n = 1000;
    std::vector<int> host(n), back(n, 0);
    std::iota(host.begin(), host.end(), -500);
    int *a = nullptr, *b = nullptr;
    ASSERT_EQ(cudaMalloc(&a, n * sizeof(int)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, n * sizeof(int)), cudaSuccess);
    EXPECT_EQ((uintptr_t)a % 256, 0u);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(a, host.data(), n * sizeof(int), cudaMemcpyHostToDevice, stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(b, a, n * sizeof(int), cudaMemcpyDeviceToDevice), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host);
    EXPECT_EQ(cudaMemsetAsync(b, 0xFF, n * sizeof(int), stream), cudaSuccess);
    EXPECT_EQ(cudaMemset(b, 0, 10 * sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDefault), cudaSuccess);
    for (size_t i = 0; i < n; i++) EXPECT_EQ(back[i], i < 10 ? 0 : -1);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    EXPECT_EQ(cudaFree(a), cudaSuccess);
    EXPECT_EQ(cudaFree(b), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(EmuRuntime, MallocOfAnImpossibleSizeReturnsAnErrorCode) {
    void* p = &p;
    EXPECT_EQ(cudaMalloc(&p, SIZE_MAX), cudaErrorMemoryAllocation);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(cudaMalloc(&p, (size_t)1 << 62), cudaErrorMemoryAllocation);
    EXPECT_STREQ(cudaGetErrorString(cudaPeekAtLastError()), "out of memory");
    EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "reading the last error clears it";
}

TEST(EmuRuntime, CopiesWhoseDeviceSideIsNotAllocatedAreRefused) {
    std::vector<float> host(16), other(16);
    float* device = nullptr;
    ASSERT_EQ(cudaMalloc(&device, 16 * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(other.data(), host.data(), 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_EQ(cudaMemcpy(host.data(), device + 8, 9 * sizeof(float), cudaMemcpyDeviceToHost), cudaErrorInvalidValue)
        << "one float past the allocation";
    EXPECT_EQ(cudaMemcpy(host.data(), device + 8, 8 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemset(host.data(), 0, 64), cudaErrorInvalidValue);
    EXPECT_EQ(cudaMemcpy(device, host.data(), 64, (cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
    EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
    EXPECT_EQ(cudaFree(device), cudaSuccess);
    EXPECT_EQ(cudaFree(device), cudaErrorInvalidValue) << "freed twice";
    cudaGetLastError();
}

TEST(EmuRuntime, EventsGiveNonNegativeElapsedTimes) {
    cudaEvent_t start, stop, never_recorded;
    ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&never_recorded), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(start), cudaSuccess);
    launch(do_nothing, 4, 64, 0, nullptr);
    EXPECT_EQ(cudaEventRecord(stop, nullptr), cudaSuccess);
    EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
    float ms = -1.0f;
    EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    EXPECT_GE(ms, 0.0f);
    EXPECT_EQ(cudaEventElapsedTime(&ms, start, never_recorded), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    for (cudaEvent_t e : {start, stop, never_recorded}) EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

// ---- bf16 ----------------------------------------------------------------------------

TEST(EmuBf16, ConversionRoundsToNearestEvenAndKeepsSpecials) {
    auto bits = [](float f) { return __bfloat16_as_ushort(__float2bfloat16(f)); };
    EXPECT_EQ(bits(1.0f), 0x3F80);
    EXPECT_EQ(bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80) << "halfway, down to the even mantissa";
    EXPECT_EQ(bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82) << "halfway, up to the even mantissa";
    EXPECT_EQ(bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81) << "just above halfway";
    EXPECT_EQ(bits(-2.5f), 0xC020);
    EXPECT_EQ(bits(-0.0f), 0x8000);
    EXPECT_EQ(bits(INFINITY), 0x7F80);
    EXPECT_EQ(bits(FLT_MAX), 0x7F80) << "rounds up past the largest bf16";
    EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16(NAN))));
    for (unsigned h = 0; h < 0x10000; h++) {
        const __nv_bfloat16 b = __ushort_as_bfloat16((unsigned short)h);
        const float f = __bfloat162float(b);
        if (std::isnan(f)) continue;
        ASSERT_EQ(bits(f), h) << "bf16 -> float -> bf16 is the identity";
    }
}

}  // namespace
