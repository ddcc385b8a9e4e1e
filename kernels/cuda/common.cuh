// kernels/cuda/common.cuh — included first by every CUDA kernel file. The same
// source builds two ways:
//   nvcc                       the CUDA runtime, bf16 and wmma headers;
//   g++ -DKNNGPT_CUDA_EMU      the CPU emulator of kernels/emu (no GPU needed).
// Everything below means the same in both builds:
//   CUDA_CHECK(call)                      on error: "file:line: CUDA error: <string>", exit(1),
//                                         after cuda_error_prefix() (the trainer's rank)
//   launch(kernel, grid, block, dynamic_smem_bytes, stream, args...)
//                                         kernel<<<grid, block, smem, stream>>>(args...) and a
//                                         check of the launch (cudaGetLastError) at the call site;
//                                         on error: "file:line: CUDA error in kernel <kernel>: <string>
//                                         ...", exit(1). With CUDA_LAUNCH_BLOCKING=1 each launch also
//                                         waits for its kernel, so a fault while it runs is reported
//                                         at its own launch, naming it
//   KNNGPT_DYNAMIC_SHARED(type, name)     inside a kernel: `type* name` at the block's dynamic
//                                         shared memory
//   warp_reduce_sum / warp_reduce_max     over the 32 lanes of a full warp, every lane gets the result
//   DeviceScratch                         a grow-on-demand device buffer for kernels' scratch
//   kDefaultSharedBytes                   the shared memory a block gets without opting in (48 KB)
//   ceil_div(a, b)
//   launch_observer()                     an optional function every launch(...) calls first (tests)
// Kernels launch only through launch(...), never with a raw <<<>>>.
#pragma once
#if defined(KNNGPT_CUDA_EMU)
#include "kernels/emu/emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#endif

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/kernel_times.h"
#include "kernels/cuda/launch_text.h"

namespace knngpt::cuda {

// What every CUDA error line starts with: empty, or the program's prefix naming its
// rank ("train_gpt: error: rank 1: "), which the trainer sets once the ranks have met.
inline std::string& cuda_error_prefix() {
    static std::string prefix;
    return prefix;
}

inline void check_cuda(cudaError_t status, const char* file, int line) {
    if (status == cudaSuccess) return;
    std::fprintf(stderr, "%s%s:%d: CUDA error: %s\n", cuda_error_prefix().c_str(), file, line,
                 cudaGetErrorString(status));
    std::exit(1);
}

// The launch observer: when set, launch_kernel calls it before each launch
// with the launch's text ("kernel<ARGS>, grid, block, ...", as written at the
// call site) and the kernel's address (the instantiation launched). Unset (the
// default) nothing is called. The tests of kernels/cuda set it to record which
// kernels ran (tests/cuda_test_util.h); the trainer never does.
using LaunchObserver = void (*)(const char* launch_text, const void* kernel);
inline LaunchObserver& launch_observer() {
    static LaunchObserver observer = nullptr;
    return observer;
}

// Whether every launch waits for its kernel to finish: CUDA_LAUNCH_BLOCKING=1
// in the environment (read once, at the first launch), the runtime's own
// switch for synchronous launches. Then launch_kernel also synchronizes the
// launch's stream, so an error of the kernel's execution (an illegal address,
// a trap) comes back from this launch's check, not from a later call.
inline bool launches_block() {
    static const bool blocking = [] {
        const char* value = std::getenv("CUDA_LAUNCH_BLOCKING");
        return value != nullptr && std::strcmp(value, "1") == 0;
    }();
    return blocking;
}

// The line a failed launch prints: the call site, the kernel (launch_text's
// first item, kernel_expression) and the error. Launches that do not block
// return before their kernel runs, so the error may also be a fault of an
// earlier kernel still running; the line then says how to pin it down.
inline std::string launch_error_message(const char* file, int line, const char* launch_text, const char* error,
                                        bool blocking) {
    std::string message = std::string(file) + ":" + std::to_string(line) + ": CUDA error in kernel " +
                          kernel_expression(launch_text) + ": " + error;
    if (!blocking) message += " (or in an earlier kernel still running: CUDA_LAUNCH_BLOCKING=1 names the one)";
    return message;
}

// launch(...) expands to this with the call site and the launch's text (whose
// first item names the kernel in launch errors and the emulator's deadlock
// reports).
template <typename... Params, typename... Args>
void launch_kernel(const char* file, int line, const char* launch_text, void (*kernel)(Params...), dim3 grid,
                   dim3 block, size_t dynamic_smem_bytes, cudaStream_t stream, Args&&... args) {
    if (const LaunchObserver observe = launch_observer()) observe(launch_text, reinterpret_cast<const void*>(kernel));
#if defined(KNNGPT_CUDA_EMU)
    ::knngpt::emu::run_kernel(launch_text, kernel, grid, block, dynamic_smem_bytes, stream,
                              std::forward<Args>(args)...);
#else
    const int timed = KernelTimes::enabled() ? KernelTimes::get().begin(kernel_expression(launch_text), stream) : -1;
    kernel<<<grid, block, dynamic_smem_bytes, stream>>>(std::forward<Args>(args)...);
    if (timed >= 0) KernelTimes::get().end(timed, stream);
#endif
    const bool blocking = launches_block();
    cudaError_t status = cudaGetLastError();
    if (status == cudaSuccess && blocking) status = cudaStreamSynchronize(stream);
    if (status == cudaSuccess) return;
    std::fprintf(stderr, "%s%s\n", cuda_error_prefix().c_str(),
                 launch_error_message(file, line, launch_text, cudaGetErrorString(status), blocking).c_str());
    std::exit(1);
}

// Sum over the 32 lanes of the warp by an xor butterfly: after log2(32)
// exchanges every lane holds the total.
// (float or double)
template <typename Real>
__device__ __forceinline__ Real warp_reduce_sum(Real value) {
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
    return value;
}

__device__ __forceinline__ float warp_reduce_max(float value) {
    for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
    return value;
}

__device__ __forceinline__ double warp_reduce_max(double value) {
    for (int offset = 16; offset > 0; offset >>= 1) value = fmax(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
    return value;
}

__device__ __forceinline__ int warp_reduce_max(int value) {
    for (int offset = 16; offset > 0; offset >>= 1) value = max(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
    return value;
}

// A device buffer that grows to the largest size asked of it and is never
// freed (like cuBLASLt's workspace): kernels' scratch, allocated once rather
// than per call. Work on the one stream is ordered, so reusing it across calls
// is safe; the cudaFree before growing waits for work still reading it.
// Declare one `static` per use.
struct DeviceScratch {
    void* ptr = nullptr;
    size_t bytes = 0;

    void* get(size_t needed) {
        if (needed > bytes) {
            check_cuda(cudaFree(ptr), __FILE__, __LINE__);  // (CUDA_CHECK is defined below)
            check_cuda(cudaMalloc(&ptr, needed), __FILE__, __LINE__);
            bytes = needed;
        }
        return ptr;
    }
};

// Shared memory a block may use without opting in: the limit of static
// __shared__ arrays, and of dynamic shared memory unless the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize is raised.
constexpr size_t kDefaultSharedBytes = 48 * 1024;

template <typename A, typename B>
__host__ __device__ constexpr std::common_type_t<A, B> ceil_div(A a, B b) {
    return (a + b - 1) / b;
}

// The second pass of a deterministic column sum over rows in chunks (matmul's
// dbias, layernorm's dweight and dbias): dst[o] += partial[0, o] + partial[1, o]
// + ... + partial[chunks - 1, o], in that order, one thread per column o.
// partial is (chunks, n). The same bits on every run, unlike atomics.
constexpr int kChunkSumThreads = 256;

__global__ void add_chunk_sums_kernel(float* dst, const float* partial, int chunks, int n) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= n) return;
    float sum = 0.0f;
    for (int chunk = 0; chunk < chunks; chunk++) sum += partial[(size_t)chunk * n + o];
    dst[o] += sum;
}

}  // namespace knngpt::cuda

#define CUDA_CHECK(call) ::knngpt::cuda::check_cuda((call), __FILE__, __LINE__)

#define launch(...) ::knngpt::cuda::launch_kernel(__FILE__, __LINE__, #__VA_ARGS__, __VA_ARGS__)

// One byte array for every kernel (differently typed `extern __shared__`
// arrays of one name would clash between kernels of a file), viewed as type.
#if defined(KNNGPT_CUDA_EMU)
#define KNNGPT_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::knngpt::emu::dynamic_shared_memory())
#else
#define KNNGPT_DYNAMIC_SHARED(type, name)                                          \
    extern __shared__ __align__(128) unsigned char knngpt_dynamic_shared_bytes[]; \
    type* name = reinterpret_cast<type*>(knngpt_dynamic_shared_bytes)
#endif

namespace knngpt::cuda {

// dst (n) += the chunk-ordered sum of partial (chunks, n): add_chunk_sums_kernel.
inline void add_chunk_sums(float* dst, const float* partial, int chunks, int n) {
    if (n == 0) return;
    launch(add_chunk_sums_kernel, ceil_div(n, kChunkSumThreads), kChunkSumThreads, 0, nullptr, dst, partial, chunks, n);
}

}  // namespace knngpt::cuda
