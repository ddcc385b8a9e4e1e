// tests/cuda_test_util.h — helpers shared by the tests that run kernels/cuda
// under the emulator. Include it after kernels/cuda/common.cuh and BEFORE the
// kernel headers: it redefines launch(...) to record the name of every kernel
// launched (then launches as common.cuh does), and prints the count of
// distinct kernels once every test has run.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace knngpt_test {

inline std::set<std::string>& launched_kernels() {
    static std::set<std::string> names;
    return names;
}

// Prints "cuda kernels run under emulation: N" once every test has run.
class LaunchCountReport : public testing::Environment {
  public:
    void TearDown() override { std::printf("cuda kernels run under emulation: %zu\n", launched_kernels().size()); }
};
inline testing::Environment* const launch_count_report = testing::AddGlobalTestEnvironment(new LaunchCountReport);

// A cudaMalloc'd array that frees itself.
template <typename T>
struct DeviceArray {
    T* ptr = nullptr;
    size_t count = 0;

    explicit DeviceArray(const std::vector<T>& host) : count(host.size()) {
        CUDA_CHECK(cudaMalloc(&ptr, count * sizeof(T)));
        CUDA_CHECK(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    ~DeviceArray() { cudaFree(ptr); }

    std::vector<T> to_host() const {
        std::vector<T> host(count);
        CUDA_CHECK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
};

inline std::vector<float> uniform(size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> value(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = value(rng);
    return v;
}

}  // namespace knngpt_test

#undef launch
#define launch(...)                                                                       \
    (::knngpt_test::launched_kernels().insert(::knngpt::emu::kernel_name(#__VA_ARGS__)), \
     ::knngpt::cuda::launch_kernel(__FILE__, __LINE__, #__VA_ARGS__, __VA_ARGS__))
