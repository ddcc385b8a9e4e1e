// train/omp_wait.h — how the trainer's OpenMP threads wait, and where their count came from.
//
// libgomp lets a thread that waits at a barrier spin about 300,000 times (milliseconds)
// before it sleeps. When other processes hold the cores, the thread it waits for is often
// descheduled, and the spinning thread burns the slice that thread needed: the baby config
// ran 59x slower than idle beside two busy processes (tools/bench_shared_cores.sh). Unless
// the user chose a policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT), the trainer asks for a short
// spin (kTrainerSpinCount) and executes itself again once, since libgomp reads its
// settings when it is loaded, before main. Spin counts do not change any result.
#pragma once

#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace knngpt {

// measured (train/README.md, "On shared cores"): idle, the baby config's steps as fast as
// with libgomp's 300,000; beside two busy processes any count from 1,000 to 10,000 gave
// 60-210 ms a step where 300,000 gave 1,272 ms
inline constexpr const char* kTrainerSpinCount = "10000";
inline constexpr const char* kSetByTrainer = "KNNGPT_OMP_WAIT";  // marks the trainer's own choice

// Call first in main. Returns only if the wait policy is already settled (the user's, or
// ours after the re-execution) or the re-execution failed (then libgomp's default holds).
inline void settle_omp_wait_policy(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
    setenv("GOMP_SPINCOUNT", kTrainerSpinCount, 1);
    setenv(kSetByTrainer, "1", 1);
    execv("/proc/self/exe", argv);
    unsetenv("GOMP_SPINCOUNT");  // could not re-execute: say so in the header
    unsetenv(kSetByTrainer);
}

// The header's threads row: how many, where the count and the wait policy came from.
inline std::string omp_threads_description(int world) {
    std::string s = std::to_string(omp_get_max_threads()) + (world > 1 ? " per process" : "");
    s += std::getenv("OMP_NUM_THREADS") ? " (OMP_NUM_THREADS)" : " (every core)";
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    if (policy) s += std::string(", OMP_WAIT_POLICY ") + policy;
    else if (spin && std::getenv(kSetByTrainer)) s += std::string(", spin ") + spin + " then sleep";
    else if (spin) s += std::string(", GOMP_SPINCOUNT ") + spin;
    else s += ", libgomp's default wait";
    return s;
}

}  // namespace knngpt
