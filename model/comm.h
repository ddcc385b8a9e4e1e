// model/comm.h — the collectives of data-parallel training: one interface that
// the trainer and the model call, whatever carries them.
//
//   rank, world, local rank         which process this is, of how many, on its node
//   all_reduce(buf, n, op)          buf = op over the ranks of buf                (in place)
//   reduce_scatter(buf, shard, op)  buf holds world·shard values; this rank's shard
//                                   buf[rank·shard, +shard) = op over the ranks  (in place)
//   all_gather(buf, shard)          every rank's buf[r·shard, +shard) to every rank (in place)
//   broadcast(buf, n, root)         root's buf to every rank
//   all_reduce_host(x, op)          a host scalar (losses, squared norms, error flags)
//   barrier, abort(status)          abort ends every rank now, status non-zero
//   wait_for_rank0()                a barrier after work rank 0 does alone (a sample, a
//                                   checkpoint's write): the others may wait seconds there
//   all_reduce_start(spans), all_reduce_wait()
//                                   sums started now, without waiting for them: the
//                                   work queued after them runs meanwhile (NCCL's stream),
//                                   and all_reduce_wait orders what follows after them.
//                                   The spans must not be written until then. Over MPI
//                                   they complete at once.
//
// op is Sum, Mean (Sum / world), Min or Max. Buffers live where the backend keeps its
// tensors: host memory in the CPU build, device memory in the CUDA build.
// Every rank gets bit-identical results, so ranks that apply the same update
// to the same parameters stay equal.
//
// Implementations (make_comm picks one from how the process was started):
//   SingleComm  one process: every collective is the identity
//   MpiComm     the CPU build under mpirun (or srun with PMIx), host buffers (model/comm_mpi.h)
//   NcclComm    the CUDA build: NCCL on its own stream, device buffers, the
//               unique id from rank 0 over MPI, a shared file or TCP (model/comm_nccl.h);
//               under the CPU emulator NCCL itself is emulated over MPI (kernels/emu/nccl.h)
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace knngpt {

enum class ReduceOp { Sum, Mean, Min, Max };

struct FloatSpan {
    float* data;
    size_t count;
};

class Comm {
 public:
    virtual ~Comm() = default;
    int rank() const { return rank_; }
    int world() const { return world_; }
    int local_rank() const { return local_rank_; }
    virtual const char* name() const = 0;  // the collective backend, for the header
    // false only for SingleComm: a run under MPI or NCCL uses its collectives
    // even with one rank, so that path runs wherever the launcher starts one
    virtual bool carries_collectives() const { return true; }

    virtual void all_reduce(float* buf, size_t count, ReduceOp op) = 0;
    virtual void reduce_scatter(float* buf, size_t shard_count, ReduceOp op) = 0;
    virtual void all_gather(float* buf, size_t shard_count) = 0;
    virtual void broadcast(float* buf, size_t count, int root) = 0;
    virtual double all_reduce_host(double value, ReduceOp op) = 0;
    virtual void barrier() = 0;
    virtual void wait_for_rank0() { barrier(); }
    [[noreturn]] virtual void abort(int status) = 0;
    virtual void all_reduce_start(const std::vector<FloatSpan>& spans) {
        for (const FloatSpan& s : spans) all_reduce(s.data, s.count, ReduceOp::Sum);
    }
    virtual void all_reduce_wait() {}

 protected:
    int rank_ = 0, world_ = 1, local_rank_ = 0;
};

class SingleComm final : public Comm {
 public:
    const char* name() const override { return "single process"; }
    bool carries_collectives() const override { return false; }
    void all_reduce(float*, size_t, ReduceOp) override {}
    void reduce_scatter(float*, size_t, ReduceOp) override {}
    void all_gather(float*, size_t) override {}
    void broadcast(float*, size_t, int) override {}
    double all_reduce_host(double value, ReduceOp) override { return value; }
    void barrier() override {}
    [[noreturn]] void abort(int status) override { std::exit(status); }
};

// How the processes of a run find each other (the trainer's -pi -pn -pr -pg -ps -pp, as llm.c's).
struct CommOptions {
    std::string init_method;     // -pi: "mpi", "fs" (shared file) or "tcp"; empty = mpi when started by mpirun
    int num_processes = -1;      // -pn (fs, tcp): the world size; default $SLURM_NTASKS
    int process_rank = -1;       // -pr (fs, tcp): this process's rank; default $SLURM_PROCID
    int gpus_per_node = -1;      // -pg (fs, tcp): local rank = rank % this; default $SLURM_NTASKS_PER_NODE or 8
    std::string server_ip;       // -ps (tcp): rank 0's address, "HOST" or "HOST:PORT" (port default 29500)
    std::string fs_path;         // -pp (fs): a directory every process sees
};

// Was this process started by an MPI launcher (mpirun, mpiexec, srun with PMIx)?
inline bool started_by_mpi_launcher() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
        if (std::getenv(v)) return true;
    return false;
}

// The rank an MPI launcher gave this process before MPI is initialised (0
// when none did), so that an error every rank finds alike is printed once.
inline int launcher_rank() {
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
        if (const char* r = std::getenv(v)) return std::atoi(r);
    return 0;
}

// One from the launch and the options; throws one line when they ask for what
// this build cannot do. Defined with the implementations below.
inline std::unique_ptr<Comm> make_comm(const CommOptions& options);

}  // namespace knngpt

#if defined(KNNGPT_CUDA)
#include "model/comm_nccl.h"
#else
#include "model/comm_mpi.h"
#endif
