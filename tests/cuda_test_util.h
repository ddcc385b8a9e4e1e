// tests/cuda_test_util.h — what the tests of kernels/cuda share: the build
// mode, the device fixture (CUDA_TEST) and the record of launched kernels.
// Include it first, before any kernel header. The same test file builds two ways:
//   g++  (make test)                       KNNGPT_CUDA_EMU, defined here: the
//        kernels run under the CPU emulator;
//   nvcc -DKNNGPT_CUDA_NATIVE (make test-native)  they run on the GPU, and every
//        test is skipped, with the reason printed, where no device exists.
// Including it installs common.cuh's launch observer, which records the name of
// every kernel launched; once every test has run, the distinct kernels are
// printed on one line tools/run_tests.sh totals:
//   cuda kernels run under emulation: N: name name ...     (or "natively")
// launches_of(call) gives a test the kernels one call launched (which path
// it took).
#pragma once
#ifndef KNNGPT_CUDA_NATIVE
#define KNNGPT_CUDA_EMU
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "tests/device_array.h"

namespace knngpt_test {

#if defined(KNNGPT_CUDA_EMU)
constexpr const char* kCudaRunMode = "under emulation";
#else
constexpr const char* kCudaRunMode = "natively";
#endif

inline std::set<std::string>& launched_kernels() {
    static std::set<std::string> names;
    return names;
}

// The kernel a launch(...) text names: its first argument, without template
// arguments ("attention_kernel<64>, grid, ..." -> "attention_kernel").
inline std::string launched_kernel_name(const char* launch_text) {
    std::string name;
    for (const char* c = launch_text; *c && *c != ',' && *c != '<'; c++)
        if (*c != ' ' && *c != '\n' && *c != '\t') name += *c;
    return name.empty() ? std::string("?") : name;
}

// The kernels a stretch of code launched, in order: count(name) counts every
// instantiation of a kernel template ("attention_forward_tiled_kernel"),
// count(kernel) the one instantiation (attention_forward_tiled_kernel<AttentionTiles<128>>).
struct Launches {
    std::vector<std::string> names;
    std::vector<const void*> kernels;

    size_t size() const { return names.size(); }
    int count(const std::string& name) const { return (int)std::count(names.begin(), names.end(), name); }
    template <typename... Params>
    int count(void (*kernel)(Params...)) const {
        return (int)std::count(kernels.begin(), kernels.end(), reinterpret_cast<const void*>(kernel));
    }
    // the names, space-separated (for failure messages)
    std::string list() const {
        std::string all;
        for (const std::string& name : names) all += (all.empty() ? "" : " ") + name;
        return all.empty() ? std::string("(none)") : all;
    }
};

class LaunchRecord;
inline std::vector<LaunchRecord*>& live_launch_records() {
    static std::vector<LaunchRecord*> records;
    return records;
}

// Records the kernels launched from its construction to its destruction.
// Records may nest; each sees every launch.
class LaunchRecord {
  public:
    LaunchRecord() { live_launch_records().push_back(this); }
    ~LaunchRecord() {
        std::vector<LaunchRecord*>& live = live_launch_records();
        live.erase(std::remove(live.begin(), live.end(), this), live.end());
    }
    LaunchRecord(const LaunchRecord&) = delete;
    LaunchRecord& operator=(const LaunchRecord&) = delete;

    const Launches& launches() const { return launches_; }
    void add(const std::string& name, const void* kernel) {
        launches_.names.push_back(name);
        launches_.kernels.push_back(kernel);
    }

  private:
    Launches launches_;
};

// The kernels call() launched:
//   const Launches launched = launches_of([&] { knngpt::cuda::attention_forward_fp32(...); });
//   EXPECT_EQ(launched.count(knngpt::cuda::attention_forward_tiled_kernel<knngpt::cuda::AttentionTiles<128>>), 1) << launched.list();
//   EXPECT_EQ(launched.count("attention_forward_kernel"), 0) << launched.list();
template <typename Call>
Launches launches_of(Call&& call) {
    LaunchRecord record;
    call();
    return record.launches();
}

// common.cuh's launch observer for these tests: every kernel goes into
// launched_kernels() and into every live LaunchRecord.
inline void record_launch(const char* launch_text, const void* kernel) {
    const std::string name = launched_kernel_name(launch_text);
    launched_kernels().insert(name);
    for (LaunchRecord* record : live_launch_records()) record->add(name, kernel);
}
inline const bool launch_recording_installed = (::knngpt::cuda::launch_observer() = record_launch, true);

// Why native tests cannot run here ("" when a CUDA device exists, and always
// under the emulator).
inline const std::string& no_device_reason() {
    static const std::string reason = [] {
#if defined(KNNGPT_CUDA_EMU)
        return std::string();
#else
        int devices = 0;
        cudaError_t status = cudaGetDeviceCount(&devices);
        if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
        return devices == 0 ? std::string("no CUDA device") : std::string();
#endif
    }();
    return reason;
}

// The fixture of every CUDA_TEST: skips the test, printing the reason, in a
// native build on a machine without a CUDA device.
class CudaDeviceTest : public testing::Test {
  protected:
    void SetUp() override {
        if (!no_device_reason().empty()) GTEST_SKIP() << "native CUDA test skipped: " << no_device_reason();
    }
};

// Prints the kernels that ran once every test has.
class CudaTestEnvironment : public testing::Environment {
  public:
    void TearDown() override {
        std::printf("cuda kernels run %s: %zu:", kCudaRunMode, launched_kernels().size());
        for (const std::string& name : launched_kernels()) std::printf(" %s", name.c_str());
        std::printf("\n");
    }
};
inline testing::Environment* const cuda_test_environment = testing::AddGlobalTestEnvironment(new CudaTestEnvironment);

}  // namespace knngpt_test

// CUDA_TEST(Suite, Name) { ... }: a test of kernels/cuda. It is GoogleTest's
// TEST(Suite, Name) with CudaDeviceTest for its fixture (the way TEST_F gives
// a test its fixture), so it is skipped, saying why, in a native build on a
// machine without a CUDA device. GoogleTest's TEST itself is left as it is.
#define CUDA_TEST(suite, name) \
    GTEST_TEST_(suite, name, ::knngpt_test::CudaDeviceTest, ::testing::internal::GetTypeId<::knngpt_test::CudaDeviceTest>())
