// tests/device_array.h — a cudaMalloc'd array that frees itself, for the tests
// of kernels/emu and kernels/cuda (under the emulator or natively). Include it
// after kernels/cuda/common.cuh.
#pragma once
#include <cstddef>
#include <vector>

namespace knngpt_test {

template <typename T>
struct DeviceArray {
    T* ptr = nullptr;
    size_t count = 0;

    // n elements, uninitialised
    explicit DeviceArray(size_t n) : count(n) { CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T))); }
    // a copy of host
    explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
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

}  // namespace knngpt_test
