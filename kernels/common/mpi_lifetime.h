// kernels/common/mpi_lifetime.h — MPI_Init and MPI_Finalize, once each, for
// every MPI user of knngpt (the CPU trainer's communicator, the NCCL one, the
// emulated NCCL and the tests that run as several ranks).
//
// Under AddressSanitizer (make test SANITIZE=1) they also keep LeakSanitizer
// to knngpt's own memory. OpenMPI loads components while it starts, tries
// them, unloads (dlclose) the ones it does not keep, and unloads the rest
// while finalizing; what those still hold at exit is reported as leaked from
// "<unknown module>", which no suppression can name. So MPI_Init runs with the
// leak checker paused (its allocations are OpenMPI's), and the leak check runs
// just before MPI_Finalize instead of at exit, while the kept components are
// loaded: what they hold is then either reachable or named by the libraries
// of tools/sanitize.supp, and everything knngpt allocated is checked as it
// would be at exit. (Only MPI_Finalize and the exit run after the check.)
#pragma once

#if defined(KNNGPT_MPI)
#include <mpi.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace knngpt {

// MPI_Init_thread(required), unless MPI is initialised already; MPI's status.
inline int mpi_init_once(int required, int* provided) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return MPI_Query_thread(provided);
#if defined(__SANITIZE_ADDRESS__)
    __lsan_disable();
#endif
    const int status = MPI_Init_thread(nullptr, nullptr, required, provided);
#if defined(__SANITIZE_ADDRESS__)
    __lsan_enable();
#endif
    return status;
}

inline void mpi_finalize_once() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
#if defined(__SANITIZE_ADDRESS__)
    __lsan_do_leak_check();
#endif
    MPI_Finalize();
}

}  // namespace knngpt
#endif
