// model/comm_mpi.h — Comm over MPI for the CPU build (model/comm.h): host
// buffers of fp32, MPI_COMM_WORLD, one rank per process.
//
// Every rank gets the same bits: all_reduce is a reduce-scatter (each element
// is combined on exactly one rank) followed by an all-gather of the results;
// all_reduce_host gathers the ranks' values and combines them in rank order.
// Mean is Sum followed by one multiplication by 1/world. MPI counts are int, so
// long buffers go in pieces of at most 2^30 elements.
//
// Built where the Makefile finds mpicxx (-DKNNGPT_MPI); without it make_comm
// gives SingleComm, and refuses a run that an MPI launcher started with more
// than one process.
#pragma once
#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(KNNGPT_MPI)
#include <mpi.h>
#endif

#include "kernels/common/mpi_lifetime.h"
#include "model/comm.h"

namespace knngpt {

// The world size an MPI launcher announced (1 when none did).
inline int launcher_world_size() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
        if (const char* n = std::getenv(v)) return std::max(1, std::atoi(n));
    return 1;
}

#if defined(KNNGPT_MPI)

namespace comm_detail {

inline void mpi_check(int status, const char* what) {
    if (status == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(status, text, &length);
    throw std::runtime_error(std::string(what) + ": " + std::string(text, length));
}

inline MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::Min: return MPI_MIN;
        case ReduceOp::Max: return MPI_MAX;
        default: return MPI_SUM;  // Mean: Sum, then scaled
    }
}

// Initialises MPI once per process (threads funnelled: OpenMP threads never call MPI).
inline void ensure_mpi_initialized() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    mpi_check(mpi_init_once(MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    // ranks report their own errors (one line each) instead of MPI's default of aborting
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

constexpr size_t kMaxMpiCount = size_t(1) << 30;

// This process's rank and the world size in MPI_COMM_WORLD, and its rank on its node.
inline void mpi_world_ranks(int* rank, int* world, int* local_rank) {
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    MPI_Comm node;
    mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_free(&node);
}

using knngpt::mpi_finalize_once;

}  // namespace comm_detail

class MpiComm final : public Comm {
 public:
    MpiComm() {
        comm_detail::ensure_mpi_initialized();
        comm_detail::mpi_world_ranks(&rank_, &world_, &local_rank_);
    }
    ~MpiComm() override { comm_detail::mpi_finalize_once(); }
    const char* name() const override { return "MPI"; }

    void all_reduce(float* buf, size_t count, ReduceOp op) override {
        // pieces of world·q elements (the last one shorter), each reduce-scattered then all-gathered
        const size_t piece = comm_detail::kMaxMpiCount / world_ * world_;
        for (size_t at = 0; at < count; at += piece) all_reduce_piece(buf + at, std::min(piece, count - at), op);
    }
    void reduce_scatter(float* buf, size_t shard_count, ReduceOp op) override {
        if (shard_count > comm_detail::kMaxMpiCount) throw std::runtime_error("MPI reduce-scatter: shard above 2^30 values");
        // MPI leaves this rank's reduced shard at the start of the buffer; move it to its place
        comm_detail::mpi_check(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, (int)shard_count, MPI_FLOAT,
                                                        comm_detail::mpi_op(op), MPI_COMM_WORLD),
                               "MPI_Reduce_scatter_block");
        float* mine = buf + (size_t)rank_ * shard_count;
        if (rank_ != 0) std::copy(buf, buf + shard_count, mine);
        if (op == ReduceOp::Mean) scale(mine, shard_count);
    }
    void all_gather(float* buf, size_t shard_count) override {
        if (shard_count > comm_detail::kMaxMpiCount) throw std::runtime_error("MPI all-gather: shard above 2^30 values");
        comm_detail::mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)shard_count, MPI_FLOAT,
                                             MPI_COMM_WORLD),
                               "MPI_Allgather");
    }
    void broadcast(float* buf, size_t count, int root) override {
        for (size_t at = 0; at < count; at += comm_detail::kMaxMpiCount)
            comm_detail::mpi_check(MPI_Bcast(buf + at, (int)std::min(comm_detail::kMaxMpiCount, count - at), MPI_FLOAT,
                                             root, MPI_COMM_WORLD),
                                   "MPI_Bcast");
    }
    double all_reduce_host(double value, ReduceOp op) override {
        std::vector<double> values(world_);
        comm_detail::mpi_check(MPI_Allgather(&value, 1, MPI_DOUBLE, values.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD),
                               "MPI_Allgather");
        double r = values[0];
        for (int i = 1; i < world_; i++) {
            if (op == ReduceOp::Min) r = std::min(r, values[i]);
            else if (op == ReduceOp::Max) r = std::max(r, values[i]);
            else r += values[i];
        }
        return op == ReduceOp::Mean ? r / world_ : r;
    }
    void barrier() override { comm_detail::mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
    [[noreturn]] void abort(int status) override {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status);
        std::exit(status);  // MPI_Abort does not return; this keeps [[noreturn]] honest
    }

 private:
    void scale(float* x, size_t n) const {
        const float inv = 1.0f / (float)world_;
        for (size_t i = 0; i < n; i++) x[i] *= inv;
    }
    void all_reduce_piece(float* buf, size_t count, ReduceOp op) {
        // rank r reduces elements [displ[r], displ[r] + counts[r]); the first ranks take one more when uneven
        std::vector<int> counts(world_), displs(world_);
        const size_t base = count / world_, extra = count % world_;
        for (int r = 0, at = 0; r < world_; r++) {
            counts[r] = (int)(base + ((size_t)r < extra ? 1 : 0));
            displs[r] = at;
            at += counts[r];
        }
        comm_detail::mpi_check(MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts.data(), MPI_FLOAT, comm_detail::mpi_op(op),
                                                  MPI_COMM_WORLD),
                               "MPI_Reduce_scatter");
        float* mine = buf + displs[rank_];
        if (rank_ != 0) std::copy(buf, buf + counts[rank_], mine);  // MPI left it at the start
        if (op == ReduceOp::Mean) scale(mine, counts[rank_]);
        comm_detail::mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(),
                                              MPI_FLOAT, MPI_COMM_WORLD),
                               "MPI_Allgatherv");
    }
};

#endif  // KNNGPT_MPI

#if !defined(KNNGPT_CUDA)
inline std::unique_ptr<Comm> make_comm(const CommOptions& options) {
    if (!options.init_method.empty() && options.init_method != "mpi")
        throw std::runtime_error("-pi " + options.init_method +
                                 ": the CPU trainer runs its processes over MPI only (start them with mpirun or srun)");
#if defined(KNNGPT_MPI)
    if (started_by_mpi_launcher()) return std::make_unique<MpiComm>();
    if (options.init_method == "mpi")
        throw std::runtime_error("-pi mpi: this process was not started by an MPI launcher (mpirun, mpiexec, srun)");
#else
    if (launcher_world_size() > 1 || options.init_method == "mpi")
        throw std::runtime_error("this build has no MPI (rebuild with Debian's libopenmpi-dev installed) and runs one process only");
#endif
    return std::make_unique<SingleComm>();
}
#endif

}  // namespace knngpt
