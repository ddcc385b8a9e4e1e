// kernels/cuda/kernel_times.h — where a GPU run's time goes, by kernel:
// KNNGPT_KERNEL_TIMES=1 in the environment of any program of the CUDA build
// (train_gpt, the native tests, the benchmarks). Every kernel launched through
// launch() (common.cuh) and every cuBLASLt GEMM (matmul.cuh) is then bracketed
// by two CUDA events, and when the program exits it prints to stderr, per
// kernel name (GEMMs by their shape), the calls, the GPU time in total and per
// call and its share, most first:
//   kernel times (KNNGPT_KERNEL_TIMES): 12345 launches, 812.4 ms of GPU time
//         ms   share    calls  us/call  kernel
//     203.11   25.0%      240    846.3  attention_backward_dkv_mma_kernel<AttentionMmaTiles<64>>
// The events add a little time to each launch, so tok/s is read from runs
// without it. Not compiled under the emulator, whose timings mean nothing.
#pragma once

#if !defined(KNNGPT_CUDA_EMU)

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace knngpt::cuda {

class KernelTimes {
 public:
    static KernelTimes& get() {
        static KernelTimes times;
        return times;
    }
    // KNNGPT_KERNEL_TIMES=1, read once
    static bool enabled() {
        static const bool on = [] {
            const char* value = std::getenv("KNNGPT_KERNEL_TIMES");
            return value != nullptr && std::strcmp(value, "1") == 0;
        }();
        return on;
    }
    // Brackets the work queued on stream between begin and end under name.
    int begin(const std::string& name, cudaStream_t stream) {
        if (!registered_) {
            std::atexit([] { KernelTimes::get().report(); });
            registered_ = true;
        }
        if (spans_.size() >= kFoldAt) fold();
        Span span{name, nullptr, nullptr};
        cudaEventCreate(&span.start);
        cudaEventCreate(&span.stop);
        cudaEventRecord(span.start, stream);
        spans_.push_back(span);
        return (int)spans_.size() - 1;
    }
    void end(int span, cudaStream_t stream) { cudaEventRecord(spans_[span].stop, stream); }

    void report() {
        fold();
        if (totals_.empty()) return;
        double all = 0.0;
        long launches = 0;
        for (const auto& [name, total] : totals_) all += total.ms, launches += total.calls;
        std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
        std::fprintf(stderr, "kernel times (KNNGPT_KERNEL_TIMES): %ld launches, %.1f ms of GPU time\n", launches, all);
        std::fprintf(stderr, "%10s %7s %8s %9s  %s\n", "ms", "share", "calls", "us/call", "kernel");
        for (const auto& [name, total] : rows)
            std::fprintf(stderr, "%10.2f %6.1f%% %8ld %9.1f  %s\n", total.ms, all > 0 ? 100.0 * total.ms / all : 0.0,
                         total.calls, 1000.0 * total.ms / total.calls, name.c_str());
    }

 private:
    struct Span {
        std::string name;
        cudaEvent_t start, stop;
    };
    struct Total {
        double ms = 0.0;
        long calls = 0;
    };
    // Every kFoldAt launches (and at the report) the spans so far are waited for,
    // added to the totals and their events destroyed, so a long run holds few events.
    static constexpr size_t kFoldAt = 4096;
    void fold() {
        if (spans_.empty() || cudaDeviceSynchronize() != cudaSuccess) return;
        for (const Span& s : spans_) {
            float ms = 0.0f;
            if (cudaEventElapsedTime(&ms, s.start, s.stop) == cudaSuccess) {
                totals_[s.name].ms += ms;
                totals_[s.name].calls++;
            }
            cudaEventDestroy(s.start);
            cudaEventDestroy(s.stop);
        }
        spans_.clear();
    }
    std::vector<Span> spans_;
    std::map<std::string, Total> totals_;
    bool registered_ = false;
};

}  // namespace knngpt::cuda

#endif
