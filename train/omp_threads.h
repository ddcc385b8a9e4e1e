// train/omp_threads.h — how many OpenMP threads the trainer runs, and how they wait.
//
// Wait policy. libgomp lets a thread that waits at a barrier spin about 300,000 times
// (milliseconds) before it sleeps. When other processes hold the cores, the thread it waits
// for is often descheduled, and the spinning thread burns the slice that thread needed: the
// baby config ran 59x slower than idle beside two busy processes. Unless the user chose a
// policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT), the trainer asks for a short spin and executes
// itself again once, since libgomp reads its settings when it is loaded, before main.
//
// Thread count. Unless OMP_NUM_THREADS is set, the trainer leaves the cores other processes
// use to them: a team whose threads share cores with busy processes waits at every barrier
// for a descheduled partner, and runs slower than fewer threads with a core each. At start
// from the runnable count in /proc/loadavg, then every kLoadWindowS seconds from the busy
// time of the cores this process may run on (/proc/stat) less its own CPU time. Results
// do not depend on the count (every op splits its work by shape: kernels/cpu/parallel.h,
// sgemm_blocks.h), so following the load changes speed only.
#pragma once

#include <omp.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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

// The thread count that leaves `others` cores (what other processes use) of `cores` to them.
inline int threads_beside(int cores, double others) {
    return std::clamp((int)std::lround(cores - others), 1, std::max(cores, 1));
}

// Seconds of wall time, of busy time on the cores in `cores` (all of /proc/stat's CPU time
// but idle and iowait), and of this process's CPU time; ok false where /proc/stat is missing.
struct CoreTimes {
    double wall_s = 0, busy_s = 0, own_s = 0;
    bool ok = false;
};

inline double clock_seconds(clockid_t clock) {
    timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

inline CoreTimes read_core_times(const cpu_set_t& cores) {
    CoreTimes t;
    t.wall_s = clock_seconds(CLOCK_MONOTONIC);
    t.own_s = clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
    std::ifstream stat("/proc/stat");
    const double tick_s = 1.0 / (double)sysconf(_SC_CLK_TCK);
    std::string line;
    while (std::getline(stat, line) && line.compare(0, 3, "cpu") == 0) {
        int cpu = -1;
        unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
        if (std::sscanf(line.c_str(), "cpu%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &user, &nice, &system,
                        &idle, &iowait, &irq, &softirq, &steal) < 2 ||
            cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &cores))
            continue;  // the all-CPU line, or a CPU this process may not use
        t.busy_s += tick_s * (double)(user + nice + system + irq + softirq + steal);
        t.ok = true;
    }
    return t;
}

// Cores the other processes used between two readings.
inline double others_cores(const CoreTimes& before, const CoreTimes& after) {
    const double wall = after.wall_s - before.wall_s;
    if (!before.ok || !after.ok || wall <= 0) return 0;
    return std::max(0.0, (after.busy_s - before.busy_s - (after.own_s - before.own_s)) / wall);
}

// Runnable threads of other processes now: /proc/loadavg's count less this process's.
inline int others_runnable_now() {
    int running = 0;  // the fourth field, "running/total"
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
        if (std::fscanf(f, "%*f %*f %*f %d", &running) != 1) running = 0;
        std::fclose(f);
    }
    return std::max(0, running - 1);  // called before the OpenMP team exists: this thread alone
}

class ThreadsFollowingLoad {
 public:
    static constexpr double kLoadWindowS = 0.5;

    // Call early in main, before any parallel region. Follows the load unless
    // OMP_NUM_THREADS chose the count.
    ThreadsFollowingLoad() {
        cores_ = threads_ = omp_get_max_threads();
        following_ = std::getenv("OMP_NUM_THREADS") == nullptr && cores_ > 1 &&
                     sched_getaffinity(0, sizeof(affinity_), &affinity_) == 0;
        if (!following_) return;
        // the runnable count is the whole machine's: a fair first guess only where this
        // process may run on every core
        if (CPU_COUNT(&affinity_) == (int)sysconf(_SC_NPROCESSORS_ONLN)) set(threads_beside(cores_, others_runnable_now()));
        last_ = read_core_times(affinity_);
    }

    // Between steps, outside any parallel region: at most every kLoadWindowS seconds, the
    // count the other processes' use of the cores leaves. Returns true when it changed.
    bool update() {
        if (!following_ || clock_seconds(CLOCK_MONOTONIC) - last_.wall_s < kLoadWindowS) return false;
        const CoreTimes now = read_core_times(affinity_);
        others_ = others_cores(last_, now);
        last_ = now;
        const int before = threads_;
        set(threads_beside(cores_, others_));
        return threads_ != before;
    }

    bool following() const { return following_; }
    int threads() const { return threads_; }
    int cores() const { return cores_; }
    double others() const { return others_; }  // cores the others used in the last window

 private:
    void set(int threads) {
        if (threads != threads_) omp_set_num_threads(threads);
        threads_ = threads;
    }

    int cores_ = 1, threads_ = 1;
    bool following_ = false;
    cpu_set_t affinity_{};
    CoreTimes last_;
    double others_ = 0;
};

// The header's threads row: how many, where the count and the wait policy came from.
inline std::string omp_threads_description(const ThreadsFollowingLoad& threads, int world) {
    std::string s = std::to_string(threads.cores()) + (world > 1 ? " per process" : "");
    if (std::getenv("OMP_NUM_THREADS")) s += " (OMP_NUM_THREADS)";
    else if (threads.following()) s += " (every core, fewer while busy)";
    else s += " (every core)";
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    if (policy) s += std::string(", OMP_WAIT_POLICY ") + policy;
    else if (spin && std::getenv(kSetByTrainer)) s += std::string(", spin ") + spin + " then sleep";
    else if (spin) s += std::string(", GOMP_SPINCOUNT ") + spin;
    else s += ", libgomp's default wait";
    return s;
}

}  // namespace knngpt
