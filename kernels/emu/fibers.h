// kernels/emu/fibers.h — the emulator's execution model: the blocks of a grid
// run one after another on the calling OS thread, and the threads of a block
// run as fibers (ucontext) that switch only where a thread waits.
//
// Scheduling. A fiber runs until it waits (at a block barrier, at a warp
// primitive, or because it exited) and then switches straight to the next
// runnable fiber of its block, taken from a FIFO queue. The fiber whose
// arrival completes a barrier releases the waiters into the queue and carries
// on without a switch. When the queue runs dry the block is over: either every
// fiber has exited, or the live ones wait for something that can never
// happen, and the launch reports that deadlock.
//
// Block barrier (__syncthreads): completes when every live fiber of the block
// has arrived (an exited fiber counts as arrived), all at the same call site.
// Arrivals at two different sites can never complete: a deadlock.
//
// Warp rounds (__shfl_*_sync, votes, __syncwarp, wmma): lane l of warp w is
// the fiber with linear thread index 32 * w + l. A lane publishes its operand
// and waits; the round of mask M completes when every lane of M waits at the
// same primitive with the same mask. The completing lane computes the result
// of every lane from the published operands at once, so all lanes read this
// round's values before any lane can publish the next. A lane of M that has
// exited, does not exist (a partial last warp) or waits elsewhere leaves the
// round incomplete forever: a deadlock.
//
// A deadlock, or a misuse a GPU would not diagnose (a shuffle reading a lane
// outside its mask, a caller missing from its own mask), ends the launch: it
// throws std::runtime_error with one line naming the kernel, the block, the
// thread and the call sites involved. The emulator is ready for the next
// launch; the abandoned fibers' stack objects are never destroyed.
//
// Design: blocks run sequentially on one OS thread, which is what makes a static
// __shared__ correct (types.h) and atomics plain read-modify-writes; never run
// blocks on several OS threads without giving each its own shared memory.
#pragma once
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/launch_text.h"
#include "kernels/emu/runtime.h"
#include "kernels/emu/types.h"

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

namespace knngpt::emu {

// The limits of an sm_90 GPU that a launch is checked against.
constexpr unsigned kWarpLanes = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDimXY = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimX = 0x7FFFFFFFu;
constexpr unsigned kMaxGridDimYZ = 65535;
constexpr size_t kDefaultDynamicSharedBytes = 48 * 1024;  // without cudaFuncSetAttribute
constexpr size_t kMaxDynamicSharedBytes = 227 * 1024;     // the opt-in ceiling
constexpr size_t kDynamicSharedAlignment = 128;
// Dynamic shared memory is filled with this before every block: NaN as fp32
// and bf16, -1 as an integer, so reading it before writing shows.
constexpr unsigned char kSharedMemoryPoison = 0xFF;

enum class Wait : uint8_t { none, block_barrier, warp_round, exited };

enum class WarpOp : uint8_t {
    syncwarp, shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all, wmma_load, wmma_store, wmma_mma, collective,
};

// A warp-collective operation whose lanes exchange registers (mma.sync,
// ldmatrix: kernels/emu/mma.h). Each lane publishes a pointer to its own
// arguments, a struct that begins with a WarpCollective; the lane that
// completes the round calls complete() with all 32 pointers (lane order) and
// writes every lane's results before any lane runs on.
struct WarpCollective {
    void (*complete)(void* const lane_args[32]);
};

struct Fiber {
    ucontext_t context;
    char* stack;
    uint3 thread_idx;
    unsigned linear;  // x + y * blockDim.x + z * blockDim.x * blockDim.y
    Wait wait;
    // the call it waits at
    const char* what;
    const char* file;
    int line;
    // a warp round: the primitive, its mask, this lane's arguments and result
    WarpOp op;
    unsigned mask;
    uint64_t operand;  // the value (shuffles) or predicate (votes) it publishes
    int lane_arg;      // srcLane, delta or laneMask
    int width;
    uint64_t result;
};

// ---- fiber stacks -----------------------------------------------------------
// 64 KiB per fiber unless set_fiber_stack_bytes or the environment variable
// KNNGPT_EMU_STACK_KIB says otherwise, each above a guard page, so an overflow
// that grows frame by frame faults instead of corrupting a neighbour (one frame
// larger than a page can still jump it). They are mapped by the first launch that
// needs them and reused by every later block and launch. AddressSanitizer's frames
// are larger, so the default stack is 4 times larger under it.

inline size_t& fiber_stack_setting() {
    static size_t bytes = [] {
        const char* kib = std::getenv("KNNGPT_EMU_STACK_KIB");
        long value = kib ? std::atol(kib) : 0;
#if defined(__SANITIZE_ADDRESS__)
        const size_t default_kib = 256;
#else
        const size_t default_kib = 64;
#endif
        return (size_t)(value > 0 ? value : default_kib) * 1024;
    }();
    return bytes;
}

// Stack size of every fiber from the next launch on.
inline void set_fiber_stack_bytes(size_t bytes) { fiber_stack_setting() = bytes; }

// getcontext returns twice as far as the compiler knows; kept out of line so
// that no caller's locals are at risk (-Wclobbered).
__attribute__((noinline)) inline void init_context(ucontext_t* context) { getcontext(context); }

// Fibers and their stacks, grown on demand and kept for later launches.
class FiberPool {
public:
    FiberPool() = default;
    FiberPool(const FiberPool&) = delete;
    FiberPool& operator=(const FiberPool&) = delete;
    ~FiberPool() { release(); }

    Fiber* reserve(unsigned count, size_t stack_bytes) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        stack_bytes = std::max(page, (stack_bytes + page - 1) / page * page);
        if (count <= count_ && stack_bytes == stack_bytes_) return fibers_.get();
        count = std::max(count, count_);
        release();
        const size_t stride = page + stack_bytes;  // guard page, then the stack
        void* base = mmap(nullptr, count * stride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                          -1, 0);
        if (base == MAP_FAILED)
            throw std::runtime_error("emu: cannot map " + std::to_string(count) + " fiber stacks of " +
                                     std::to_string(stack_bytes / 1024) + " KiB");
        mapping_ = static_cast<char*>(base);
        mapped_bytes_ = count * stride;
        fibers_.reset(new Fiber[count]);
        for (unsigned i = 0; i < count; i++) {
            char* guard = mapping_ + i * stride;
            mprotect(guard, page, PROT_NONE);
            fibers_[i].stack = guard + page;
            init_context(&fibers_[i].context);
        }
        count_ = count;
        stack_bytes_ = stack_bytes;
        return fibers_.get();
    }

    size_t stack_bytes() const { return stack_bytes_; }

private:
    void release() {
        // the shadow of frames left on the stacks goes with them: a later mapping
        // at these addresses (the sanitizer's own, as its symbolizer's) starts clean
#if defined(__SANITIZE_ADDRESS__)
        if (mapping_) ASAN_UNPOISON_MEMORY_REGION(mapping_, mapped_bytes_);
#endif
        if (mapping_) munmap(mapping_, mapped_bytes_);
        mapping_ = nullptr;
        fibers_.reset();
        count_ = 0;
    }

    std::unique_ptr<Fiber[]> fibers_;
    unsigned count_ = 0;
    size_t stack_bytes_ = 0;
    char* mapping_ = nullptr;
    size_t mapped_bytes_ = 0;
};

inline FiberPool& fiber_pool() {
    static FiberPool pool;
    return pool;
}

// ---- the running launch -----------------------------------------------------

struct Launch {
    std::string kernel;
    dim3 grid, block;
    unsigned threads = 0;  // per block
    Fiber* fibers = nullptr;
    void (*body)(const void*) = nullptr;  // calls the kernel with its arguments
    const void* args = nullptr;
    unsigned char* dynamic_shared = nullptr;
    size_t dynamic_shared_bytes = 0;
    ucontext_t scheduler{};  // where a block returns when no fiber can run
    // the stack the scheduler runs on (the launching OS thread's), for the sanitizer
    const void* scheduler_stack = nullptr;
    size_t scheduler_stack_bytes = 0;

    // the block being run
    uint3 block_idx{0, 0, 0};
    unsigned live = 0;  // fibers not exited
    std::vector<unsigned> queue;  // runnable fibers, a ring of capacity `threads`
    unsigned queue_head = 0, queue_size = 0;
    unsigned barrier_arrived = 0, barrier_true = 0;  // at the block barrier; with a true predicate
    const char* barrier_file = nullptr;
    int barrier_line = 0;
    bool barrier_mismatch = false;  // arrivals at different call sites

    std::string thrown;  // what the kernel threw
    std::string error;   // why the launch ends early

    void push(unsigned fiber) {
        queue[(queue_head + queue_size) % threads] = fiber;
        queue_size++;
    }
    Fiber* pop() {
        if (queue_size == 0) return nullptr;
        unsigned fiber = queue[queue_head];
        queue_head = (queue_head + 1) % threads;
        queue_size--;
        return &fibers[fiber];
    }
};

namespace detail {
inline Launch* active = nullptr;
// The current fiber: a plain global pointer that whoever switches to a fiber sets
// just before the switch; threadIdx reads through it. (A thread_local would be the
// same for every fiber of the OS thread.)
inline Fiber* current = nullptr;
inline uint3 block_idx{0, 0, 0};
inline dim3 block_dim, grid_dim;
inline std::atomic<bool> busy{false};
}  // namespace detail

inline std::string format_index(uint3 v) {
    return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

// "__shfl_xor_sync(mask 0x0000ffff) at tests/test_emu.cpp:120"
inline std::string describe_call(const Fiber& f) {
    std::string call = f.what;
    if (f.wait == Wait::warp_round) {
        char mask[32];
        std::snprintf(mask, sizeof mask, "(mask 0x%08x)", f.mask);
        call += mask;
    }
    return call + " at " + f.file + ":" + std::to_string(f.line);
}

// "emu: kernel K, block (3,0,0), thread (17,0,0): "
inline std::string where(const Launch& launch, const Fiber& f) {
    return "emu: kernel " + launch.kernel + ", block " + format_index(launch.block_idx) + ", thread " +
           format_index(f.thread_idx) + ": ";
}

// ---- switching --------------------------------------------------------------
// swapcontext makes one system call per switch (for the signal mask), which is
// fine for test-sized launches. AddressSanitizer (make test SANITIZE=1) tracks one
// stack per OS thread; every switch tells it which stack comes next and where it
// is (switch_context), or it would take a fiber's frames for overflows of the
// thread's stack.

// swapcontext(from, to), where `to` runs on the stack [to_stack, to_stack +
// to_stack_bytes). Under AddressSanitizer the switch is announced, and the
// stack that left is told apart from one that will come back (`from_ends`: its
// frames are dropped); returns when something switches back to `from`.
#if defined(__SANITIZE_ADDRESS__)
// libc's swapcontext itself: the sanitizer's wrapper of it prints a warning
// that would break the one-line error output the tests check, and clears the
// whole stack it switches to, live frames included; here the announcements
// below say which stack runs, and run_block clears a fiber's stack before the
// fiber starts on it.
inline int libc_swapcontext(ucontext_t* from, ucontext_t* to) {
    using Swap = int (*)(ucontext_t*, ucontext_t*);
    static const Swap swap = [] {
        void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        Swap f = libc ? reinterpret_cast<Swap>(dlsym(libc, "swapcontext")) : nullptr;
        if (!f) {
            std::fprintf(stderr, "emu: cannot find libc's swapcontext\n");
            std::abort();
        }
        return f;
    }();
    return swap(from, to);
}
#endif

inline void switch_context(ucontext_t* from, ucontext_t* to, const void* to_stack, size_t to_stack_bytes,
                           bool from_ends = false) {
#if defined(__SANITIZE_ADDRESS__)
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(from_ends ? nullptr : &fake_stack, to_stack, to_stack_bytes);
    libc_swapcontext(from, to);
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
    (void)to_stack, (void)to_stack_bytes, (void)from_ends;
    swapcontext(from, to);
#endif
}

// Switches from `self` to fiber `next`, or to the scheduler when next is null.
inline void switch_to(Launch& launch, Fiber& self, Fiber* next, bool self_ends) {
    detail::current = next;
    if (next) switch_context(&self.context, &next->context, next->stack, fiber_pool().stack_bytes(), self_ends);
    else switch_context(&self.context, &launch.scheduler, launch.scheduler_stack, launch.scheduler_stack_bytes, self_ends);
}

// Leaves `self` (waiting or exited) for the next runnable fiber, or for the
// scheduler when there is none. Returns when some fiber resumes `self`.
inline void switch_away(Fiber& self, bool self_ends = false) {
    Launch& launch = *detail::active;
    switch_to(launch, self, launch.pop(), self_ends);
}

// Ends the launch from inside a fiber; launch.error says why.
[[noreturn]] inline void abandon_launch(Fiber& self) {
    Launch& launch = *detail::active;
    switch_to(launch, self, nullptr, true);
    std::abort();  // an abandoned fiber is never resumed
}

// ---- block barrier ----------------------------------------------------------

inline bool same_site(const char* file_a, int line_a, const char* file_b, int line_b) {
    return line_a == line_b && (file_a == file_b || std::strcmp(file_a, file_b) == 0);
}

// Releases the block barrier if every live fiber waits at it, at one site.
// Each waiter's result: arrivals in the high 32 bits, true predicates low.
inline bool release_block_barrier(Launch& launch) {
    if (launch.barrier_arrived == 0 || launch.barrier_arrived != launch.live || launch.barrier_mismatch) return false;
    const uint64_t result = (uint64_t)launch.barrier_arrived << 32 | launch.barrier_true;
    for (unsigned i = 0; i < launch.threads; i++) {
        Fiber& f = launch.fibers[i];
        if (f.wait != Wait::block_barrier) continue;
        f.wait = Wait::none;
        f.result = result;
        if (&f != detail::current) launch.push(i);
    }
    launch.barrier_arrived = launch.barrier_true = 0;
    launch.barrier_mismatch = false;
    return true;
}

inline uint64_t block_barrier(const char* what, const char* file, int line, bool predicate) {
    Launch& launch = *detail::active;
    Fiber& self = *detail::current;
    self.wait = Wait::block_barrier;
    self.what = what, self.file = file, self.line = line;
    if (launch.barrier_arrived == 0) {
        launch.barrier_file = file, launch.barrier_line = line;
    } else if (!same_site(file, line, launch.barrier_file, launch.barrier_line)) {
        launch.barrier_mismatch = true;
    }
    launch.barrier_arrived++;
    launch.barrier_true += predicate;
    if (!release_block_barrier(launch)) switch_away(self);
    return self.result;
}

// ---- warp rounds ------------------------------------------------------------

// The lane a shuffle reads, as PTX shfl.sync defines it: the warp is cut into
// segments of `width` lanes; idx reads lane srcLane % width of the caller's
// segment; up/down read lane -/+ delta and fall back to the caller's own value
// outside the segment; xor reads lane ^ laneMask, its own value when that lies
// past the segment's end (lower segments are reachable).
inline unsigned shfl_source_lane(WarpOp op, unsigned lane, int lane_arg, int width) {
    const int64_t first = lane & ~(unsigned)(width - 1), last = first + width - 1;
    int64_t source = lane;
    switch (op) {
        case WarpOp::shfl_idx: return (unsigned)first + ((unsigned)lane_arg & (unsigned)(width - 1));
        case WarpOp::shfl_up: source = (int64_t)lane - (unsigned)lane_arg; return source >= first ? (unsigned)source : lane;
        case WarpOp::shfl_down: source = (int64_t)lane + (unsigned)lane_arg; return source <= last ? (unsigned)source : lane;
        case WarpOp::shfl_xor: source = lane ^ (unsigned)lane_arg; return source <= last ? (unsigned)source : lane;
        default: return lane;
    }
}

// If every lane of self's mask waits at self's primitive with self's mask,
// computes every lane's result, releases the others and returns true.
inline bool complete_warp_round(Launch& launch, Fiber& self) {
    const unsigned base = self.linear - self.linear % kWarpLanes, mask = self.mask;
    for (unsigned m = mask; m; m &= m - 1) {
        const unsigned i = base + __builtin_ctz(m);
        if (i >= launch.threads) return false;
        const Fiber& f = launch.fibers[i];
        if (f.wait != Wait::warp_round || f.op != self.op || f.mask != mask) return false;
    }
    Fiber* lanes = launch.fibers + base;
    switch (self.op) {
        case WarpOp::shfl_idx:
        case WarpOp::shfl_up:
        case WarpOp::shfl_down:
        case WarpOp::shfl_xor:
            for (unsigned m = mask; m; m &= m - 1) {
                const unsigned lane = __builtin_ctz(m);
                Fiber& f = lanes[lane];
                const unsigned source = shfl_source_lane(f.op, lane, f.lane_arg, f.width);
                if (!(mask >> source & 1u)) {
                    launch.error = where(launch, f) + describe_call(f) + " reads lane " + std::to_string(source) +
                                   ", which is not in the mask";
                    abandon_launch(self);
                }
                f.result = lanes[source].operand;
            }
            break;
        case WarpOp::ballot:
        case WarpOp::any:
        case WarpOp::all: {
            uint64_t votes = 0;
            for (unsigned m = mask; m; m &= m - 1) {
                const unsigned lane = __builtin_ctz(m);
                if (lanes[lane].operand) votes |= 1ull << lane;
            }
            const uint64_t result = self.op == WarpOp::ballot ? votes
                                    : self.op == WarpOp::any  ? (uint64_t)(votes != 0)
                                                              : (uint64_t)(votes == mask);
            for (unsigned m = mask; m; m &= m - 1) lanes[__builtin_ctz(m)].result = result;
            break;
        }
        case WarpOp::collective: {
            void* lane_args[kWarpLanes] = {};
            const auto complete = reinterpret_cast<const WarpCollective*>(self.operand)->complete;
            for (unsigned m = mask; m; m &= m - 1) {
                const unsigned lane = __builtin_ctz(m);
                lane_args[lane] = reinterpret_cast<void*>(lanes[lane].operand);
                if (reinterpret_cast<const WarpCollective*>(lane_args[lane])->complete != complete) {
                    launch.error = where(launch, lanes[lane]) + describe_call(lanes[lane]) + ": lane " +
                                   std::to_string(lane) + " is at another warp-collective instruction than " +
                                   describe_call(self);
                    abandon_launch(self);
                }
            }
            reinterpret_cast<const WarpCollective*>(self.operand)->complete(lane_args);
            break;
        }
        default: break;  // a pure synchronisation
    }
    for (unsigned m = mask; m; m &= m - 1) {
        const unsigned lane = __builtin_ctz(m);
        lanes[lane].wait = Wait::none;
        if (&lanes[lane] != &self) launch.push(base + lane);
    }
    return true;
}

// One lane's part in a warp round; returns its result.
inline uint64_t warp_round(WarpOp op, const char* what, const char* file, int line, unsigned mask, uint64_t operand,
                           int lane_arg = 0, int width = (int)kWarpLanes) {
    Launch& launch = *detail::active;
    Fiber& self = *detail::current;
    self.wait = Wait::warp_round;
    self.what = what, self.file = file, self.line = line;
    self.op = op, self.mask = mask, self.operand = operand, self.lane_arg = lane_arg, self.width = width;
    const unsigned lane = self.linear % kWarpLanes;
    if (!(mask >> lane & 1u)) {
        launch.error = where(launch, self) + describe_call(self) + ": the calling lane " + std::to_string(lane) +
                       " is not in the mask";
        abandon_launch(self);
    }
    if (width < 1 || width > (int)kWarpLanes || (width & (width - 1))) {
        launch.error = where(launch, self) + describe_call(self) + ": width " + std::to_string(width) +
                       " is not a power of two in [1, 32]";
        abandon_launch(self);
    }
    if (!complete_warp_round(launch, self)) switch_away(self);
    return self.result;
}

// ---- fiber lifetime ---------------------------------------------------------

[[noreturn]] inline void exit_fiber(Fiber& self) {
    Launch& launch = *detail::active;
    self.wait = Wait::exited;
    launch.live--;
    release_block_barrier(launch);  // the exit may complete it
    switch_away(self, true);
    std::abort();  // an exited fiber is never resumed
}

inline void run_kernel_body(Launch& launch) {
    try {
        launch.body(launch.args);
    } catch (const std::exception& e) {
        launch.thrown = std::string("the kernel threw: ") + e.what();
    } catch (...) {
        launch.thrown = "the kernel threw an exception of unknown type";
    }
}

// Where every fiber starts.
inline void fiber_main() {
    Launch& launch = *detail::active;
    Fiber& self = *detail::current;
#if defined(__SANITIZE_ADDRESS__)
    // the first fiber of a launch is entered from the scheduler: note its stack
    const void* from_stack = nullptr;
    size_t from_stack_bytes = 0;
    __sanitizer_finish_switch_fiber(nullptr, &from_stack, &from_stack_bytes);
    if (!launch.scheduler_stack) launch.scheduler_stack = from_stack, launch.scheduler_stack_bytes = from_stack_bytes;
#endif
    run_kernel_body(launch);
    if (!launch.thrown.empty()) {
        launch.error = where(launch, self) + launch.thrown;
        abandon_launch(self);
    }
    exit_fiber(self);
}

// Once the queue has run dry with live fibers left: one line naming the
// first waiting thread, where it waits, and a thread that keeps it waiting.
inline std::string describe_deadlock(const Launch& launch) {
    const Fiber* stuck = nullptr;
    for (unsigned i = 0; i < launch.threads && !stuck; i++)
        if (launch.fibers[i].wait == Wait::block_barrier || launch.fibers[i].wait == Wait::warp_round)
            stuck = &launch.fibers[i];
    if (!stuck) return "emu: deadlock in kernel " + launch.kernel + ": no thread can run";
    std::string message = "emu: deadlock in kernel " + launch.kernel + ", block " + format_index(launch.block_idx) +
                          ", thread " + format_index(stuck->thread_idx) + ": " + describe_call(*stuck);
    if (stuck->wait == Wait::block_barrier) {
        for (unsigned i = 0; i < launch.threads; i++) {
            const Fiber& f = launch.fibers[i];
            bool elsewhere = f.wait == Wait::warp_round ||
                             (f.wait == Wait::block_barrier && !same_site(f.file, f.line, stuck->file, stuck->line));
            if (elsewhere) return message + " while thread " + format_index(f.thread_idx) + " waits at " + describe_call(f);
        }
        return message;
    }
    const unsigned base = stuck->linear - stuck->linear % kWarpLanes;
    for (unsigned m = stuck->mask; m; m &= m - 1) {
        const unsigned lane = __builtin_ctz(m);
        if (base + lane >= launch.threads)
            return message + " while lane " + std::to_string(lane) + " of its warp does not exist (blockDim " +
                   format_index(launch.block) + ")";
        const Fiber& f = launch.fibers[base + lane];
        if (f.wait == Wait::exited)
            return message + " while thread " + format_index(f.thread_idx) + " in its mask has exited";
        if (f.wait != Wait::warp_round || f.op != stuck->op || f.mask != stuck->mask)
            return message + " while thread " + format_index(f.thread_idx) + " waits at " + describe_call(f);
    }
    return message;
}

// ---- launching --------------------------------------------------------------

// cudaFuncAttributeMaxDynamicSharedMemorySize per kernel.
inline std::map<const void*, size_t>& dynamic_shared_limits() {
    static std::map<const void*, size_t> limits;
    return limits;
}

inline cudaError_t check_launch_config(const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes) {
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaErrorInvalidConfiguration;
    if (block.x > kMaxBlockDimXY || block.y > kMaxBlockDimXY || block.z > kMaxBlockDimZ ||
        threads > kMaxThreadsPerBlock)
        return cudaErrorInvalidConfiguration;
    if (grid.x > kMaxGridDimX || grid.y > kMaxGridDimYZ || grid.z > kMaxGridDimYZ) return cudaErrorInvalidConfiguration;
    size_t limit = kDefaultDynamicSharedBytes;
    auto it = dynamic_shared_limits().find(kernel);
    if (it != dynamic_shared_limits().end()) limit = std::max(limit, it->second);
    if (dynamic_shared_bytes > limit) return cudaErrorInvalidValue;
    return cudaSuccess;
}

inline void run_block(Launch& launch, uint3 block_idx) {
    launch.block_idx = detail::block_idx = block_idx;
    std::memset(launch.dynamic_shared, kSharedMemoryPoison, launch.dynamic_shared_bytes);
    const size_t stack_bytes = fiber_pool().stack_bytes();
    for (unsigned i = 0; i < launch.threads; i++) {
        Fiber& f = launch.fibers[i];
        f.wait = Wait::none;
        f.context.uc_stack.ss_sp = f.stack;
        f.context.uc_stack.ss_size = stack_bytes;
        f.context.uc_link = nullptr;
#if defined(__SANITIZE_ADDRESS__)
        ASAN_UNPOISON_MEMORY_REGION(f.stack, stack_bytes);  // frames of the block before, never returned from
#endif
        makecontext(&f.context, fiber_main, 0);
        launch.queue[i] = i;
    }
    launch.queue_head = 0, launch.queue_size = launch.threads;
    launch.live = launch.threads;
    launch.barrier_arrived = launch.barrier_true = 0;
    launch.barrier_mismatch = false;
    Fiber* first = launch.pop();
    detail::current = first;
    switch_context(&launch.scheduler, &first->context, first->stack, stack_bytes);
    // back here once no fiber of the block can run
    if (launch.error.empty() && launch.live > 0) launch.error = describe_deadlock(launch);
}

// Runs body(args) as every thread of every block. A bad configuration sets
// the last error (cudaGetLastError) like a failed launch on a GPU; a deadlock
// or misuse inside the kernel throws std::runtime_error.
inline void run_grid(const std::string& kernel, const void* kernel_key, dim3 grid, dim3 block,
                     size_t dynamic_shared_bytes, void (*body)(const void*), const void* args) {
    if (detail::busy.exchange(true))
        throw std::runtime_error("emu: launch of " + kernel +
                                 " while another launch runs (launches from kernels or from several host threads "
                                 "are not supported)");
    struct EndLaunch {
        ~EndLaunch() {
            detail::active = nullptr;
            detail::current = nullptr;
            detail::busy = false;
        }
    } end_launch;
    const cudaError_t status = check_launch_config(kernel_key, grid, block, dynamic_shared_bytes);
    if (status != cudaSuccess) {
        detail::record_error(status);
        return;
    }
    Launch launch;
    launch.kernel = kernel;
    launch.grid = grid, launch.block = block;
    launch.threads = block.x * block.y * block.z;
    launch.body = body, launch.args = args;
    launch.fibers = fiber_pool().reserve(launch.threads, fiber_stack_setting());
    for (unsigned i = 0; i < launch.threads; i++) {
        Fiber& f = launch.fibers[i];
        f.linear = i;
        f.thread_idx = uint3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
    }
    launch.queue.resize(launch.threads);
    const size_t shared_alloc = (std::max(dynamic_shared_bytes, (size_t)1) + kDynamicSharedAlignment - 1) /
                                kDynamicSharedAlignment * kDynamicSharedAlignment;
    std::unique_ptr<unsigned char, void (*)(void*)> shared(
        static_cast<unsigned char*>(std::aligned_alloc(kDynamicSharedAlignment, shared_alloc)), std::free);
    launch.dynamic_shared = shared.get();
    launch.dynamic_shared_bytes = dynamic_shared_bytes;

    detail::active = &launch;
    detail::block_dim = block, detail::grid_dim = grid;
    for (unsigned z = 0; z < grid.z && launch.error.empty(); z++)
        for (unsigned y = 0; y < grid.y && launch.error.empty(); y++)
            for (unsigned x = 0; x < grid.x && launch.error.empty(); x++) run_block(launch, uint3{x, y, z});
    if (!launch.error.empty()) throw std::runtime_error(launch.error);
}

// The emulated kernel<<<grid, block, dynamic_shared_bytes, stream>>>(args...):
// arguments are converted to the kernel's parameter types once, as a launch
// copies them; every thread calls the kernel with that one copy. launch_text
// is the launch's argument list as written, the kernel's name first.
template <typename... Params, typename... Args>
void run_kernel(const char* launch_text, void (*kernel)(Params...), dim3 grid, dim3 block,
                size_t dynamic_shared_bytes, cudaStream_t stream, Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "launch: wrong number of kernel arguments");
    (void)stream;  // everything runs synchronously
    struct Bound {
        void (*kernel)(Params...);
        std::tuple<std::decay_t<Params>...> params;
    };
    const Bound bound{kernel, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)};
    void (*body)(const void*) = [](const void* p) {
        const Bound& b = *static_cast<const Bound*>(p);
        std::apply(b.kernel, b.params);
    };
    run_grid(::knngpt::cuda::kernel_expression(launch_text), reinterpret_cast<const void*>(kernel), grid, block,
             dynamic_shared_bytes, body, &bound);
}

// The block's dynamic shared memory (KNNGPT_DYNAMIC_SHARED).
inline void* dynamic_shared_memory() { return detail::active->dynamic_shared; }

inline const uint3& thread_index() { return detail::current->thread_idx; }

}  // namespace knngpt::emu

// Raises a kernel's dynamic shared memory limit above the default 48 KiB, up
// to the 227 KiB an sm_90 allows; other attributes are accepted and ignored.
template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attribute, int value) {
    using namespace knngpt::emu;
    if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > kMaxDynamicSharedBytes) return detail::record_error(cudaErrorInvalidValue);
        dynamic_shared_limits()[reinterpret_cast<const void*>(kernel)] = (size_t)value;
    }
    return cudaSuccess;
}

// The built-in index variables. threadIdx differs per fiber, so it reads the
// current fiber; the others are the same for a whole block or launch. Host
// code must not name its own variables threadIdx.
#define threadIdx (::knngpt::emu::thread_index())
inline const uint3& blockIdx = knngpt::emu::detail::block_idx;
inline const dim3& blockDim = knngpt::emu::detail::block_dim;
inline const dim3& gridDim = knngpt::emu::detail::grid_dim;
