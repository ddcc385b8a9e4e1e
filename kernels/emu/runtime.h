// kernels/emu/runtime.h — the CUDA runtime API of the emulator, on host memory.
//
// "Device" memory is aligned host memory. Every cudaMalloc is recorded, so
// the emulator can refuse what a GPU would refuse: a cudaMemcpy whose device
// side is not inside one allocation (say HostToDevice into a host buffer), a
// cudaFree of a pointer cudaMalloc never returned. Work is synchronous:
// streams are tokens, events are time stamps taken when recorded, every
// synchronize returns at once.
//
// Errors follow the runtime's contract: a call returns its cudaError_t and a
// failing call also sets the calling host thread's last error, which
// cudaGetLastError returns and clears (cudaPeekAtLastError leaves it).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

namespace knngpt::emu {

struct Stream {};
struct Event {
    std::chrono::steady_clock::time_point time;
    bool recorded = false;
};

namespace detail {

// Every live cudaMalloc: start address -> size in bytes.
struct DeviceAllocations {
    std::mutex mutex;
    std::map<uintptr_t, size_t> sizes;
};
inline DeviceAllocations& device_allocations() {
    static DeviceAllocations allocations;
    return allocations;
}

inline thread_local cudaError_t last_error = cudaSuccess;

inline cudaError_t record_error(cudaError_t status) {
    if (status != cudaSuccess) last_error = status;
    return status;
}

// Is [p, p + bytes) inside one live device allocation?
inline bool is_device_range(const void* p, size_t bytes) {
    DeviceAllocations& a = device_allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    uintptr_t start = (uintptr_t)p;
    auto it = a.sizes.upper_bound(start);
    if (it == a.sizes.begin()) return false;
    --it;
    size_t offset = start - it->first;
    return offset < it->second && bytes <= it->second - offset;
}

// The checks a GPU makes before a copy: a known direction, and the device
// side(s) inside allocations.
inline cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    bool device_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool device_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (device_dst && !is_device_range(dst, bytes)) return cudaErrorInvalidValue;
    if (device_src && !is_device_range(src, bytes)) return cudaErrorInvalidValue;
    return cudaSuccess;
}

}  // namespace detail
}  // namespace knngpt::emu

typedef knngpt::emu::Stream* cudaStream_t;
typedef knngpt::emu::Event* cudaEvent_t;

constexpr unsigned int cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned int cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2;

// ---- errors -----------------------------------------------------------------

inline cudaError_t cudaGetLastError() {
    cudaError_t status = knngpt::emu::detail::last_error;
    knngpt::emu::detail::last_error = cudaSuccess;
    return status;
}

inline cudaError_t cudaPeekAtLastError() { return knngpt::emu::detail::last_error; }

inline const char* cudaGetErrorString(cudaError_t status) {
    switch (status) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unrecognized error code";
}

inline const char* cudaGetErrorName(cudaError_t status) {
    switch (status) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
        case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

// ---- device -----------------------------------------------------------------

inline cudaError_t cudaGetDeviceCount(int* count) {
    if (!count) return knngpt::emu::detail::record_error(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

inline cudaError_t cudaSetDevice(int device) {
    return knngpt::emu::detail::record_error(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}

inline cudaError_t cudaGetDevice(int* device) {
    if (!device) return knngpt::emu::detail::record_error(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

// The fields of cudaDeviceProp the project reads. The emulated device names
// itself and reports compute capability 0.0, which no peak-FLOP table matches.
struct cudaDeviceProp {
    char name[256];
    int major, minor;
    int multiProcessorCount;
    size_t totalGlobalMem;
    int clockRate;  // kHz
};

inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (!prop || device != 0) return knngpt::emu::detail::record_error(cudaErrorInvalidValue);
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof(prop->name), "%s", "knngpt CUDA emulator (CPU)");
    return cudaSuccess;
}

// ---- memory -----------------------------------------------------------------

// 256-byte aligned like cudaMalloc. A size the host cannot provide returns
// cudaErrorMemoryAllocation; a size of 0 gives a null pointer and success.
inline cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    using namespace knngpt::emu::detail;
    if (!ptr) return record_error(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (bytes == 0) return cudaSuccess;
    constexpr size_t alignment = 256;
    // past x86-64's 47-bit user address space nothing can succeed: refused
    // without asking the allocator (which, under AddressSanitizer, warns)
    constexpr size_t max_bytes = (size_t)1 << 47;
    if (bytes > max_bytes) return record_error(cudaErrorMemoryAllocation);
    void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
    if (!p) return record_error(cudaErrorMemoryAllocation);
    DeviceAllocations& a = device_allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    a.sizes[(uintptr_t)p] = bytes;
    *ptr = p;
    return cudaSuccess;
}

template <class T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
    return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}

inline cudaError_t cudaFree(void* ptr) {
    using namespace knngpt::emu::detail;
    if (!ptr) return cudaSuccess;
    DeviceAllocations& a = device_allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    auto it = a.sizes.find((uintptr_t)ptr);
    if (it == a.sizes.end()) return record_error(cudaErrorInvalidValue);
    a.sizes.erase(it);
    std::free(ptr);
    return cudaSuccess;
}

// Pinned host memory is ordinary host memory here.
inline cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
    if (!ptr) return knngpt::emu::detail::record_error(cudaErrorInvalidValue);
    *ptr = bytes ? std::malloc(bytes) : nullptr;
    return knngpt::emu::detail::record_error(bytes && !*ptr ? cudaErrorMemoryAllocation : cudaSuccess);
}

template <class T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
    return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}

inline cudaError_t cudaFreeHost(void* ptr) {
    std::free(ptr);
    return cudaSuccess;
}

inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    using namespace knngpt::emu::detail;
    cudaError_t status = check_copy(dst, src, bytes, kind);
    if (status != cudaSuccess) return record_error(status);
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}

// Copies `height` rows of `width` bytes between pitched 2-D layouts.
inline cudaError_t cudaMemcpy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                size_t height, cudaMemcpyKind kind) {
    using namespace knngpt::emu::detail;
    if (height == 0 || width == 0) return cudaSuccess;
    if (width > dst_pitch || width > src_pitch) return record_error(cudaErrorInvalidValue);
    // the whole span of each side must lie in one allocation when it is on the device
    cudaError_t status = check_copy(dst, src, 0, kind);
    if (status != cudaSuccess) return record_error(status);
    bool device_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool device_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (device_dst && !is_device_range(dst, dst_pitch * (height - 1) + width)) return record_error(cudaErrorInvalidValue);
    if (device_src && !is_device_range(src, src_pitch * (height - 1) + width)) return record_error(cudaErrorInvalidValue);
    for (size_t row = 0; row < height; row++)
        std::memmove((char*)dst + row * dst_pitch, (const char*)src + row * src_pitch, width);
    return cudaSuccess;
}

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream = nullptr) {
    (void)stream;
    return cudaMemcpy(dst, src, bytes, kind);
}

inline cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
    using namespace knngpt::emu::detail;
    if (bytes == 0) return cudaSuccess;
    if (!is_device_range(ptr, bytes)) return record_error(cudaErrorInvalidValue);
    std::memset(ptr, value, bytes);
    return cudaSuccess;
}

inline cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr) {
    (void)stream;
    return cudaMemset(ptr, value, bytes);
}

// ---- streams and events -----------------------------------------------------

inline cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    if (!stream) return knngpt::emu::detail::record_error(cudaErrorInvalidValue);
    *stream = new knngpt::emu::Stream;
    return cudaSuccess;
}

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
    (void)flags;
    return cudaStreamCreate(stream);
}

inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    delete stream;
    return cudaSuccess;
}

inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    (void)stream;
    return cudaSuccess;
}

// every emulated stream's work has run by the time its call returns
inline cudaError_t cudaStreamQuery(cudaStream_t stream) {
    (void)stream;
    return cudaSuccess;
}

inline cudaError_t cudaEventCreate(cudaEvent_t* event) {
    if (!event) return knngpt::emu::detail::record_error(cudaErrorInvalidValue);
    *event = new knngpt::emu::Event;
    return cudaSuccess;
}

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    (void)flags;
    return cudaEventCreate(event);
}

inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}

inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
    (void)stream;
    if (!event) return knngpt::emu::detail::record_error(cudaErrorInvalidResourceHandle);
    event->time = std::chrono::steady_clock::now();
    event->recorded = true;
    return cudaSuccess;
}

inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return knngpt::emu::detail::record_error(event ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

inline cudaError_t cudaEventQuery(cudaEvent_t event) {
    return knngpt::emu::detail::record_error(event ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

// Milliseconds from start to end; both must have been recorded.
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    using namespace knngpt::emu::detail;
    if (!ms) return record_error(cudaErrorInvalidValue);
    if (!start || !end || !start->recorded || !end->recorded) return record_error(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
    return cudaSuccess;
}

inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0) {
    (void)stream, (void)flags;
    return knngpt::emu::detail::record_error(event ? cudaSuccess : cudaErrorInvalidResourceHandle);
}
