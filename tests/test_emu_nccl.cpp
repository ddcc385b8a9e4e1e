// tests/test_emu_nccl.cpp — the emulated NCCL (kernels/emu/nccl.h): every
// collective with sum, avg, max (and prod, min) on fp32, bf16, int32 and the
// other reducible types, sizes 1, 7 and 1000003 (divisible by nothing small),
// in place and out of place, against a reference that reduces in rank order;
// Broadcast from root 1; calls inside one group; the results compared across
// ranks bit for bit; the argument checks (host pointers, nranks mismatch,
// unsupported types) and the error strings.
//
// Two kinds of test: those on a communicator of one rank (every collective a
// copy; no MPI needed), and the Ranks tests on a communicator of every
// process of the MPI job. In a build with MPI, this binary started on its own
// starts itself again under `mpirun -np 2` and returns mpirun's status, so
// `build/tests/test_emu_nccl` runs both kinds; rank 0 prints GoogleTest's
// report, the other ranks print only their failures (each test is counted
// once), and any rank's failure fails the run. Built without MPI, the Ranks
// tests are skipped, saying why. Inside a sequence of collectives the tests
// use EXPECT, never ASSERT, so that a rank that fails still makes every call
// its peers wait for.
#define KNNGPT_CUDA_EMU

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/common.cuh"
#include "kernels/emu/nccl.h"
#include "tests/device_array.h"

using knngpt_test::DeviceArray;

namespace {

// ---- the MPI job ----------------------------------------------------------------

struct World {
    int rank = 0, size = 1;
};
World& world() {
    static World w;
    return w;
}

// Why the Ranks tests cannot run here ("" when they can).
std::string multi_rank_skip_reason() {
#if !defined(KNNGPT_MPI)
    return "built without MPI (no mpicxx when it was built, so no KNNGPT_MPI): the emulated NCCL needs MPI and "
           "mpirun for a communicator of several ranks";
#else
    if (world().size < 2)
        return "one process: the multi-rank tests need mpirun -np 2 or more (build/tests/test_emu_nccl, started "
               "on its own, starts itself that way)";
    return "";
#endif
}

#define REQUIRE_RANKS()                                                                 \
    do {                                                                                \
        const std::string reason_ = multi_rank_skip_reason();                           \
        if (!reason_.empty()) GTEST_SKIP() << reason_;                                  \
    } while (0)

// ---- element types ------------------------------------------------------------------

template <typename T> constexpr ncclDataType_t nccl_type();
template <> constexpr ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <> constexpr ncclDataType_t nccl_type<double>() { return ncclFloat64; }
template <> constexpr ncclDataType_t nccl_type<__nv_bfloat16>() { return ncclBfloat16; }
template <> constexpr ncclDataType_t nccl_type<int8_t>() { return ncclInt8; }
template <> constexpr ncclDataType_t nccl_type<uint8_t>() { return ncclUint8; }
template <> constexpr ncclDataType_t nccl_type<int32_t>() { return ncclInt32; }
template <> constexpr ncclDataType_t nccl_type<uint32_t>() { return ncclUint32; }
template <> constexpr ncclDataType_t nccl_type<int64_t>() { return ncclInt64; }
template <> constexpr ncclDataType_t nccl_type<uint64_t>() { return ncclUint64; }

const char* op_name(ncclRedOp_t op) {
    switch (op) {
        case ncclSum: return "sum";
        case ncclProd: return "prod";
        case ncclMax: return "max";
        case ncclMin: return "min";
        case ncclAvg: return "avg";
        default: return "?";
    }
}

uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// A value of every sign and of magnitudes 2^-10..2^10 (floats), or of the
// whole range (integers, so sums wrap).
template <typename T>
T make_value(uint64_t h) {
    if constexpr (std::is_integral_v<T>) {
        return (T)h;
    } else {
        const double u = (double)(h >> 11) * 0x1p-53 * 2 - 1;
        const double v = std::ldexp(u, (int)(mix(h) % 21) - 10);
        if constexpr (std::is_same_v<T, double>) return v;
        else return T((float)v);
    }
}

// Rank `rank`'s input of a call: a function of (rank, index, salt) only, so
// every rank can compute every other rank's.
template <typename T>
std::vector<T> rank_input(int rank, size_t count, uint64_t salt) {
    std::vector<T> v(count);
    const uint64_t base = mix(salt * 0x100000001B3ull + (uint64_t)rank * 0x9E3779B97F4A7C15ull);
    for (size_t i = 0; i < count; i++) v[i] = make_value<T>(mix(base + i));
    return v;
}

// Every rank's input of a call, rank 0 first: what the reference reduces.
template <typename T>
std::vector<std::vector<T>> all_rank_inputs(int nranks, size_t count, uint64_t salt) {
    std::vector<std::vector<T>> inputs;
    for (int r = 0; r < nranks; r++) inputs.push_back(rank_input<T>(r, count, salt));
    return inputs;
}

// ---- the reference: rank order 0..n-1, integers wrapping, bf16 in fp32 rounded once ----

template <typename T>
T reference_reduce(const std::vector<std::vector<T>>& inputs, size_t i, ncclRedOp_t op) {
    const int n = (int)inputs.size();
    if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        if (op == ncclMax || op == ncclMin) {
            T m = inputs[0][i];
            for (int r = 1; r < n; r++) m = op == ncclMax ? std::max(m, inputs[r][i]) : std::min(m, inputs[r][i]);
            return m;
        }
        U acc = (U)inputs[0][i];
        for (int r = 1; r < n; r++) acc = op == ncclProd ? (U)(acc * (U)inputs[r][i]) : (U)(acc + (U)inputs[r][i]);
        const T wrapped = (T)acc;
        if (op != ncclAvg) return wrapped;
        if constexpr (std::is_signed_v<T>) return (T)((int64_t)wrapped / n);
        else return (T)((uint64_t)wrapped / (uint64_t)n);
    } else {
        using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
        Acc acc = (Acc)inputs[0][i];
        for (int r = 1; r < n; r++) {
            const Acc x = (Acc)inputs[r][i];
            switch (op) {
                case ncclProd: acc = acc * x; break;
                case ncclMax: acc = std::fmax(acc, x); break;
                case ncclMin: acc = std::fmin(acc, x); break;
                default: acc = acc + x; break;
            }
        }
        if (op == ncclAvg) acc = acc / (Acc)n;
        return T(acc);
    }
}

// ---- comparisons ----------------------------------------------------------------------------

template <typename T>
void expect_bits_equal(const std::vector<T>& got, const std::vector<T>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++)
        if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
            ADD_FAILURE() << "element " << i << " of " << got.size() << " differs from the rank-order reference: "
                          << (double)got[i] << " vs " << (double)want[i];
            return;
        }
}

// Every rank of the world holds the same bytes (v exchanged and compared).
// Collective over MPI_COMM_WORLD; a no-op in a world of one.
template <typename T>
void expect_same_on_every_rank(const std::vector<T>& v) {
#if defined(KNNGPT_MPI)
    if (world().size < 2) return;
    const size_t bytes = v.size() * sizeof(T);
    ASSERT_LE(bytes, (size_t)INT_MAX);
    std::vector<char> all(bytes * world().size);
    MPI_Allgather(v.data(), (int)bytes, MPI_BYTE, all.data(), (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    for (int r = 1; r < world().size; r++)
        EXPECT_EQ(std::memcmp(all.data(), all.data() + r * bytes, bytes), 0)
            << "rank " << r << "'s result differs from rank 0's";
#else
    (void)v;
#endif
}

// ---- communicators --------------------------------------------------------------------------

struct Comm {
    ncclComm_t comm = nullptr;
    int nranks = 0, rank = 0;
    explicit Comm(ncclComm_t c) : comm(c) {
        if (!comm) return;
        EXPECT_EQ(ncclCommCount(comm, &nranks), ncclSuccess);
        EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
    }
    Comm(const Comm&) = delete;
    Comm& operator=(const Comm&) = delete;
    ~Comm() { EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess); }
    bool spans_world() const { return nranks > 1; }
};

// A communicator of this process alone.
ncclComm_t local_comm() {
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
    return comm;
}

// The unique id made by rank 0 and sent to every process, as a trainer does.
ncclUniqueId shared_id() {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
#if defined(KNNGPT_MPI)
    if (world().rank == 0) {
        EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    }
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
    return id;
}

// A communicator of every process of the job, rank = world rank.
ncclComm_t world_comm() {
    const ncclUniqueId id = shared_id();
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, world().size, id, world().rank), ncclSuccess) << ncclGetLastError(nullptr);
    return comm;
}

// ---- one call of each collective, checked ---------------------------------------------------------

constexpr size_t kCounts[] = {1, 7, 1000003};

std::string describe(const char* what, ncclDataType_t type, const char* op, size_t count, bool in_place) {
    return std::string(what) + " " + knngpt::emu::nccl_detail::type_name(type) + " " + op +
           " count=" + std::to_string(count) + (in_place ? " in place" : " out of place");
}

template <typename T>
void check_allreduce(const Comm& c, size_t count, ncclRedOp_t op, bool in_place, cudaStream_t stream) {
    SCOPED_TRACE(describe("AllReduce", nccl_type<T>(), op_name(op), count, in_place));
    const uint64_t salt = count * 16 + op;
    DeviceArray<T> send(rank_input<T>(c.rank, count, salt));
    DeviceArray<T> recv(in_place ? 0 : count);
    T* out = in_place ? send.ptr : recv.ptr;
    EXPECT_EQ(ncclAllReduce(send.ptr, out, count, nccl_type<T>(), op, c.comm, stream), ncclSuccess)
        << ncclGetLastError(nullptr);
    std::vector<T> got(count);
    CUDA_CHECK(cudaMemcpy(got.data(), out, count * sizeof(T), cudaMemcpyDeviceToHost));
    const std::vector<std::vector<T>> inputs = all_rank_inputs<T>(c.nranks, count, salt);
    std::vector<T> want(count);
    for (size_t i = 0; i < count; i++) want[i] = reference_reduce(inputs, i, op);
    expect_bits_equal(got, want);
    if (c.spans_world()) expect_same_on_every_rank(got);
}

template <typename T>
void check_reduce_scatter(const Comm& c, size_t recvcount, ncclRedOp_t op, bool in_place, cudaStream_t stream) {
    SCOPED_TRACE(describe("ReduceScatter", nccl_type<T>(), op_name(op), recvcount, in_place));
    const uint64_t salt = recvcount * 16 + op + 5;
    const size_t total = recvcount * c.nranks;
    DeviceArray<T> send(rank_input<T>(c.rank, total, salt));
    DeviceArray<T> recv(in_place ? 0 : recvcount);
    T* out = in_place ? send.ptr + c.rank * recvcount : recv.ptr;
    EXPECT_EQ(ncclReduceScatter(send.ptr, out, recvcount, nccl_type<T>(), op, c.comm, stream), ncclSuccess)
        << ncclGetLastError(nullptr);
    std::vector<T> got(recvcount);
    CUDA_CHECK(cudaMemcpy(got.data(), out, recvcount * sizeof(T), cudaMemcpyDeviceToHost));
    const std::vector<std::vector<T>> inputs = all_rank_inputs<T>(c.nranks, total, salt);
    std::vector<T> want(recvcount);
    for (size_t i = 0; i < recvcount; i++) want[i] = reference_reduce(inputs, c.rank * recvcount + i, op);
    expect_bits_equal(got, want);
    // each rank holds its own block: compare the whole result, gathered
    if (c.spans_world()) {
        std::vector<T> all_want(total);
        for (size_t i = 0; i < total; i++) all_want[i] = reference_reduce(inputs, i, op);
        DeviceArray<T> gathered(total);
        EXPECT_EQ(ncclAllGather(out, gathered.ptr, recvcount, nccl_type<T>(), c.comm, stream), ncclSuccess)
            << ncclGetLastError(nullptr);
        expect_bits_equal(gathered.to_host(), all_want);
    }
}

template <typename T>
void check_allgather(const Comm& c, size_t sendcount, bool in_place, cudaStream_t stream) {
    SCOPED_TRACE(describe("AllGather", nccl_type<T>(), "-", sendcount, in_place));
    const uint64_t salt = sendcount * 16 + 11;
    const size_t total = sendcount * c.nranks;
    const std::vector<T> mine = rank_input<T>(c.rank, sendcount, salt);
    DeviceArray<T> recv(rank_input<T>(c.rank, total, salt + 1));  // what must be overwritten
    DeviceArray<T> send(in_place ? 0 : sendcount);
    T* in = in_place ? recv.ptr + c.rank * sendcount : send.ptr;
    CUDA_CHECK(cudaMemcpy(in, mine.data(), sendcount * sizeof(T), cudaMemcpyHostToDevice));
    EXPECT_EQ(ncclAllGather(in, recv.ptr, sendcount, nccl_type<T>(), c.comm, stream), ncclSuccess)
        << ncclGetLastError(nullptr);
    std::vector<T> want;
    for (int r = 0; r < c.nranks; r++) {
        const std::vector<T> block = rank_input<T>(r, sendcount, salt);
        want.insert(want.end(), block.begin(), block.end());
    }
    const std::vector<T> got = recv.to_host();
    expect_bits_equal(got, want);
    if (c.spans_world()) expect_same_on_every_rank(got);
}

// Out of place, ranks other than the root pass a null sendbuff (NCCL reads
// sendbuff on the root only).
template <typename T>
void check_broadcast(const Comm& c, size_t count, int root, bool in_place, cudaStream_t stream) {
    SCOPED_TRACE(describe("Broadcast", nccl_type<T>(), ("root " + std::to_string(root)).c_str(), count, in_place));
    const uint64_t salt = count * 16 + root + 13;
    const std::vector<T> mine = rank_input<T>(c.rank, count, salt);
    DeviceArray<T> recv(rank_input<T>(c.rank, count, salt + 1));
    DeviceArray<T> send(in_place || c.rank != root ? 0 : count);
    if (in_place && c.rank == root) CUDA_CHECK(cudaMemcpy(recv.ptr, mine.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    if (!in_place && c.rank == root) CUDA_CHECK(cudaMemcpy(send.ptr, mine.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    const T* in = in_place ? recv.ptr : send.ptr;
    EXPECT_EQ(ncclBroadcast(in, recv.ptr, count, nccl_type<T>(), root, c.comm, stream), ncclSuccess)
        << ncclGetLastError(nullptr);
    const std::vector<T> got = recv.to_host();
    expect_bits_equal(got, rank_input<T>(root, count, salt));
    if (c.spans_world()) expect_same_on_every_rank(got);
}

// Every reduction case of every type the tests cover, on one communicator.
void check_reductions(const Comm& c, bool reduce_scatter, cudaStream_t stream) {
    const std::vector<ncclRedOp_t> main_ops = {ncclSum, ncclAvg, ncclMax};
    const std::vector<ncclRedOp_t> all_ops = {ncclSum, ncclAvg, ncclMax, ncclMin, ncclProd};
    for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
            for (ncclRedOp_t op : all_ops) {
                if (reduce_scatter) check_reduce_scatter<float>(c, count, op, in_place, stream);
                else check_allreduce<float>(c, count, op, in_place, stream);
            }
            for (ncclRedOp_t op : main_ops) {
                if (reduce_scatter) {
                    check_reduce_scatter<__nv_bfloat16>(c, count, op, in_place, stream);
                    check_reduce_scatter<int32_t>(c, count, op, in_place, stream);
                } else {
                    check_allreduce<__nv_bfloat16>(c, count, op, in_place, stream);
                    check_allreduce<int32_t>(c, count, op, in_place, stream);
                }
            }
            if (count > 7) continue;  // the other types, small sizes only
            for (ncclRedOp_t op : all_ops) {
                if (reduce_scatter) {
                    check_reduce_scatter<double>(c, count, op, in_place, stream);
                    check_reduce_scatter<int8_t>(c, count, op, in_place, stream);
                    check_reduce_scatter<uint8_t>(c, count, op, in_place, stream);
                    check_reduce_scatter<uint32_t>(c, count, op, in_place, stream);
                    check_reduce_scatter<int64_t>(c, count, op, in_place, stream);
                    check_reduce_scatter<uint64_t>(c, count, op, in_place, stream);
                } else {
                    check_allreduce<double>(c, count, op, in_place, stream);
                    check_allreduce<int8_t>(c, count, op, in_place, stream);
                    check_allreduce<uint8_t>(c, count, op, in_place, stream);
                    check_allreduce<uint32_t>(c, count, op, in_place, stream);
                    check_allreduce<int64_t>(c, count, op, in_place, stream);
                    check_allreduce<uint64_t>(c, count, op, in_place, stream);
                }
            }
        }
}

void check_allgathers(const Comm& c, cudaStream_t stream) {
    for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
            check_allgather<float>(c, count, in_place, stream);
            check_allgather<__nv_bfloat16>(c, count, in_place, stream);
            check_allgather<int32_t>(c, count, in_place, stream);
        }
}

void check_broadcasts(const Comm& c, int root, cudaStream_t stream) {
    for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
            check_broadcast<float>(c, count, root, in_place, stream);
            check_broadcast<__nv_bfloat16>(c, count, root, in_place, stream);
            check_broadcast<int32_t>(c, count, root, in_place, stream);
        }
}

// A stream of the emulator, destroyed at the end of the test.
struct Stream {
    cudaStream_t s = nullptr;
    Stream() { CUDA_CHECK(cudaStreamCreate(&s)); }
    ~Stream() { cudaStreamDestroy(s); }
};

// ncclGetLastError mentions `text`.
::testing::AssertionResult last_error_mentions(const std::string& text) {
    const std::string last = ncclGetLastError(nullptr);
    if (last.find(text) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "ncclGetLastError: \"" << last << "\" does not mention \"" << text << "\"";
}

// The refusals of a host buffer and of a range past its allocation, on any
// communicator (every rank makes the same mistake, so none waits).
void check_host_pointers_refused(const Comm& c) {
    const size_t n = 64;
    DeviceArray<float> device(n * c.nranks);
    std::vector<float> host(n * c.nranks, 1.0f);
    EXPECT_EQ(ncclAllReduce(host.data(), device.ptr, n, ncclFloat, ncclSum, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("sendbuff"));
    EXPECT_TRUE(last_error_mentions("cudaMalloc"));
    EXPECT_EQ(ncclAllReduce(device.ptr, host.data(), n, ncclFloat, ncclSum, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("recvbuff"));
    EXPECT_EQ(ncclReduceScatter(host.data(), device.ptr, n, ncclFloat, ncclSum, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllGather(device.ptr, host.data(), n, ncclFloat, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclBroadcast(host.data(), host.data(), n, ncclFloat, 0, c.comm, nullptr), ncclInvalidArgument);
    // a device pointer whose range runs past its allocation
    EXPECT_EQ(ncclAllReduce(device.ptr + 1, device.ptr + 1, n * c.nranks, ncclFloat, ncclSum, c.comm, nullptr),
              ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("past its allocation"));
    EXPECT_EQ(ncclAllGather(device.ptr, device.ptr + 1, n, ncclFloat, c.comm, nullptr), ncclInvalidArgument);
    // NULL with a count, refused; count 0 touches nothing
    EXPECT_EQ(ncclAllReduce(nullptr, device.ptr, n, ncclFloat, ncclSum, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, c.comm, nullptr), ncclSuccess);
}

// Several calls in one group, each reading what the one before wrote, run as
// if one after another; nothing runs before the outermost ncclGroupEnd.
void check_group_in_order(const Comm& c) {
    const size_t n = 1000;
    const int nr = c.nranks;
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(c.rank + 1) * (float)i;
    DeviceArray<float> a(x), b(n), gathered(n * nr), scattered(n), broadcast(n);
    std::vector<float> before(n, -1.0f);
    CUDA_CHECK(cudaMemcpy(b.ptr, before.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    Stream stream;
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(a.ptr, b.ptr, n, ncclFloat, ncclSum, c.comm, stream.s), ncclSuccess);  // b = sum x
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);                                                          // nested
    EXPECT_EQ(ncclAllReduce(b.ptr, b.ptr, n, ncclFloat, ncclMax, c.comm, stream.s), ncclSuccess);  // b unchanged
    EXPECT_EQ(ncclAllGather(b.ptr, gathered.ptr, n, ncclFloat, c.comm, nullptr), ncclSuccess);  // nr copies of b
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(b.to_host(), before) << "a call inside a group ran before the outermost ncclGroupEnd";
    EXPECT_EQ(ncclReduceScatter(gathered.ptr, scattered.ptr, n, ncclFloat, ncclSum, c.comm, stream.s),
              ncclSuccess);  // every block is b: nr b
    EXPECT_EQ(ncclBroadcast(scattered.ptr, broadcast.ptr, n, ncclFloat, nr - 1, c.comm, stream.s), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    // b = sum over ranks of (r+1) i = i nr(nr+1)/2; scattered = nr b; broadcast the same
    std::vector<float> want_b(n), want_scattered(n);
    for (size_t i = 0; i < n; i++) {
        want_b[i] = (float)i * (float)(nr * (nr + 1) / 2);
        want_scattered[i] = want_b[i] * (float)nr;
    }
    EXPECT_EQ(b.to_host(), want_b);
    EXPECT_EQ(scattered.to_host(), want_scattered);
    EXPECT_EQ(broadcast.to_host(), want_scattered);
}

// A call refused inside a group fails the group: ncclGroupEnd returns that
// error and runs none of the group's calls.
void check_group_with_refused_call(const Comm& c) {
    const size_t n = 16;
    DeviceArray<int32_t> a(std::vector<int32_t>(n, 3)), b(std::vector<int32_t>(n, 0));
    std::vector<int32_t> host(n);
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(a.ptr, b.ptr, n, ncclInt32, ncclSum, c.comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(host.data(), b.ptr, n, ncclInt32, ncclSum, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    EXPECT_EQ(b.to_host(), std::vector<int32_t>(n, 0)) << "a failed group ran its first call";
    // the next group is not affected
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(a.ptr, b.ptr, n, ncclInt32, ncclSum, c.comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(b.to_host(), std::vector<int32_t>(n, 3 * c.nranks));
}

// ---- a communicator of one rank ---------------------------------------------------------------

TEST(EmuNccl, ErrorStringForEachResult) {
    const ncclResult_t results[] = {ncclSuccess,         ncclUnhandledCudaError, ncclSystemError,
                                    ncclInternalError,   ncclInvalidArgument,    ncclInvalidUsage,
                                    ncclRemoteError,     ncclInProgress};
    std::vector<std::string> seen;
    for (ncclResult_t r : results) {
        const std::string text = ncclGetErrorString(r);
        EXPECT_FALSE(text.empty()) << r;
        EXPECT_NE(text, "unknown result code") << r;
        EXPECT_EQ(std::count(seen.begin(), seen.end(), text), 0) << "two results share \"" << text << "\"";
        seen.push_back(text);
    }
    EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
    EXPECT_STREQ(ncclGetErrorString(ncclInvalidArgument), "invalid argument (ncclGetLastError says which)");
    EXPECT_STREQ(ncclGetErrorString(ncclNumResults), "unknown result code");
    EXPECT_STREQ(ncclGetErrorString((ncclResult_t)-1), "unknown result code");
}

TEST(EmuNccl, EnumValuesAreNccls) {
    EXPECT_EQ((int)ncclInProgress, 7);
    EXPECT_EQ((int)ncclAvg, 4);
    EXPECT_EQ((int)ncclBfloat16, 9);
    EXPECT_EQ((int)ncclFloat, 7);
    EXPECT_EQ((int)ncclInt, 2);
    EXPECT_EQ((int)ncclHalf, 6);
    EXPECT_EQ(sizeof(ncclUniqueId), 128u);
}

TEST(EmuNccl, Version) {
    int version = 0;
    EXPECT_EQ(ncclGetVersion(&version), ncclSuccess);
    EXPECT_EQ(version, NCCL_VERSION_CODE);
    EXPECT_EQ(version, 22800);
    EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
}

TEST(EmuNccl, UniqueIdsDiffer) {
    ncclUniqueId a, b;
    ASSERT_EQ(ncclGetUniqueId(&a), ncclSuccess);
    ASSERT_EQ(ncclGetUniqueId(&b), ncclSuccess);
    EXPECT_NE(std::memcmp(&a, &b, sizeof a), 0);
    EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
}

TEST(EmuNccl, InitRankChecksItsArguments) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = (ncclComm_t)&id;  // must be reset to NULL on failure
    EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    EXPECT_TRUE(last_error_mentions("nranks=0"));
    EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 1), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("rank=1"));
    EXPECT_EQ(ncclCommInitRank(&comm, 1, id, -1), ncclInvalidArgument);
    EXPECT_EQ(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument);
    int value = 0;
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommCount(nullptr, &value), ncclInvalidArgument);
    EXPECT_EQ(ncclCommUserRank(nullptr, &value), ncclInvalidArgument);
    EXPECT_EQ(ncclCommCuDevice(nullptr, &value), ncclInvalidArgument);
    EXPECT_EQ(ncclCommGetAsyncError(nullptr, &async), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("comm is NULL"));
    // NULL is accepted by destroy and abort, as in NCCL
    EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
    EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
}

TEST(EmuNccl, WorldOfOneQueries) {
    Comm c(local_comm());
    ASSERT_NE(c.comm, nullptr);
    EXPECT_EQ(c.nranks, 1);
    EXPECT_EQ(c.rank, 0);
    int device = -1;
    EXPECT_EQ(ncclCommCuDevice(c.comm, &device), ncclSuccess);
    EXPECT_EQ(device, 0);
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(c.comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_EQ(ncclCommCount(c.comm, nullptr), ncclInvalidArgument);
}

TEST(EmuNccl, WorldOfOneAllReduceIsACopy) {
    Comm c(local_comm());
    ASSERT_NE(c.comm, nullptr);
    Stream stream;
    check_reductions(c, false, stream.s);
}

TEST(EmuNccl, WorldOfOneReduceScatterIsACopy) {
    Comm c(local_comm());
    ASSERT_NE(c.comm, nullptr);
    check_reductions(c, true, nullptr);
}

TEST(EmuNccl, WorldOfOneAllGatherAndBroadcastAreCopies) {
    Comm c(local_comm());
    ASSERT_NE(c.comm, nullptr);
    check_allgathers(c, nullptr);
    check_broadcasts(c, 0, nullptr);
    DeviceArray<float> x(8);
    EXPECT_EQ(ncclBroadcast(x.ptr, x.ptr, 8, ncclFloat, 1, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("root=1"));
}

TEST(EmuNccl, HostPointersRefused) {
    Comm c(local_comm());
    ASSERT_NE(c.comm, nullptr);
    check_host_pointers_refused(c);
}

TEST(EmuNccl, UnsupportedTypesAndOpsRefused) {
    Comm c(local_comm());
    ASSERT_NE(c.comm, nullptr);
    DeviceArray<uint16_t> half(16), half_out(16);
    EXPECT_EQ(ncclAllReduce(half.ptr, half_out.ptr, 16, ncclFloat16, ncclSum, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("ncclFloat16"));
    EXPECT_EQ(ncclReduceScatter(half.ptr, half_out.ptr, 16, ncclHalf, ncclMax, c.comm, nullptr), ncclInvalidArgument);
    // fp16 and fp8 are moved, never reduced
    EXPECT_EQ(ncclAllGather(half.ptr, half_out.ptr, 16, ncclFloat16, c.comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclBroadcast(half.ptr, half_out.ptr, 32, ncclFloat8e4m3, 0, c.comm, nullptr), ncclSuccess);
    DeviceArray<float> x(16), y(16);
    EXPECT_EQ(ncclAllReduce(x.ptr, y.ptr, 16, ncclFloat, ncclNumOps, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("reduction op 5"));
    EXPECT_EQ(ncclAllReduce(x.ptr, y.ptr, 16, ncclNumTypes, ncclSum, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("datatype 12"));
    EXPECT_EQ(ncclAllGather(x.ptr, y.ptr, 16, (ncclDataType_t)-1, c.comm, nullptr), ncclInvalidArgument);
}

TEST(EmuNccl, OverlapOtherThanInPlaceRefused) {
    Comm c(local_comm());
    ASSERT_NE(c.comm, nullptr);
    DeviceArray<float> x(64);
    EXPECT_EQ(ncclAllReduce(x.ptr, x.ptr + 8, 32, ncclFloat, ncclSum, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(last_error_mentions("overlap"));
    EXPECT_EQ(ncclBroadcast(x.ptr + 1, x.ptr, 32, ncclFloat, 0, c.comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(x.ptr, x.ptr + 32, 32, ncclFloat, ncclSum, c.comm, nullptr), ncclSuccess);  // adjacent
}

TEST(EmuNccl, WorldOfOneGroups) {
    Comm c(local_comm());
    ASSERT_NE(c.comm, nullptr);
    check_group_in_order(c);
    check_group_with_refused_call(c);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_TRUE(last_error_mentions("no ncclGroupStart"));
}

TEST(EmuNccl, DestroyWithQueuedCallsRefused) {
    ncclComm_t comm = local_comm();
    ASSERT_NE(comm, nullptr);
    DeviceArray<float> x(4);
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(x.ptr, x.ptr, 4, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclInvalidUsage);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

#if !defined(KNNGPT_MPI)
TEST(EmuNccl, SeveralRanksNeedAnMpiBuild) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclInvalidUsage);
    EXPECT_EQ(comm, nullptr);
    EXPECT_TRUE(last_error_mentions("MPI build"));
    EXPECT_TRUE(last_error_mentions("mpirun"));
}
#endif

// ---- a communicator of every process of the job ---------------------------------------------------

TEST(Ranks, InitRank) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    EXPECT_EQ(c.nranks, world().size);
    EXPECT_EQ(c.rank, world().rank);
    int device = -1;
    EXPECT_EQ(ncclCommCuDevice(c.comm, &device), ncclSuccess);
    EXPECT_EQ(device, 0);
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(c.comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
}

TEST(Ranks, NranksMismatchRefusedOnEveryRank) {
    REQUIRE_RANKS();
    const int size = world().size, rank = world().rank;
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, size + 1, shared_id(), rank), ncclInvalidUsage);
    EXPECT_EQ(comm, nullptr);
    EXPECT_TRUE(last_error_mentions("nranks=" + std::to_string(size + 1)));
    EXPECT_TRUE(last_error_mentions("mpirun"));
    // every process says rank 0: refused on all of them alike
    EXPECT_EQ(ncclCommInitRank(&comm, size, shared_id(), 0), ncclInvalidUsage);
    EXPECT_EQ(comm, nullptr);
    EXPECT_TRUE(last_error_mentions("not 0.."));
    // and a good communicator afterwards
    Comm c(world_comm());
    EXPECT_EQ(c.nranks, size);
}

TEST(Ranks, AllReduce) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    Stream stream;
    check_reductions(c, false, stream.s);
}

TEST(Ranks, ReduceScatter) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    Stream stream;
    check_reductions(c, true, stream.s);
}

TEST(Ranks, AllGather) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    check_allgathers(c, nullptr);
}

TEST(Ranks, BroadcastFromRoot1) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    check_broadcasts(c, 1, nullptr);
}

TEST(Ranks, BroadcastFromRoot0) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    check_broadcasts(c, 0, nullptr);
}

// Exchanges cut into pieces (as every buffer over 16 MiB is): pieces smaller
// than one element per rank, pieces that do not divide the count, and 1 MiB
// pieces of 1000003 elements.
struct PieceBytes {
    size_t saved = knngpt::emu::nccl_detail::piece_bytes();
    explicit PieceBytes(size_t bytes) { knngpt::emu::nccl_detail::piece_bytes() = bytes; }
    ~PieceBytes() { knngpt::emu::nccl_detail::piece_bytes() = saved; }
};

TEST(Ranks, ExchangesInPieces) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    for (size_t bytes : {size_t(1), size_t(24), size_t(1000), size_t(1) << 20})
        for (size_t count : {size_t(1), size_t(7), size_t(1003), size_t(1000003)}) {
            if (count > 1003 && bytes < 1000) continue;  // a million pieces: slow, and nothing new
            SCOPED_TRACE("pieces of " + std::to_string(bytes) + " bytes");
            PieceBytes pieces(bytes);
            for (bool in_place : {false, true}) {
                check_allreduce<float>(c, count, ncclAvg, in_place, nullptr);
                check_allreduce<__nv_bfloat16>(c, count, ncclSum, in_place, nullptr);
                check_allreduce<int32_t>(c, count, ncclMax, in_place, nullptr);
                check_reduce_scatter<float>(c, count, ncclSum, in_place, nullptr);
                check_reduce_scatter<__nv_bfloat16>(c, count, ncclAvg, in_place, nullptr);
                check_allgather<float>(c, count, in_place, nullptr);
                check_allgather<__nv_bfloat16>(c, count, in_place, nullptr);
                check_broadcast<int32_t>(c, count, 1, in_place, nullptr);
            }
        }
}

// The same AllReduce twice, and in place against out of place: the same bits.
TEST(Ranks, RepeatedCallsBitIdentical) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    const size_t n = 100003;
    const std::vector<float> x = rank_input<float>(c.rank, n, 99);
    DeviceArray<float> in(x), first(n), second(n), in_place(x);
    EXPECT_EQ(ncclAllReduce(in.ptr, first.ptr, n, ncclFloat, ncclAvg, c.comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(in.ptr, second.ptr, n, ncclFloat, ncclAvg, c.comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(in_place.ptr, in_place.ptr, n, ncclFloat, ncclAvg, c.comm, nullptr), ncclSuccess);
    const std::vector<float> a = first.to_host(), b = second.to_host(), d = in_place.to_host();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(a.data(), d.data(), n * sizeof(float)), 0);
    expect_same_on_every_rank(a);
}

TEST(Ranks, Groups) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    check_group_in_order(c);
    check_group_with_refused_call(c);
}

TEST(Ranks, HostPointersRefused) {
    REQUIRE_RANKS();
    Comm c(world_comm());
    check_host_pointers_refused(c);
}

// Abort frees this rank's end with no collective step; the job goes on.
TEST(Ranks, AbortThenANewCommunicator) {
    REQUIRE_RANKS();
    ncclComm_t doomed = world_comm();
    EXPECT_NE(doomed, nullptr);
    EXPECT_EQ(ncclCommAbort(doomed), ncclSuccess);
    Comm c(world_comm());
    DeviceArray<int32_t> x(std::vector<int32_t>(5, c.rank + 1));
    EXPECT_EQ(ncclAllReduce(x.ptr, x.ptr, 5, ncclInt32, ncclSum, c.comm, nullptr), ncclSuccess);
    EXPECT_EQ(x.to_host(), std::vector<int32_t>(5, c.nranks * (c.nranks + 1) / 2));
}

// ---- main: the run under mpirun ----------------------------------------------------------------------

#if defined(KNNGPT_MPI)
constexpr const char* kRelaunchMarker = "KNNGPT_EMU_NCCL_UNDER_MPIRUN";

bool started_by_mpirun() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

// mpirun's hang guard, in seconds; sanitized code (make test SANITIZE=1) runs several times slower
#if defined(__SANITIZE_ADDRESS__)
constexpr const char* kMpirunTimeoutS = "900";
#else
constexpr const char* kMpirunTimeoutS = "120";
#endif

// Runs this binary again as `mpirun -np 2 --timeout kMpirunTimeoutS <binary> <args>` and
// returns mpirun's exit status. The marker in the environment stops a second
// relaunch (should mpirun not say it started us). As the test runner does,
// it lets OpenMPI run as root and two ranks share a one-core machine, in
// mpirun's environment only, unless the caller has said otherwise; and it
// colours GoogleTest's output only if this process's stdout is a terminal.
int relaunch_under_mpirun(int argc, char** argv) {
    char exe[4096];
    const ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (length <= 0) {
        std::perror("test_emu_nccl: readlink /proc/self/exe");
        return 1;
    }
    exe[length] = '\0';
    std::vector<std::string> args = {"mpirun", "-np", "2", "--timeout", kMpirunTimeoutS, exe};
    for (int i = 1; i < argc; i++) args.push_back(argv[i]);
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    std::printf("test_emu_nccl: running the suite as 2 MPI ranks:");
    for (const std::string& a : args) std::printf(" %s", a.c_str());
    std::printf("\n");
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        std::perror("test_emu_nccl: fork");
        return 1;
    }
    if (pid == 0) {
        setenv(kRelaunchMarker, "1", 1);
        if (geteuid() == 0) {
            setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
            setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
        }
        setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
        // mpirun gives the ranks a terminal for stdout, so GoogleTest would
        // colour its lines even where ours goes to a file (the runner's log)
        setenv("GTEST_COLOR", isatty(STDOUT_FILENO) ? "yes" : "no", 0);
        execvp(cargs[0], cargs.data());
        std::perror("test_emu_nccl: cannot start mpirun (OpenMPI's openmpi-bin)");
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) {
        std::perror("test_emu_nccl: waitpid");
        return 1;
    }
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    std::fprintf(stderr, "test_emu_nccl: mpirun ended by signal %d\n", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return 1;
}
#endif

// On ranks other than 0, in place of GoogleTest's printer: only the failures,
// each line prefixed with the rank (and never in the printer's "[  FAILED  ]"
// form, which the test runner counts).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
  public:
    explicit RankFailurePrinter(int rank) : rank_(rank) {}
    void OnTestPartResult(const ::testing::TestPartResult& result) override {
        if (!result.failed()) return;
        std::printf("rank %d: %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                    result.line_number(), result.message());
        std::fflush(stdout);
    }
    void OnTestEnd(const ::testing::TestInfo& info) override {
        if (info.result()->Failed()) {
            std::printf("rank %d: test %s.%s failed\n", rank_, info.test_suite_name(), info.name());
            std::fflush(stdout);
        }
    }

  private:
    int rank_;
};

}  // namespace

int main(int argc, char** argv) {
#if defined(KNNGPT_MPI)
    bool listing = false;
    for (int i = 1; i < argc; i++) listing = listing || std::strncmp(argv[i], "--gtest_list_tests", 18) == 0;
    if (!listing && !started_by_mpirun() && !std::getenv(kRelaunchMarker)) return relaunch_under_mpirun(argc, argv);
    int provided = 0;
    knngpt::mpi_init_once(MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world().rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world().size);
#endif
    ::testing::InitGoogleTest(&argc, argv);
    if (world().rank != 0) {
        ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter(world().rank));
    }
    int failed = RUN_ALL_TESTS() != 0;
#if defined(KNNGPT_MPI)
    // rank 0 says when only another rank failed; every rank exits non-zero then
    int any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_failed && !failed && world().rank == 0)
        std::printf("another rank failed (its failures are printed above, prefixed \"rank N:\")\n");
    failed = any_failed;
    knngpt::mpi_finalize_once();
#endif
    return failed;
}
