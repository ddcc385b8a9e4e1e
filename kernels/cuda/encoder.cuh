// kernels/cuda/encoder.cuh — token + position embedding, fp32. Twin of kernels/cpu/encoder.h.
//
//   forward:  out[b,t,:] = wte[inp[b,t], :] + wpe[t, :]
//   backward: dwte[inp[b,t], :] += dout[b,t,:];  dwpe[t, :] += dout[b,t,:]
//
// Shapes: inp (B, T) token ids in [0, V), wte (V, C), wpe (maxT, C), out/dout
// (B, T, C). Nothing is saved for backward beyond inp. Backward accumulates (+=)
// into dwte and dwpe; the caller zeroes them. All pointers are device pointers.
//
// Design: the backward is deterministic, no atomics (the same bits on every run, as
// resume and several GPUs need): dwpe by one thread per (t, c) summing over b in
// order; dwte by a stable sort of the positions by token, then one ordered sum per
// token, which from a zeroed dwte is the CPU twin's value bit for bit.
#pragma once

#include <cstddef>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kEncoderThreads = 256;
constexpr int kEncoderChunk = 1024;       // positions ranked together (dwte pass 1)
constexpr int kEncoderScanThreads = 256;  // the one block of the token scan (dwte pass 3)

// ---- CUDA kernels -------------------------------------------------------------

// One thread per element (b, t, c) of out.
__global__ void encoder_forward_kernel(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                                       int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    const size_t bt = idx / C;
    const int c = (int)(idx % C);
    const int t = (int)(bt % T);
    out[idx] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c];
}

// One thread per element (t, c) of dwpe, summing over the batch.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += dout[(size_t)b * T * C + idx];
    dwpe[idx] += sum;
}

// dwte. A token may repeat anywhere in inp, so dwte first sorts the positions by
// token, stably (a counting sort: ranks within chunks of kEncoderChunk positions,
// per-chunk token counts, their prefix sums), then one block per token sums its rows
// of dout in position order and adds the sum once (the CPU twin adds the same rows
// in the same order). Cost: the (chunks, V) counts are zeroed and scanned each call,
// B T / 1024 x V ints (3.2 MB at B 16, T 1024, V 50257; 206 MB at a million tokens a
// step), and a token's rows are summed by one block, so one token filling most of
// the batch (padding, say) serialises that sum.

// dwte, pass 1: one block per chunk of kEncoderChunk positions p0 .. p0 + n - 1.
//   rank[p]                = positions q < p of the chunk with inp[q] == inp[p]
//   chunk_counts[chunk, v] = occurrences of v in the chunk, written by v's last
//                            occurrence there (the caller zeroes the array)
__global__ void encoder_wte_rank_kernel(int* rank, int* chunk_counts, const int* inp, int N, int V) {
    __shared__ int tokens[kEncoderChunk];
    const int p0 = blockIdx.x * kEncoderChunk;
    const int n = min(kEncoderChunk, N - p0);
    for (int i = threadIdx.x; i < n; i += blockDim.x) tokens[i] = inp[p0 + i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int v = tokens[i];
        int before = 0, after = 0;
        for (int q = 0; q < n; q++) {
            if (tokens[q] == v) {
                before += q < i;
                after += q > i;
            }
        }
        rank[p0 + i] = before;
        if (after == 0) chunk_counts[(size_t)blockIdx.x * V + v] = before + 1;
    }
}

// dwte, pass 2: one thread per token v turns its column of chunk_counts into
// exclusive prefix sums over the chunks, in place, and writes its total.
__global__ void encoder_wte_chunk_prefix_kernel(int* chunk_counts, int* total, int chunks, int V) {
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= V) return;
    int sum = 0;
    for (int chunk = 0; chunk < chunks; chunk++) {
        int* count = chunk_counts + (size_t)chunk * V + v;
        const int here = *count;
        *count = sum;
        sum += here;
    }
    total[v] = sum;
}

// dwte, pass 3: start[v] = total[0] + ... + total[v - 1]. One block: each thread
// sums a contiguous slice of tokens, the block scans the slice sums in shared
// memory, then each thread writes its slice's starts.
__global__ void encoder_wte_start_kernel(int* start, const int* total, int V) {
    __shared__ int slice_sums[kEncoderScanThreads];
    const int per = (V + kEncoderScanThreads - 1) / kEncoderScanThreads;
    const int v0 = threadIdx.x * per, v1 = min(v0 + per, V);
    int sum = 0;
    for (int v = v0; v < v1; v++) sum += total[v];
    slice_sums[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {  // exclusive scan of the slice sums (kEncoderScanThreads of them)
        int running = 0;
        for (int s = 0; s < kEncoderScanThreads; s++) {
            const int here = slice_sums[s];
            slice_sums[s] = running;
            running += here;
        }
    }
    __syncthreads();
    int running = slice_sums[threadIdx.x];
    for (int v = v0; v < v1; v++) {
        start[v] = running;
        running += total[v];
    }
}

// dwte, pass 4: order[start[v] + chunk prefix + rank] = p, one thread per
// position: the positions of each token, ascending, from start[v] on.
__global__ void encoder_wte_scatter_kernel(int* order, const int* rank, const int* chunk_counts, const int* start,
                                           const int* inp, int N, int V) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= N) return;
    const int v = inp[p];
    order[start[v] + chunk_counts[(size_t)(p / kEncoderChunk) * V + v] + rank[p]] = p;
}

// dwte, pass 5: one block per token v, threads over channels: the rows of its
// positions summed in order, added once.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* order, const int* start,
                                            const int* total, int C) {
    const int v = blockIdx.x;
    const int count = total[v];
    if (count == 0) return;
    const int* positions = order + start[v];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < count; s++) sum += dout[(size_t)positions[s] * C + c];
        dwte[(size_t)v * C + c] += sum;
    }
}

// ---- host launchers -----------------------------------------------------------

inline void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
    const size_t n = (size_t)B * T * C;
    if (n == 0) return;
    launch(encoder_forward_kernel, (unsigned)ceil_div(n, (size_t)kEncoderThreads), kEncoderThreads, 0, nullptr, out,
           inp, wte, wpe, B, T, C);
}

// The counting sort's scratch (ints): rank and order (N each), chunk counts
// (chunks, V), total and start (V each). Grown on demand, kept for the process.
inline int* encoder_wte_scratch(size_t ints) {
    static DeviceScratch scratch;
    return static_cast<int*>(scratch.get(ints * sizeof(int)));
}

inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C, int V) {
    const int N = B * T;
    if (N == 0 || C == 0) return;
    launch(encoder_backward_wpe_kernel, (unsigned)ceil_div((size_t)T * C, (size_t)kEncoderThreads), kEncoderThreads, 0,
           nullptr, dwpe, dout, B, T, C);
    const int chunks = ceil_div(N, kEncoderChunk);
    int* rank = encoder_wte_scratch(2 * (size_t)N + (size_t)chunks * V + 2 * (size_t)V);
    int* order = rank + N;
    int* chunk_counts = order + N;
    int* total = chunk_counts + (size_t)chunks * V;
    int* start = total + V;
    CUDA_CHECK(cudaMemset(chunk_counts, 0, (size_t)chunks * V * sizeof(int)));
    launch(encoder_wte_rank_kernel, chunks, kEncoderThreads, 0, nullptr, rank, chunk_counts, inp, N, V);
    launch(encoder_wte_chunk_prefix_kernel, ceil_div(V, kEncoderThreads), kEncoderThreads, 0, nullptr, chunk_counts,
           total, chunks, V);
    launch(encoder_wte_start_kernel, 1, kEncoderScanThreads, 0, nullptr, start, total, V);
    launch(encoder_wte_scatter_kernel, ceil_div(N, kEncoderThreads), kEncoderThreads, 0, nullptr, order, rank,
           chunk_counts, start, inp, N, V);
    launch(encoder_backward_wte_kernel, V, kEncoderThreads, 0, nullptr, dwte, dout, order, start, total, C);
}

}  // namespace knngpt::cuda
