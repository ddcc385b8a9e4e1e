// model/comm_nccl.h — Comm over NCCL for the CUDA build (model/comm.h):
// device buffers of fp32, one GPU per local rank, the collectives on a stream
// of their own.
//
// Ordering. The model's kernels run on the default stream. Each collective
// first makes the NCCL stream wait for the work queued so far (an event), and
// the default stream then waits for the collective (another event), so a
// collective sees the finished gradients and the next kernel sees its result,
// with no host synchronisation. all_reduce_host synchronises (it returns a value).
//
// Finding each other: every rank needs rank 0's ncclUniqueId.
//   -pi mpi   (default under mpirun / srun with PMIx) MPI_Bcast from rank 0
//   -pi fs    rank 0 writes it to DIR/ncclUniqueId<job>.bin (-pp DIR, a directory all
//             ranks see; <job> is $SLURM_JOB_ID.$SLURM_STEP_ID when set), written to
//             a temporary name and renamed, with its run nonce; the others poll for it
//             and take it once that rank 0 has answered them (a stale file is never
//             joined); rank 0 removes it once every rank has joined
//   -pi tcp   rank 0 listens on -ps HOST[:PORT] (port 29500 by default) and sends it
//             to each rank that connects
// With fs and tcp the world size and rank come from -pn and -pr (default
// $SLURM_NTASKS and $SLURM_PROCID), the local rank is rank % -pg (default
// $SLURM_NTASKS_PER_NODE, else 8).
//
// Faults: abort() ends NCCL and, under MPI, every rank (MPI_Abort). Under fs
// or tcp there is no MPI to end the others: the launcher (srun -K1) or each
// rank's watchdog (model/comm_watchdog.h) does.
//
// Under the CPU emulator, NCCL is kernels/emu/nccl.h, which carries the same
// calls over MPI between the processes mpirun started.
#pragma once
#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "model/checkpoint_dir.h"
#include "model/comm.h"
#include "model/comm_mpi.h"

#if defined(KNNGPT_CUDA_EMU)
#include "kernels/emu/nccl.h"
#else
#include <nccl.h>
#endif

namespace knngpt {

namespace comm_detail {

inline void nccl_check(ncclResult_t status, const char* what) {
    if (status != ncclSuccess) throw std::runtime_error(std::string(what) + ": NCCL error: " + ncclGetErrorString(status));
}

inline ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::Sum: return ncclSum;
        case ReduceOp::Mean: return ncclAvg;
        case ReduceOp::Min: return ncclMin;
        case ReduceOp::Max: return ncclMax;
    }
    return ncclSum;
}

constexpr double kRendezvousTimeoutSeconds = 300.0;

inline int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : fallback;
}

// rank 0's id through a file in a shared directory. A file left by a run that crashed
// before its rank 0 removed it must never be joined, so the file carries rank 0's run
// nonce, and a rank takes an id only once that rank 0 has answered it: the rank drops
// a marker PATH.<nonce>.r<rank>.<its own nonce>, and the live rank 0 of that nonce
// answers with the marker's name plus ".ack". A stale file's rank 0 is gone and never
// answers; when the new rank 0 replaces the file, its nonce is new and the rank
// follows it. Rank 0 returns once every other rank has been answered.
struct IdFile {
    char magic[8];
    uint64_t nonce;
    ncclUniqueId id;
};
constexpr char kIdFileMagic[8] = {'K', 'N', 'N', 'G', 'P', 'T', 'I', 'D'};

inline uint64_t fresh_nonce() {
    uint64_t n = 0;
    if (FILE* f = std::fopen("/dev/urandom", "rb")) {
        if (std::fread(&n, sizeof(n), 1, f) != 1) n = 0;
        std::fclose(f);
    }
    const uint64_t t = (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
    return n ^ (t * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)getpid() << 32);
}

inline bool read_id_file(const std::string& path, IdFile* out) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    const bool ok = std::fread(out, sizeof(*out), 1, f) == 1 && std::memcmp(out->magic, kIdFileMagic, 8) == 0;
    std::fclose(f);
    return ok;
}

inline void touch(const std::string& path) {
    if (FILE* f = std::fopen(path.c_str(), "wb")) std::fclose(f);
}

// the files a rank 0 of `nonce` and its ranks wrote beside `path` (markers, answers)
inline std::vector<std::string> handshake_files(const std::string& path, uint64_t nonce) {
    const size_t slash = path.rfind('/');
    const std::string dir = path.substr(0, slash), prefix = path.substr(slash + 1) + "." + std::to_string(nonce) + ".r";
    std::vector<std::string> names;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d))
            if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) names.push_back(dir + "/" + e->d_name);
        closedir(d);
    }
    return names;
}

inline ncclUniqueId unique_id_through_file(const std::string& dir, int rank, int world, std::string* path_out,
                                           uint64_t* nonce_out) {
    if (dir.empty()) throw std::runtime_error("-pi fs needs -pp DIR, a directory every process sees");
    std::string job;
    if (const char* j = std::getenv("SLURM_JOB_ID")) job = std::string(".") + j + "." + std::to_string(env_int("SLURM_STEP_ID", 0));
    const std::string path = dir + "/ncclUniqueId" + job + ".bin";
    *path_out = path;
    const auto start = std::chrono::steady_clock::now();
    auto timed_out = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kRendezvousTimeoutSeconds;
    };
    const std::string waited = std::to_string((int)kRendezvousTimeoutSeconds) + " s";
    if (rank == 0) {
        IdFile file;
        std::memcpy(file.magic, kIdFileMagic, 8);
        file.nonce = *nonce_out = fresh_nonce();
        nccl_check(ncclGetUniqueId(&file.id), "ncclGetUniqueId");
        const std::string tmp = path + ".tmp";
        FILE* f = std::fopen(tmp.c_str(), "wb");
        bool ok = f && std::fwrite(&file, sizeof(file), 1, f) == 1;
        if (f && std::fclose(f) != 0) ok = false;
        if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
            throw std::runtime_error("-pp " + dir + ": cannot write " + path);
        // answer every marker of this nonce until each other rank has one
        std::vector<bool> answered(world, false);
        int count = 1;
        while (count < world) {
            for (const std::string& name : handshake_files(path, file.nonce)) {
                if (name.size() > 4 && name.compare(name.size() - 4, 4, ".ack") == 0) continue;
                const int r = std::atoi(name.c_str() + name.rfind(".r") + 2);
                if (r <= 0 || r >= world || answered[r]) continue;
                touch(name + ".ack");
                answered[r] = true, count++;
            }
            if (count < world && timed_out())
                throw std::runtime_error("-pi fs: " + std::to_string(world - count) + " rank(s) did not read " + path +
                                         " in " + waited);
            if (count < world) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return file.id;
    }
    const uint64_t mine = fresh_nonce();
    uint64_t following = 0;  // the nonce whose rank 0 has this rank's marker
    std::string marker;
    for (;;) {
        IdFile file;
        if (read_id_file(path, &file)) {
            if (file.nonce != following) {  // a first file, or a new rank 0 replaced a stale one
                if (!marker.empty()) std::remove(marker.c_str());
                following = file.nonce;
                marker = path + "." + std::to_string(following) + ".r" + std::to_string(rank) + "." + std::to_string(mine);
                touch(marker);
            }
            if (file_exists(marker + ".ack")) return file.id;
        }
        if (timed_out())
            throw std::runtime_error("-pi fs: no live rank 0 answered through " + path + " in " + waited +
                                     (following ? " (the file there is from a run that has ended)" : ""));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

// rank 0's id over TCP: rank 0 serves it to world - 1 connections
inline ncclUniqueId unique_id_through_tcp(const std::string& server, int rank, int world) {
    if (server.empty()) throw std::runtime_error("-pi tcp needs -ps HOST[:PORT], the address of rank 0");
    std::string host = server, port = "29500";
    if (size_t colon = server.rfind(':'); colon != std::string::npos) {
        host = server.substr(0, colon);
        port = server.substr(colon + 1);
    }
    addrinfo hints{}, *addrs = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &addrs) != 0 || !addrs)
        throw std::runtime_error("-ps " + server + ": cannot resolve the address");
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addrs_owner(addrs, freeaddrinfo);
    ncclUniqueId id;
    if (rank == 0) {
        nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        int listener = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in any{};
        any.sin_family = AF_INET;
        any.sin_port = ((sockaddr_in*)addrs->ai_addr)->sin_port;
        any.sin_addr.s_addr = htonl(INADDR_ANY);
        if (listener < 0 || bind(listener, (sockaddr*)&any, sizeof(any)) != 0 || listen(listener, world) != 0)
            throw std::runtime_error("-ps " + server + ": rank 0 cannot listen on port " + port + ": " + std::strerror(errno));
        for (int served = 1; served < world; served++) {
            int peer = accept(listener, nullptr, nullptr);
            if (peer < 0) throw std::runtime_error("-pi tcp: accept failed: " + std::string(std::strerror(errno)));
            bool ok = send(peer, &id, sizeof(id), 0) == (ssize_t)sizeof(id);
            close(peer);
            if (!ok) throw std::runtime_error("-pi tcp: sending the id failed");
        }
        close(listener);
        return id;
    }
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s >= 0 && connect(s, addrs->ai_addr, addrs->ai_addrlen) == 0) {
            size_t got = 0;
            while (got < sizeof(id)) {
                ssize_t n = recv(s, (char*)&id + got, sizeof(id) - got, 0);
                if (n <= 0) break;
                got += (size_t)n;
            }
            close(s);
            if (got == sizeof(id)) return id;
        } else if (s >= 0) {
            close(s);
        }
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kRendezvousTimeoutSeconds)
            throw std::runtime_error("-pi tcp: no id from rank 0 at " + server + " in " +
                                     std::to_string((int)kRendezvousTimeoutSeconds) + " s");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
}

}  // namespace comm_detail

class NcclComm final : public Comm {
 public:
    explicit NcclComm(const CommOptions& o) {
        const std::string method = o.init_method.empty() ? "mpi" : o.init_method;
        ncclUniqueId id;
        std::string id_file;
        uint64_t id_nonce = 0;
        if (method == "mpi") {
#if defined(KNNGPT_MPI)
            comm_detail::ensure_mpi_initialized();
            using_mpi_ = true;
            comm_detail::mpi_world_ranks(&rank_, &world_, &local_rank_);
            if (rank_ == 0) comm_detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
            comm_detail::mpi_check(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast of the NCCL id");
#else
            throw std::runtime_error("-pi mpi: this build has no MPI; use -pi fs or -pi tcp");
#endif
        } else if (method == "fs" || method == "tcp") {
            world_ = o.num_processes > 0 ? o.num_processes : comm_detail::env_int("SLURM_NTASKS", -1);
            rank_ = o.process_rank >= 0 ? o.process_rank : comm_detail::env_int("SLURM_PROCID", -1);
            if (world_ < 1) throw std::runtime_error("-pi " + method + " needs -pn, the number of processes");
            if (rank_ < 0 || rank_ >= world_)
                throw std::runtime_error("-pi " + method + " needs -pr, this process's rank in [0, " + std::to_string(world_) + ")");
            const int per_node = o.gpus_per_node > 0 ? o.gpus_per_node : comm_detail::env_int("SLURM_NTASKS_PER_NODE", 8);
            local_rank_ = rank_ % per_node;
            id = method == "fs" ? comm_detail::unique_id_through_file(o.fs_path, rank_, world_, &id_file, &id_nonce)
                                : comm_detail::unique_id_through_tcp(o.server_ip, rank_, world_);
        } else {
            throw std::runtime_error("-pi " + method + ": unknown init method (mpi, fs or tcp)");
        }
        int devices = 0;
        CUDA_CHECK(cudaGetDeviceCount(&devices));
#if defined(KNNGPT_CUDA_EMU)
        device_ = 0;  // the emulator has one device, shared by the ranks of this machine
#else
        device_ = local_rank_;
        if (device_ >= devices)
            throw std::runtime_error("rank " + std::to_string(rank_) + ": local rank " + std::to_string(local_rank_) +
                                     " has no GPU of its own (" + std::to_string(devices) + " visible)");
#endif
        CUDA_CHECK(cudaSetDevice(device_));
        comm_detail::nccl_check(ncclCommInitRank(&comm_, world_, id, rank_), "ncclCommInitRank");
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming));
        CUDA_CHECK(cudaMalloc(&host_scalar_, sizeof(double)));
        barrier();  // every rank has joined: the id file and its handshake have served
        if (rank_ == 0 && !id_file.empty()) {
            std::remove(id_file.c_str());
            for (const std::string& name : comm_detail::handshake_files(id_file, id_nonce)) std::remove(name.c_str());
        }
    }
    ~NcclComm() override {
        if (comm_) ncclCommDestroy(comm_);
        if (host_scalar_) cudaFree(host_scalar_);
        if (queued_) cudaEventDestroy(queued_);
        if (reduced_) cudaEventDestroy(reduced_);
        if (stream_) cudaStreamDestroy(stream_);
#if defined(KNNGPT_MPI)
        if (using_mpi_) comm_detail::mpi_finalize_once();
#endif
    }
    const char* name() const override { return using_mpi_ ? "NCCL (id over MPI)" : "NCCL"; }

    void all_reduce(float* buf, size_t count, ReduceOp op) override {
        begin();
        comm_detail::nccl_check(ncclAllReduce(buf, buf, count, ncclFloat, comm_detail::nccl_op(op), comm_, stream_),
                                "ncclAllReduce");
        end();
    }
    void reduce_scatter(float* buf, size_t shard_count, ReduceOp op) override {
        begin();
        comm_detail::nccl_check(ncclReduceScatter(buf, buf + (size_t)rank_ * shard_count, shard_count, ncclFloat,
                                                  comm_detail::nccl_op(op), comm_, stream_),
                                "ncclReduceScatter");
        end();
    }
    void all_gather(float* buf, size_t shard_count) override {
        begin();
        comm_detail::nccl_check(ncclAllGather(buf + (size_t)rank_ * shard_count, buf, shard_count, ncclFloat, comm_, stream_),
                                "ncclAllGather");
        end();
    }
    void broadcast(float* buf, size_t count, int root) override {
        begin();
        comm_detail::nccl_check(ncclBroadcast(buf, buf, count, ncclFloat, root, comm_, stream_), "ncclBroadcast");
        end();
    }
    double all_reduce_host(double value, ReduceOp op) override {
        CUDA_CHECK(cudaMemcpy(host_scalar_, &value, sizeof(double), cudaMemcpyHostToDevice));
        begin();
        comm_detail::nccl_check(
            ncclAllReduce(host_scalar_, host_scalar_, 1, ncclFloat64, comm_detail::nccl_op(op), comm_, stream_),
            "ncclAllReduce");
        wait_for_nccl_stream();
        CUDA_CHECK(cudaMemcpy(&value, host_scalar_, sizeof(double), cudaMemcpyDeviceToHost));
        return value;
    }
    void barrier() override { all_reduce_host(0.0, ReduceOp::Sum); }
    // one group on the NCCL stream after the work queued so far; the default
    // stream goes on, and waits for it only in all_reduce_wait
    void all_reduce_start(const std::vector<FloatSpan>& spans) override {
        CUDA_CHECK(cudaEventRecord(queued_, nullptr));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, queued_, 0));
        comm_detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
        for (const FloatSpan& s : spans)
            comm_detail::nccl_check(ncclAllReduce(s.data, s.data, s.count, ncclFloat, ncclSum, comm_, stream_),
                                    "ncclAllReduce");
        comm_detail::nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    }
    void all_reduce_wait() override { end(); }
    // Waits for the NCCL stream, polling NCCL's asynchronous error meanwhile: a failure
    // NCCL detects (a peer's broken connection, a remote error) aborts the communicator
    // and stops this rank with NCCL's message instead of waiting on; a peer that hangs
    // without an error is left to the watchdog (model/comm_watchdog.h).
    void wait_for_nccl_stream() {
        for (;;) {
            const cudaError_t done = cudaStreamQuery(stream_);
            if (done == cudaSuccess) return;
            if (done != cudaErrorNotReady) CUDA_CHECK(done);
            ncclResult_t async = ncclSuccess;
            comm_detail::nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
            if (async != ncclSuccess && async != ncclInProgress) {
                ncclCommAbort(comm_);
                comm_ = nullptr;
                throw std::runtime_error(std::string("NCCL failed while waiting for the other ranks: ") +
                                         ncclGetErrorString(async) + " (communicator aborted)");
            }
            std::this_thread::yield();
        }
    }

    [[noreturn]] void abort(int status) override {
        fflush(stdout);
        fflush(stderr);
        if (comm_) ncclCommAbort(comm_);
        comm_ = nullptr;
#if defined(KNNGPT_MPI)
        if (using_mpi_) MPI_Abort(MPI_COMM_WORLD, status);
#endif
        std::exit(status);
    }

 private:
    void begin() {
        CUDA_CHECK(cudaEventRecord(queued_, nullptr));  // the default stream's work so far
        CUDA_CHECK(cudaStreamWaitEvent(stream_, queued_, 0));
    }
    void end() {
        CUDA_CHECK(cudaEventRecord(reduced_, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(nullptr, reduced_, 0));
    }

    ncclComm_t comm_ = nullptr;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t queued_ = nullptr, reduced_ = nullptr;
    double* host_scalar_ = nullptr;
    int device_ = 0;
    bool using_mpi_ = false;
};

inline std::unique_ptr<Comm> make_comm(const CommOptions& options) {
    const bool asked = !options.init_method.empty();
    if (asked || started_by_mpi_launcher()) return std::make_unique<NcclComm>(options);
    return std::make_unique<SingleComm>();
}

}  // namespace knngpt
