// kernels/emu/nccl.h — the part of NCCL a CUDA trainer calls (communicators,
// AllReduce, ReduceScatter, AllGather, Broadcast, groups, errors), for the
// emulator build: one process per rank, talking over MPI. Names, types, enum
// values and signatures are NCCL's (2.28), so the same trainer code compiles
// against either. Buffers must be emulated device memory: every buffer range
// must lie inside one cudaMalloc allocation, else ncclInvalidArgument, as a
// host pointer would fault on a GPU. Work is synchronous like the rest of the
// emulator: a collective has completed when it returns, any cudaStream_t is
// accepted.
// Design: results are deterministic. Every reduction gathers all ranks'
// contributions (MPI_Alltoall) and combines them in rank order 0..N-1 on the rank
// that owns that part of the result, which then sends it to the others, so every
// rank gets the same bits whatever MPI's own reduction order.
// Limits: reductions on the 1-, 4- and 8-byte integers, fp32, fp64 and bf16
// only (fp16 and fp8 are moved, never reduced); no user reduction ops, no
// point-to-point, no non-blocking communicators (never ncclInProgress); an
// overlap of send and receive buffers other than NCCL's in-place forms is
// refused rather than left undefined.
#pragma once
#if !defined(KNNGPT_CUDA_EMU)
#error "kernels/emu/nccl.h is the emulator's NCCL; a native CUDA build includes <nccl.h>"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "kernels/emu/bf16.h"
#include "kernels/emu/runtime.h"

#if defined(KNNGPT_MPI)
// the C API only: MPI's C++ bindings are deprecated and warn under -Wextra
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "kernels/common/mpi_lifetime.h"
#endif

// ---- the API's types and constants ------------------------------------------

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

// One rank's end of a communicator.
struct ncclComm {
    int nranks = 1;
    int rank = 0;
    ncclResult_t async_error = ncclSuccess;
#if defined(KNNGPT_MPI)
    MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL when nranks == 1
#endif
};
typedef struct ncclComm* ncclComm_t;

namespace knngpt::emu::nccl_detail {

// ---- errors -------------------------------------------------------------------

// ncclGetLastError's text: the calling thread's last failure, never cleared
// by a success (as NCCL keeps its last warning).
inline std::string& last_error() {
    static thread_local std::string text;
    return text;
}

__attribute__((format(printf, 2, 3))) inline ncclResult_t fail(ncclResult_t result, const char* format, ...) {
    char text[1024];
    va_list args;
    va_start(args, format);
    std::vsnprintf(text, sizeof text, format, args);
    va_end(args);
    last_error() = text;
    return result;
}

// ---- data types ---------------------------------------------------------------

inline size_t type_size(ncclDataType_t type) {
    switch (type) {
        case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;  // not a data type
    }
}

inline const char* type_name(ncclDataType_t type) {
    switch (type) {
        case ncclInt8: return "ncclInt8";
        case ncclUint8: return "ncclUint8";
        case ncclInt32: return "ncclInt32";
        case ncclUint32: return "ncclUint32";
        case ncclInt64: return "ncclInt64";
        case ncclUint64: return "ncclUint64";
        case ncclFloat16: return "ncclFloat16";
        case ncclFloat32: return "ncclFloat32";
        case ncclFloat64: return "ncclFloat64";
        case ncclBfloat16: return "ncclBfloat16";
        case ncclFloat8e4m3: return "ncclFloat8e4m3";
        case ncclFloat8e5m2: return "ncclFloat8e5m2";
        default: return "?";
    }
}

inline bool reducible(ncclDataType_t type) {
    return type != ncclFloat16 && type != ncclFloat8e4m3 && type != ncclFloat8e5m2;
}

// ---- reductions, in rank order --------------------------------------------------
// ncclAvg is the rank-order sum divided by nranks (NCCL itself pre-multiplies floats
// by 1/nranks), and bf16 is reduced in fp32 and rounded once at the end (NCCL
// rounds at each step).

// How an element is combined: integers in their own type with wrap-around
// (through the unsigned type, as a GPU's adds wrap), floats in their own
// precision, bf16 in fp32 with one rounding at the end.
template <typename T, typename = void>
struct Element {
    using Acc = T;
    static Acc load(T x) { return x; }
    static T store(Acc a) { return a; }
    static Acc sum(Acc a, Acc b) { return a + b; }
    static Acc prod(Acc a, Acc b) { return a * b; }
    static Acc max(Acc a, Acc b) { return std::fmax(a, b); }
    static Acc min(Acc a, Acc b) { return std::fmin(a, b); }
    static Acc divide(Acc a, int n) { return a / (Acc)n; }
};

template <typename T>
struct Element<T, std::enable_if_t<std::is_integral_v<T>>> {
    using Acc = T;
    using U = std::make_unsigned_t<T>;
    static Acc load(T x) { return x; }
    static T store(Acc a) { return a; }
    static Acc sum(Acc a, Acc b) { return (T)(U)((U)a + (U)b); }
    static Acc prod(Acc a, Acc b) { return (T)(U)((U)a * (U)b); }
    static Acc max(Acc a, Acc b) { return std::max(a, b); }
    static Acc min(Acc a, Acc b) { return std::min(a, b); }
    // the wrapped sum divided by n, truncating (NCCL's integer average)
    static Acc divide(Acc a, int n) {
        if constexpr (std::is_signed_v<T>) return (T)((int64_t)a / (int64_t)n);
        else return (T)((uint64_t)a / (uint64_t)n);
    }
};

template <>
struct Element<__nv_bfloat16> {
    using Acc = float;
    static Acc load(__nv_bfloat16 x) { return (float)x; }
    static __nv_bfloat16 store(Acc a) { return __nv_bfloat16(a); }
    static Acc sum(Acc a, Acc b) { return a + b; }
    static Acc prod(Acc a, Acc b) { return a * b; }
    static Acc max(Acc a, Acc b) { return std::fmax(a, b); }
    static Acc min(Acc a, Acc b) { return std::fmin(a, b); }
    static Acc divide(Acc a, int n) { return a / (float)n; }
};

// out[i] = the reduction over r = 0, 1, ..., n-1 (in that order) of element i
// of block r, the blocks `stride` elements apart in `blocks`.
template <typename T, typename Combine>
void reduce_typed(const char* blocks, size_t stride, int n, size_t count, bool average, char* out, Combine combine) {
    using E = Element<T>;
    using Acc = typename E::Acc;
    for (size_t i = 0; i < count; i++) {
        T x;
        std::memcpy(&x, blocks + i * sizeof(T), sizeof(T));
        Acc acc = E::load(x);
        for (int r = 1; r < n; r++) {
            std::memcpy(&x, blocks + (r * stride + i) * sizeof(T), sizeof(T));
            acc = combine(acc, E::load(x));
        }
        if (average) acc = E::divide(acc, n);
        const T y = E::store(acc);
        std::memcpy(out + i * sizeof(T), &y, sizeof(T));
    }
}

template <typename T>
void reduce_op(const char* blocks, size_t stride, int n, size_t count, ncclRedOp_t op, char* out) {
    using E = Element<T>;
    using Acc = typename E::Acc;
    switch (op) {
        case ncclSum: case ncclAvg:
            return reduce_typed<T>(blocks, stride, n, count, op == ncclAvg, out, [](Acc a, Acc b) { return E::sum(a, b); });
        case ncclProd: return reduce_typed<T>(blocks, stride, n, count, false, out, [](Acc a, Acc b) { return E::prod(a, b); });
        case ncclMax: return reduce_typed<T>(blocks, stride, n, count, false, out, [](Acc a, Acc b) { return E::max(a, b); });
        case ncclMin: return reduce_typed<T>(blocks, stride, n, count, false, out, [](Acc a, Acc b) { return E::min(a, b); });
        default: return;  // refused before (check_op)
    }
}

inline void reduce_blocks(const char* blocks, size_t stride, int n, size_t count, ncclDataType_t type, ncclRedOp_t op,
                          char* out) {
    switch (type) {
        case ncclInt8: return reduce_op<int8_t>(blocks, stride, n, count, op, out);
        case ncclUint8: return reduce_op<uint8_t>(blocks, stride, n, count, op, out);
        case ncclInt32: return reduce_op<int32_t>(blocks, stride, n, count, op, out);
        case ncclUint32: return reduce_op<uint32_t>(blocks, stride, n, count, op, out);
        case ncclInt64: return reduce_op<int64_t>(blocks, stride, n, count, op, out);
        case ncclUint64: return reduce_op<uint64_t>(blocks, stride, n, count, op, out);
        case ncclFloat32: return reduce_op<float>(blocks, stride, n, count, op, out);
        case ncclFloat64: return reduce_op<double>(blocks, stride, n, count, op, out);
        case ncclBfloat16: return reduce_op<__nv_bfloat16>(blocks, stride, n, count, op, out);
        default: return;  // refused before (check_type)
    }
}

// ---- argument checks (made when a call is made, inside a group too) ------------------

inline ncclResult_t check_comm(const char* call, ncclComm_t comm) {
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", call);
    return ncclSuccess;
}

inline ncclResult_t check_type(const char* call, ncclDataType_t type, bool reduction) {
    if (type_size(type) == 0) return fail(ncclInvalidArgument, "%s: unknown datatype %d", call, (int)type);
    if (reduction && !reducible(type))
        return fail(ncclInvalidArgument,
                    "%s: reductions on %s are not emulated (only the 1-, 4- and 8-byte integers, fp32, fp64 and bf16; "
                    "AllGather and Broadcast move any type)",
                    call, type_name(type));
    return ncclSuccess;
}

inline ncclResult_t check_op(const char* call, ncclRedOp_t op) {
    if ((int)op < 0 || (int)op >= (int)ncclNumOps)
        return fail(ncclInvalidArgument, "%s: unknown reduction op %d (the emulator has no user-defined ops)", call,
                    (int)op);
    return ncclSuccess;
}

// count * factor elements of `size` bytes, or false on overflow.
inline bool byte_count(size_t count, size_t factor, size_t size, size_t* bytes) {
    if (factor && count > SIZE_MAX / factor) return false;
    if (size && count * factor > SIZE_MAX / size) return false;
    *bytes = count * factor * size;
    return true;
}

// The buffer must lie in one cudaMalloc allocation, as on a GPU (a host
// pointer there is an illegal address).
inline ncclResult_t check_buffer(const char* call, const char* name, const void* p, size_t bytes) {
    if (bytes == 0) return ncclSuccess;
    if (!p) return fail(ncclInvalidArgument, "%s: %s is NULL", call, name);
    if (!detail::is_device_range(p, bytes))
        return fail(ncclInvalidArgument,
                    "%s: %s %p (%zu bytes) is not inside one cudaMalloc allocation (a host pointer, or a range "
                    "running past its allocation)",
                    call, name, p, bytes);
    return ncclSuccess;
}

// send and receive ranges may coincide only where NCCL's in-place form says
// (send == recv + recv_offset), and not overlap otherwise.
inline ncclResult_t check_overlap(const char* call, const void* send, size_t send_bytes, const void* recv,
                                  size_t recv_bytes, ptrdiff_t in_place_offset) {
    const char *s = (const char*)send, *r = (const char*)recv;
    if (s == r + in_place_offset) return ncclSuccess;
    if (s < r + recv_bytes && r < s + send_bytes)
        return fail(ncclInvalidArgument,
                    "%s: sendbuff and recvbuff overlap, but not in the in-place form (sendbuff == recvbuff + %td bytes)",
                    call, in_place_offset);
    return ncclSuccess;
}

// ---- groups ---------------------------------------------------------------------------
// Calls between ncclGroupStart and ncclGroupEnd are checked at once, queued, and
// run in call order at the outermost ncclGroupEnd.

struct Pending {
    ncclComm_t comm;
    std::function<ncclResult_t()> run;
};

// ncclGroupStart/End nest per thread, as in NCCL.
struct Group {
    int depth = 0;
    ncclResult_t error = ncclSuccess;  // the first failed call of the group
    std::vector<Pending> pending;
};
inline Group& group() {
    static thread_local Group g;
    return g;
}

// A checked call: run now, or queued until the outermost ncclGroupEnd.
inline ncclResult_t submit(ncclComm_t comm, std::function<ncclResult_t()> run) {
    Group& g = group();
    if (g.depth == 0) return run();
    g.pending.push_back({comm, std::move(run)});
    return ncclSuccess;
}

// A failed check inside a group fails the whole group, as in NCCL.
inline ncclResult_t refuse(ncclResult_t result) {
    Group& g = group();
    if (g.depth > 0 && g.error == ncclSuccess) g.error = result;
    return result;
}

// ---- the exchanges --------------------------------------------------------------------------

// The most bytes one exchange piece moves per rank (16 MiB); it bounds the
// scratch memory of a collective (about three pieces) and keeps MPI's int
// counts small. The tests shrink it, so that small buffers take many pieces.
inline size_t& piece_bytes() {
    static size_t bytes = size_t(16) << 20;
    return bytes;
}

struct Scratch {
    std::unique_ptr<char[]> bytes;
    explicit Scratch(size_t n) : bytes(new char[n ? n : 1]) {}
    char* get() { return bytes.get(); }
};

#if defined(KNNGPT_MPI)
inline ncclResult_t mpi_failed(ncclComm_t comm, const char* call, const char* mpi_call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    comm->async_error = ncclSystemError;
    return fail(ncclSystemError, "%s: %s failed: %.*s", call, mpi_call, length, text);
}
#define KNNGPT_NCCL_MPI(call_name, mpi_call)                                              \
    do {                                                                                  \
        const int rc_ = (mpi_call);                                                       \
        if (rc_ != MPI_SUCCESS) return mpi_failed(comm, call_name, #mpi_call, rc_);       \
    } while (0)
#endif

// Elements per piece so that `blocks` blocks of them fit in piece_bytes()
// (at least one element).
inline size_t piece_elements(size_t size, int blocks) {
    const size_t bytes = std::min(piece_bytes(), size_t(1) << 30);
    return std::max<size_t>(1, bytes / size / (size_t)blocks);
}

// AllReduce over several ranks, piece by piece: each piece is cut into nranks
// chunks; rank j receives everyone's chunk j (MPI_Alltoall), reduces it in
// rank order, and every rank gathers the reduced chunks (MPI_Allgather).
inline ncclResult_t run_allreduce(const char* send, char* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                  ncclComm_t comm) {
    const size_t size = type_size(type);
    const int n = comm->nranks;
    if (n == 1) {
        if (send != recv) std::memmove(recv, send, count * size);
        return ncclSuccess;
    }
#if defined(KNNGPT_MPI)
    const size_t piece = piece_elements(size, 1);
    const size_t chunk_max = (std::min(count, piece) + n - 1) / n;
    Scratch packed((size_t)n * chunk_max * size), received((size_t)n * chunk_max * size), reduced(chunk_max * size),
        gathered((size_t)n * chunk_max * size);
    for (size_t offset = 0; offset < count; offset += piece) {
        const size_t length = std::min(piece, count - offset);
        const size_t chunk = (length + n - 1) / n;
        auto chunk_length = [&](int j) {
            const size_t start = (size_t)j * chunk;
            return start >= length ? size_t(0) : std::min(chunk, length - start);
        };
        for (int j = 0; j < n; j++)
            std::memcpy(packed.get() + j * chunk * size, send + (offset + j * chunk) * size, chunk_length(j) * size);
        const int bytes = (int)(chunk * size);
        KNNGPT_NCCL_MPI("ncclAllReduce", MPI_Alltoall(packed.get(), bytes, MPI_BYTE, received.get(), bytes, MPI_BYTE, comm->mpi));
        reduce_blocks(received.get(), chunk, n, chunk_length(comm->rank), type, op, reduced.get());
        KNNGPT_NCCL_MPI("ncclAllReduce", MPI_Allgather(reduced.get(), bytes, MPI_BYTE, gathered.get(), bytes, MPI_BYTE, comm->mpi));
        for (int j = 0; j < n; j++)
            std::memcpy(recv + (offset + j * chunk) * size, gathered.get() + j * chunk * size, chunk_length(j) * size);
    }
    return ncclSuccess;
#else
    (void)op;
    return fail(ncclInternalError, "ncclAllReduce: a communicator of %d ranks in a build without MPI", n);
#endif
}

// ReduceScatter: rank j receives everyone's block j (slice by slice) and
// reduces it in rank order straight into its recvbuff.
inline ncclResult_t run_reduce_scatter(const char* send, char* recv, size_t recvcount, ncclDataType_t type,
                                       ncclRedOp_t op, ncclComm_t comm) {
    const size_t size = type_size(type);
    const int n = comm->nranks;
    if (n == 1) {
        if (send != recv) std::memmove(recv, send, recvcount * size);
        return ncclSuccess;
    }
#if defined(KNNGPT_MPI)
    const size_t piece = std::min(recvcount, piece_elements(size, n));
    Scratch packed((size_t)n * piece * size), received((size_t)n * piece * size);
    for (size_t offset = 0; offset < recvcount; offset += piece) {
        const size_t length = std::min(piece, recvcount - offset);
        for (int j = 0; j < n; j++)
            std::memcpy(packed.get() + j * length * size, send + (j * recvcount + offset) * size, length * size);
        const int bytes = (int)(length * size);
        KNNGPT_NCCL_MPI("ncclReduceScatter", MPI_Alltoall(packed.get(), bytes, MPI_BYTE, received.get(), bytes, MPI_BYTE, comm->mpi));
        reduce_blocks(received.get(), length, n, length, type, op, recv + offset * size);
    }
    return ncclSuccess;
#else
    (void)op;
    return fail(ncclInternalError, "ncclReduceScatter: a communicator of %d ranks in a build without MPI", n);
#endif
}

inline ncclResult_t run_allgather(const char* send, char* recv, size_t sendcount, ncclDataType_t type,
                                  ncclComm_t comm) {
    const size_t size = type_size(type);
    const int n = comm->nranks;
    if (n == 1) {
        if (send != recv) std::memmove(recv, send, sendcount * size);
        return ncclSuccess;
    }
#if defined(KNNGPT_MPI)
    const size_t piece = std::min(sendcount, piece_elements(size, n));
    Scratch gathered((size_t)n * piece * size);
    for (size_t offset = 0; offset < sendcount; offset += piece) {
        const size_t length = std::min(piece, sendcount - offset);
        const int bytes = (int)(length * size);
        KNNGPT_NCCL_MPI("ncclAllGather", MPI_Allgather(send + offset * size, bytes, MPI_BYTE, gathered.get(), bytes, MPI_BYTE, comm->mpi));
        // in place, block `rank` is the piece just sent: memmove copies it onto itself
        for (int j = 0; j < n; j++)
            std::memmove(recv + (j * sendcount + offset) * size, gathered.get() + j * length * size, length * size);
    }
    return ncclSuccess;
#else
    return fail(ncclInternalError, "ncclAllGather: a communicator of %d ranks in a build without MPI", n);
#endif
}

inline ncclResult_t run_broadcast(const char* send, char* recv, size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm) {
    const size_t size = type_size(type);
    if (comm->rank == root && send != recv) std::memmove(recv, send, count * size);
    if (comm->nranks == 1) return ncclSuccess;
#if defined(KNNGPT_MPI)
    const size_t piece = piece_elements(size, 1);
    for (size_t offset = 0; offset < count; offset += piece) {
        const int bytes = (int)(std::min(piece, count - offset) * size);
        KNNGPT_NCCL_MPI("ncclBroadcast", MPI_Bcast(recv + offset * size, bytes, MPI_BYTE, root, comm->mpi));
    }
    return ncclSuccess;
#else
    return fail(ncclInternalError, "ncclBroadcast: a communicator of %d ranks in a build without MPI", comm->nranks);
#endif
}
#if defined(KNNGPT_MPI)
#undef KNNGPT_NCCL_MPI
#endif

// A collective's run, with scratch memory the host may not have.
template <typename Run>
std::function<ncclResult_t()> guarded(const char* call, Run run) {
    return [call, run]() -> ncclResult_t {
        try {
            return run();
        } catch (const std::bad_alloc&) {
            return fail(ncclSystemError, "%s: out of host memory for the exchange's scratch buffers", call);
        }
    };
}

// ---- communicators ----------------------------------------------------------------------------
// A communicator of one rank needs no MPI (every collective is a copy); one of more
// needs a build with MPI (KNNGPT_MPI) and processes started by mpirun, and its
// ncclCommInitRank is collective over MPI_COMM_WORLD (an MPI_Comm_split keyed by the
// unique id), so every process of the job must call it, in the same order, even
// those that join another communicator.

// The MPI_Comm_split color of an id: FNV-1a over its bytes, made non-negative.
inline int id_color(const ncclUniqueId& id) {
    uint32_t h = 2166136261u;
    for (char c : id.internal) h = (h ^ (uint8_t)c) * 16777619u;
    return (int)(h & 0x7FFFFFFFu);
}

#if defined(KNNGPT_MPI)
// MPI, initialised here if nobody has (and then finalized at exit).
inline ncclResult_t ensure_mpi() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) return fail(ncclInvalidUsage, "ncclCommInitRank: MPI has already been finalized");
    if (!initialized) {
        int provided = 0;
        if (knngpt::mpi_init_once(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS)
            return fail(ncclSystemError, "ncclCommInitRank: MPI_Init failed");
        std::atexit(knngpt::mpi_finalize_once);
    }
    return ncclSuccess;
}

// What each member says when it joins: compared by all, so that every member
// of a communicator gets the same answer.
struct JoinRecord {
    int nranks, rank;
    ncclUniqueId id;
};

inline ncclResult_t init_mpi_comm(ncclComm* comm, int nranks, const ncclUniqueId& id, int rank) {
    const char* call = "ncclCommInitRank";
    if (ncclResult_t r = ensure_mpi(); r != ncclSuccess) return r;
    MPI_Comm split = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, id_color(id), rank, &split) != MPI_SUCCESS)
        return fail(ncclSystemError, "%s: MPI_Comm_split of MPI_COMM_WORLD failed", call);
    MPI_Comm_set_errhandler(split, MPI_ERRORS_RETURN);
    int size = 0, my_rank = 0;
    MPI_Comm_size(split, &size);
    MPI_Comm_rank(split, &my_rank);
    std::vector<JoinRecord> joined(size);
    const JoinRecord mine{nranks, rank, id};
    if (MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, joined.data(), (int)sizeof mine, MPI_BYTE, split) != MPI_SUCCESS) {
        MPI_Comm_free(&split);
        return fail(ncclSystemError, "%s: MPI_Allgather of the members' ranks failed", call);
    }
    // every member checks the same records, so all of them agree on the verdict
    ncclResult_t verdict = ncclSuccess;
    for (int i = 0; i < size && verdict == ncclSuccess; i++) {
        const JoinRecord& j = joined[i];
        if (std::memcmp(&j.id, &id, sizeof id) != 0)
            verdict = fail(ncclInternalError, "%s: two unique ids fell into one MPI_Comm_split color; make a new id",
                           call);
        else if (j.nranks != size)
            verdict = fail(ncclInvalidUsage,
                           "%s: %d processes of the MPI job joined this unique id, but a member said nranks=%d "
                           "(start every rank with mpirun -np %d, and every process must call ncclCommInitRank)",
                           call, size, j.nranks, j.nranks);
        else if (j.rank != i)
            verdict = fail(ncclInvalidUsage, "%s: the ranks given by the %d members are not 0..%d, each once", call,
                           size, size - 1);
    }
    if (verdict != ncclSuccess) {
        MPI_Comm_free(&split);
        return verdict;
    }
    comm->nranks = size;
    comm->rank = my_rank;
    comm->mpi = split;
    return ncclSuccess;
}
#endif

}  // namespace knngpt::emu::nccl_detail

// ---- the API ------------------------------------------------------------------------------------

inline const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error (ncclGetLastError says more)";
        case ncclSystemError: return "unhandled system error (ncclGetLastError says more)";
        case ncclInternalError: return "internal error (ncclGetLastError says more)";
        case ncclInvalidArgument: return "invalid argument (ncclGetLastError says which)";
        case ncclInvalidUsage: return "invalid usage (ncclGetLastError says how)";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

// The calling thread's last failure message ("" if none); comm is unused, as in NCCL.
inline const char* ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return knngpt::emu::nccl_detail::last_error().c_str();
}

inline ncclResult_t ncclGetVersion(int* version) {
    if (!version) return knngpt::emu::nccl_detail::fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

// 128 random bytes from /dev/urandom (or, failing that, mixed from the time,
// the pid and a counter); the caller hands it to every rank.
inline ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    if (!uniqueId) return knngpt::emu::nccl_detail::fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    bool filled = false;
    if (FILE* f = std::fopen("/dev/urandom", "rb")) {
        filled = std::fread(uniqueId->internal, 1, sizeof uniqueId->internal, f) == sizeof uniqueId->internal;
        std::fclose(f);
    }
    if (!filled) {
        static uint64_t counter = 0;
        uint64_t state = (uint64_t)std::time(nullptr) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^ ++counter ^
                         (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
        for (char& c : uniqueId->internal) {  // splitmix64
            state += 0x9E3779B97F4A7C15ull;
            uint64_t z = state;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            c = (char)(z ^ (z >> 31));
        }
    }
    return ncclSuccess;
}

// nranks == 1: a local communicator, no MPI. nranks > 1: collective over
// MPI_COMM_WORLD (see the opening comment). Runs at once, inside a group too.
inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    using namespace knngpt::emu::nccl_detail;
    const char* call = "ncclCommInitRank";
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", call);
    *comm = nullptr;
    if (nranks < 1) return fail(ncclInvalidArgument, "%s: nranks=%d must be at least 1", call, nranks);
    if (rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "%s: rank=%d is not in [0, nranks=%d)", call, rank, nranks);
    std::unique_ptr<ncclComm> made(new ncclComm);
    if (nranks > 1) {
#if defined(KNNGPT_MPI)
        if (ncclResult_t r = init_mpi_comm(made.get(), nranks, commId, rank); r != ncclSuccess) return r;
#else
        (void)commId;
        return fail(ncclInvalidUsage,
                    "%s: nranks=%d: the emulated NCCL needs an MPI build (KNNGPT_MPI, made where mpicxx exists) and "
                    "the ranks started by mpirun",
                    call, nranks);
#endif
    }
    *comm = made.release();
    return ncclSuccess;
}

namespace knngpt::emu::nccl_detail {
inline ncclResult_t release_comm(const char* call, ncclComm_t comm, bool free_mpi) {
    for (const Pending& p : group().pending)
        if (p.comm == comm)
            return fail(ncclInvalidUsage, "%s: the communicator has calls queued in an open group", call);
#if defined(KNNGPT_MPI)
    if (free_mpi && comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
#else
    (void)free_mpi;
#endif
    delete comm;
    return ncclSuccess;
}
}  // namespace knngpt::emu::nccl_detail

// NULL is accepted and does nothing, as in NCCL.
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    return knngpt::emu::nccl_detail::release_comm("ncclCommDestroy", comm, true);
}

// Frees this rank's end without any collective step (MPI_Comm_free is
// collective, so the MPI communicator is dropped, not freed); never calls
// MPI_Abort: stopping the job is the caller's decision.
inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    return knngpt::emu::nccl_detail::release_comm("ncclCommAbort", comm, false);
}

inline ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    using namespace knngpt::emu::nccl_detail;
    if (ncclResult_t r = check_comm("ncclCommCount", comm); r != ncclSuccess) return r;
    if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

inline ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    using namespace knngpt::emu::nccl_detail;
    if (ncclResult_t r = check_comm("ncclCommUserRank", comm); r != ncclSuccess) return r;
    if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

// The emulator has one device, 0, in every process.
inline ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    using namespace knngpt::emu::nccl_detail;
    if (ncclResult_t r = check_comm("ncclCommCuDevice", comm); r != ncclSuccess) return r;
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = 0;
    return ncclSuccess;
}

// ncclSystemError once an MPI exchange of this communicator has failed.
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    using namespace knngpt::emu::nccl_detail;
    if (ncclResult_t r = check_comm("ncclCommGetAsyncError", comm); r != ncclSuccess) return r;
    if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    *asyncError = comm->async_error;
    return ncclSuccess;
}

inline ncclResult_t ncclGroupStart() {
    knngpt::emu::nccl_detail::group().depth++;
    return ncclSuccess;
}

// The outermost end runs the queued calls in order and returns the first
// failure; a group in which a call was refused runs nothing and returns that
// call's error.
inline ncclResult_t ncclGroupEnd() {
    using namespace knngpt::emu::nccl_detail;
    Group& g = group();
    if (g.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart to end");
    if (--g.depth > 0) return ncclSuccess;
    std::vector<Pending> pending = std::move(g.pending);
    g.pending.clear();
    const ncclResult_t refused = g.error;
    g.error = ncclSuccess;
    if (refused != ncclSuccess) return refused;
    for (Pending& p : pending)
        if (ncclResult_t r = p.run(); r != ncclSuccess) return r;
    return ncclSuccess;
}

inline ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    using namespace knngpt::emu::nccl_detail;
    (void)stream;
    const char* call = "ncclAllReduce";
    ncclResult_t r = check_comm(call, comm);
    if (r == ncclSuccess) r = check_type(call, datatype, true);
    if (r == ncclSuccess) r = check_op(call, op);
    size_t bytes = 0;
    if (r == ncclSuccess && !byte_count(count, 1, type_size(datatype), &bytes))
        r = fail(ncclInvalidArgument, "%s: count=%zu overflows", call, count);
    if (r == ncclSuccess) r = check_buffer(call, "sendbuff", sendbuff, bytes);
    if (r == ncclSuccess) r = check_buffer(call, "recvbuff", recvbuff, bytes);
    if (r == ncclSuccess && bytes) r = check_overlap(call, sendbuff, bytes, recvbuff, bytes, 0);
    if (r != ncclSuccess) return refuse(r);
    if (count == 0) return ncclSuccess;
    const char* send = (const char*)sendbuff;
    char* recv = (char*)recvbuff;
    return submit(comm, guarded(call, [=] { return run_allreduce(send, recv, count, datatype, op, comm); }));
}

inline ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    using namespace knngpt::emu::nccl_detail;
    (void)stream;
    const char* call = "ncclReduceScatter";
    ncclResult_t r = check_comm(call, comm);
    if (r == ncclSuccess) r = check_type(call, datatype, true);
    if (r == ncclSuccess) r = check_op(call, op);
    size_t send_bytes = 0, recv_bytes = 0;
    if (r == ncclSuccess && !byte_count(recvcount, (size_t)comm->nranks, type_size(datatype), &send_bytes))
        r = fail(ncclInvalidArgument, "%s: recvcount=%zu times nranks=%d overflows", call, recvcount, comm->nranks);
    if (r == ncclSuccess) recv_bytes = recvcount * type_size(datatype);
    if (r == ncclSuccess) r = check_buffer(call, "sendbuff (nranks * recvcount elements)", sendbuff, send_bytes);
    if (r == ncclSuccess) r = check_buffer(call, "recvbuff", recvbuff, recv_bytes);
    // in place when recvbuff == sendbuff + rank * recvcount, i.e. sendbuff == recvbuff - rank * recvcount
    if (r == ncclSuccess && recv_bytes)
        r = check_overlap(call, sendbuff, send_bytes, recvbuff, recv_bytes, -(ptrdiff_t)(comm->rank * recv_bytes));
    if (r != ncclSuccess) return refuse(r);
    if (recvcount == 0) return ncclSuccess;
    const char* send = (const char*)sendbuff;
    char* recv = (char*)recvbuff;
    return submit(comm, guarded(call, [=] { return run_reduce_scatter(send, recv, recvcount, datatype, op, comm); }));
}

inline ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream) {
    using namespace knngpt::emu::nccl_detail;
    (void)stream;
    const char* call = "ncclAllGather";
    ncclResult_t r = check_comm(call, comm);
    if (r == ncclSuccess) r = check_type(call, datatype, false);
    size_t send_bytes = 0, recv_bytes = 0;
    if (r == ncclSuccess && !byte_count(sendcount, (size_t)comm->nranks, type_size(datatype), &recv_bytes))
        r = fail(ncclInvalidArgument, "%s: sendcount=%zu times nranks=%d overflows", call, sendcount, comm->nranks);
    if (r == ncclSuccess) send_bytes = sendcount * type_size(datatype);
    if (r == ncclSuccess) r = check_buffer(call, "sendbuff", sendbuff, send_bytes);
    if (r == ncclSuccess) r = check_buffer(call, "recvbuff (nranks * sendcount elements)", recvbuff, recv_bytes);
    if (r == ncclSuccess && send_bytes)
        r = check_overlap(call, sendbuff, send_bytes, recvbuff, recv_bytes, (ptrdiff_t)(comm->rank * send_bytes));
    if (r != ncclSuccess) return refuse(r);
    if (sendcount == 0) return ncclSuccess;
    const char* send = (const char*)sendbuff;
    char* recv = (char*)recvbuff;
    return submit(comm, guarded(call, [=] { return run_allgather(send, recv, sendcount, datatype, comm); }));
}

// sendbuff is read on the root only (other ranks may pass anything).
inline ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
    using namespace knngpt::emu::nccl_detail;
    (void)stream;
    const char* call = "ncclBroadcast";
    ncclResult_t r = check_comm(call, comm);
    if (r == ncclSuccess) r = check_type(call, datatype, false);
    if (r == ncclSuccess && (root < 0 || root >= comm->nranks))
        r = fail(ncclInvalidArgument, "%s: root=%d is not in [0, nranks=%d)", call, root, comm->nranks);
    size_t bytes = 0;
    if (r == ncclSuccess && !byte_count(count, 1, type_size(datatype), &bytes))
        r = fail(ncclInvalidArgument, "%s: count=%zu overflows", call, count);
    const bool is_root = r == ncclSuccess && comm->rank == root;
    if (r == ncclSuccess && is_root) r = check_buffer(call, "sendbuff", sendbuff, bytes);
    if (r == ncclSuccess) r = check_buffer(call, "recvbuff", recvbuff, bytes);
    if (r == ncclSuccess && is_root && bytes) r = check_overlap(call, sendbuff, bytes, recvbuff, bytes, 0);
    if (r != ncclSuccess) return refuse(r);
    if (count == 0) return ncclSuccess;
    const char* send = (const char*)sendbuff;
    char* recv = (char*)recvbuff;
    return submit(comm, guarded(call, [=] { return run_broadcast(send, recv, count, datatype, root, comm); }));
}
