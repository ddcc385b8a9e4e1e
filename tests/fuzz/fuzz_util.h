// tests/fuzz/fuzz_util.h — what the libFuzzer targets of tests/fuzz share:
// the input as a file for readers that take a path, a directory of their own
// for readers that take several files, the input read as fields, and the
// checks every target makes of a reader:
// - an error is one line (std::runtime_error, no newline in it); any other
//   exception escapes and libFuzzer reports it;
// - no single allocation is larger than the input justifies: a reader must
//   check the sizes its header claims against the file before it allocates
//   (AllocationWatch: at most 64 bytes per input byte, plus 256 KiB).
#pragma once
#include <sanitizer/allocator_interface.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace knngpt_fuzz {

[[noreturn]] inline void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz: %s\n", what.c_str());
    std::abort();
}

inline void write_all(int fd, const uint8_t* data, size_t size) {
    while (size > 0) {
        ssize_t n = ::write(fd, data, size);
        if (n <= 0) fail("cannot write the input to a file");
        data += n, size -= (size_t)n;
    }
}

// The input as an anonymous in-memory file, named by a path that open(2) takes.
struct MemFile {
    int fd = -1;
    std::string path;
    MemFile(const uint8_t* data, size_t size) {
        fd = memfd_create("fuzz-input", 0);
        if (fd < 0) fail("memfd_create failed");
        write_all(fd, data, size);
        path = "/proc/self/fd/" + std::to_string(fd);
    }
    ~MemFile() { ::close(fd); }
    MemFile(const MemFile&) = delete;
    MemFile& operator=(const MemFile&) = delete;
};

// A directory for this process's files ($TMPDIR or /tmp), made on first use
// and removed at exit.
inline std::string& scratch_dir_name() {
    static std::string dir;
    return dir;
}
inline const std::string& scratch_dir() {
    std::string& dir = scratch_dir_name();
    if (dir.empty()) {
        const char* tmp = std::getenv("TMPDIR");
        std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/knngpt-fuzz-XXXXXX";
        std::vector<char> name(pattern.begin(), pattern.end());
        name.push_back('\0');
        if (!mkdtemp(name.data())) fail("cannot make a scratch directory");
        dir = name.data();
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(scratch_dir_name(), ec);
        });
    }
    return dir;
}

inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail("cannot write " + path);
    if (size && std::fwrite(data, 1, size, f) != size) fail("cannot write " + path);
    std::fclose(f);
}

// The fields of an input, read front to back; past the end every field is 0.
struct ByteReader {
    const uint8_t* data;
    size_t size, pos = 0;
    ByteReader(const uint8_t* d, size_t n) : data(d), size(n) {}
    uint8_t u8() { return pos < size ? data[pos++] : 0; }
    uint32_t u32() {
        uint32_t x = 0;
        for (int i = 0; i < 4; i++) x |= (uint32_t)u8() << (8 * i);
        return x;
    }
    uint64_t u64() { return (uint64_t)u32() | (uint64_t)u32() << 32; }
    size_t remaining() const { return size - pos; }
    // the next n bytes (fewer at the end)
    std::pair<const uint8_t*, size_t> bytes(size_t n) {
        n = std::min(n, remaining());
        const uint8_t* p = data + pos;
        pos += n;
        return {p, n};
    }
};

// A reader's error: one line.
inline void check_error_line(const std::string& what) {
    if (what.empty() || what.find('\n') != std::string::npos) fail("an error that is not one line: '" + what + "'");
}
inline void check_error_line(const std::exception& e) { check_error_line(std::string(e.what())); }

// The largest single allocation between start() and check().
namespace detail {
inline std::atomic<bool> watching{false};
inline std::atomic<size_t> largest{0};
inline void on_malloc(const volatile void*, size_t size) {
    if (!watching.load(std::memory_order_relaxed)) return;
    size_t seen = largest.load(std::memory_order_relaxed);
    while (size > seen && !largest.compare_exchange_weak(seen, size)) {}
}
inline void on_free(const volatile void*) {}
}  // namespace detail

struct AllocationWatch {
    size_t limit;
    explicit AllocationWatch(size_t input_bytes) : limit(64 * input_bytes + (256u << 10)) {
        static const bool installed = __sanitizer_install_malloc_and_free_hooks(detail::on_malloc, detail::on_free) != 0;
        if (!installed) fail("cannot install the allocation hooks");
        detail::largest = 0;
        detail::watching = true;
    }
    ~AllocationWatch() { detail::watching = false; }
    void check() {
        detail::watching = false;
        if (detail::largest > limit)
            fail("one allocation of " + std::to_string(detail::largest.load()) + " bytes, more than the input justifies (" +
                 std::to_string(limit) + ")");
    }
};

// The common shape of a target whose reader takes one file: the input as a
// file, read(path, watch) under the allocation watch (read calls watch.check()
// once the reader returns, before checks of its own allocate), errors checked.
template <class Read>
int fuzz_one_file(const uint8_t* data, size_t size, Read read) {
    MemFile file(data, size);
    AllocationWatch watch(size);
    try {
        read(file.path, watch);
    } catch (const std::runtime_error& e) {
        check_error_line(e);
    }
    watch.check();
    return 0;
}

}  // namespace knngpt_fuzz
