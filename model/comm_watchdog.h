// model/comm_watchdog.h — no rank waits forever for a peer that stopped, froze or died.
//
// WatchedComm wraps any Comm (model/comm.h) and arms a deadline around each of its
// collectives. A watcher thread checks it twenty times a second:
//   - a collective still waiting after timeout_s (the trainer's --comm-timeout) prints
//     one line naming this rank and the collective and ends the process, status 1;
//   - a collective still waiting 0.3 s after a stop signal (SIGTERM, SIGINT) does the
//     same: a launcher (mpirun, srun) ends the run because another rank died, and this
//     collective can no longer complete. A stop that every rank received (Ctrl-C,
//     preemption) lets the collectives finish, and the trainer stops at the step's end;
//     the one long wait of a step, for rank 0's sample or checkpoint (wait_for_rank0),
//     is judged by the timeout alone.
// A launcher then ends the other ranks; without one (-pi fs, -pi tcp) every waiting
// rank's own watchdog does. Rank r waits min(r, 4) seconds longer than rank 0, so that
// in a small world the lowest waiting rank prints the one line and the launcher ends
// the rest before they print theirs.
//
// Only a collective's wait counts: a slow step between collectives never trips it, and
// time the process spent stopped (SIGSTOP, a suspended job) is left out, so a job
// stopped and resumed as a whole goes on. A rank that was itself stopped and is signalled
// on resumption (a launcher ending it: mpirun, or srun -K1, which waits 30 s before its
// SIGKILL) prints nothing, in the collective it was in or the next: the others have
// named the fault.
//
// While a collective is in flight, stderr goes to a holding file; when the collective
// completes (or the process exits normally) what was held is written out. When the rank
// ends because a peer is gone, the held text, the MPI library's complaints about the
// peer that vanished mid-transfer, is dropped for the one line.
//
// On a GPU the NCCL calls return once queued; the wait the watchdog sees is the one for
// a host scalar (all_reduce_host), which synchronises after them.
#pragma once
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model/comm.h"

namespace knngpt {

class WatchedComm final : public Comm {
 public:
    // line_prefix: what the program's error lines start with, naming this rank
    WatchedComm(std::unique_ptr<Comm> inner, double timeout_s, std::string line_prefix)
        : inner_(std::move(inner)), timeout_s_(timeout_s), line_prefix_(std::move(line_prefix)) {
        rank_ = inner_->rank(), world_ = inner_->world(), local_rank_ = inner_->local_rank();
        limit_ns_ = (long long)((timeout_s + std::min(rank_, 4)) * 1e9);
        real_stderr_ = dup(STDERR_FILENO);
        if (FILE* f = std::tmpfile()) hold_ = f, hold_fd_ = fileno(f);
        active_.store(this);
        static bool registered = false;
        if (!registered) registered = std::atexit([] {
                                          if (WatchedComm* c = active_.load()) c->release_stderr();
                                      }) == 0;
        watcher_ = std::thread([this] { watch(); });
    }
    ~WatchedComm() override {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        woken_.notify_one();
        watcher_.join();
        active_.store(nullptr);
        release_stderr();
        if (hold_) std::fclose(hold_);
        if (real_stderr_ >= 0) close(real_stderr_);
        inner_.reset();  // MPI_Finalize, after the watcher is gone
    }

    const char* name() const override { return inner_->name(); }
    bool carries_collectives() const override { return inner_->carries_collectives(); }
    void all_reduce(float* buf, size_t count, ReduceOp op) override {
        Armed a(*this, "all_reduce");
        inner_->all_reduce(buf, count, op);
    }
    void reduce_scatter(float* buf, size_t shard_count, ReduceOp op) override {
        Armed a(*this, "reduce_scatter");
        inner_->reduce_scatter(buf, shard_count, op);
    }
    void all_gather(float* buf, size_t shard_count) override {
        Armed a(*this, "all_gather");
        inner_->all_gather(buf, shard_count);
    }
    void broadcast(float* buf, size_t count, int root) override {
        Armed a(*this, "broadcast");
        inner_->broadcast(buf, count, root);
    }
    double all_reduce_host(double value, ReduceOp op) override {
        Armed a(*this, "all_reduce of a host value");
        return inner_->all_reduce_host(value, op);
    }
    void barrier() override {
        Armed a(*this, "barrier");
        inner_->barrier();
    }
    // the others wait here while rank 0 samples or writes: a stop signal that reaches every
    // rank meanwhile (Ctrl-C, preemption) is no sign of a dead peer, so only the timeout counts
    void wait_for_rank0() override {
        Armed a(*this, "barrier", /*patient=*/true);
        inner_->barrier();
    }
    void all_reduce_start(const std::vector<FloatSpan>& spans) override {
        Armed a(*this, "all_reduce");
        inner_->all_reduce_start(spans);
    }
    void all_reduce_wait() override {
        Armed a(*this, "all_reduce");
        inner_->all_reduce_wait();
    }
    [[noreturn]] void abort(int status) override {
        release_stderr();
        inner_->abort(status);
        _exit(status);  // not reached: abort does not return
    }

    // From a SIGINT or SIGTERM handler (async-signal-safe).
    static void note_stop_signal() { stop_signal_ns_.store(now_ns()); }
    // Where a signal handler writes a line: the process's stderr even while a collective holds it.
    static int unheld_stderr() {
        const WatchedComm* c = active_.load();
        return c && c->real_stderr_ >= 0 ? c->real_stderr_ : STDERR_FILENO;
    }

 private:
    static long long now_ns() {  // clock_gettime: async-signal-safe
        timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
    }

    // a collective in flight: its start (0: none), its name, stderr held
    struct Armed {
        WatchedComm& c;
        Armed(WatchedComm& comm, const char* what, bool patient = false) : c(comm) {
            c.hold_stderr();
            c.what_.store(what);
            c.patient_.store(patient);
            c.started_ns_.store(now_ns());
        }
        ~Armed() {
            c.started_ns_.store(0);
            c.release_stderr();
        }
    };

    void hold_stderr() {
        if (hold_fd_ < 0 || real_stderr_ < 0) return;
        std::fflush(stderr);
        dup2(hold_fd_, STDERR_FILENO);
    }
    // stderr back to where it was, and what was held written there
    void release_stderr() {
        if (hold_fd_ < 0 || real_stderr_ < 0) return;
        std::fflush(stderr);
        dup2(real_stderr_, STDERR_FILENO);
        const off_t held = lseek(hold_fd_, 0, SEEK_END);
        if (held <= 0) return;
        char buf[4096];
        for (off_t at = 0; at < held;) {
            const ssize_t n = pread(hold_fd_, buf, sizeof(buf), at);
            if (n <= 0) break;
            if (write(STDERR_FILENO, buf, (size_t)n) < 0) break;
            at += n;
        }
        if (ftruncate(hold_fd_, 0) != 0) {}
        lseek(hold_fd_, 0, SEEK_SET);
    }
    // the one line (none if empty), on the real stderr, and the end of this process
    [[noreturn]] void stop(const std::string& line) {
        if (real_stderr_ >= 0) dup2(real_stderr_, STDERR_FILENO);  // what was held is dropped
        if (!line.empty()) {
            fprintf(stderr, "%s%s %s\n", line_prefix_.c_str(), what_.load(), line.c_str());
            fflush(stderr);
        }
        _exit(1);
    }

    void watch() {
        long long last_poll = now_ns(), seen_start = 0, stopped_in_wait = 0, resumed_at = 0;
        std::unique_lock<std::mutex> lock(mutex_);
        while (!woken_.wait_for(lock, std::chrono::milliseconds(kPollMs), [this] { return stopping_; })) {
            const long long now = now_ns(), started = started_ns_.load(), signalled = stop_signal_ns_.load();
            const long long gap = now - last_poll - kPollMs * 1000000LL;  // > 1 s: this process was stopped
            last_poll = now;
            if (started != seen_start) seen_start = started, stopped_in_wait = 0;
            if (gap > kStoppedGapNs) {
                resumed_at = now;
                if (started != 0) stopped_in_wait += gap;
            }
            if (started == 0) continue;
            // signalled on resumption: a launcher ends this rank, the one that was stopped
            const bool ended_after_stop = signalled != 0 && resumed_at != 0 && signalled - resumed_at < 2 * kStoppedGapNs;
            if (ended_after_stop && now - std::max(started, signalled) > kAfterSignalNs) stop("");
            if (signalled > started && now - signalled > kAfterSignalNs && !patient_.load())
                stop("still waiting for the other ranks after a stop signal (one stopped or died)");
            if (now - started - stopped_in_wait >= limit_ns_) {
                char limit[32];
                std::snprintf(limit, sizeof(limit), "%g", timeout_s_);
                stop(std::string("waited more than ") + limit +
                     " s for the other ranks (one stopped, froze or died; --comm-timeout sets the limit)");
            }
        }
    }

    static constexpr int kPollMs = 50;
    static constexpr long long kStoppedGapNs = 1'000'000'000;
    static constexpr long long kAfterSignalNs = 300'000'000;
    // constant-initialised and lock-free: safe to store from a signal handler
    static inline std::atomic<long long> stop_signal_ns_{0};
    static inline std::atomic<WatchedComm*> active_{nullptr};  // for the exit handler

    std::unique_ptr<Comm> inner_;
    double timeout_s_ = 0;
    std::string line_prefix_;
    long long limit_ns_ = 0;
    int real_stderr_ = -1;  // stderr as the process started
    FILE* hold_ = nullptr;  // the holding file (unlinked), and its descriptor
    int hold_fd_ = -1;
    std::atomic<long long> started_ns_{0};
    std::atomic<const char*> what_{""};
    std::atomic<bool> patient_{false};  // a wait for rank 0's own work: the timeout alone counts
    std::mutex mutex_;
    std::condition_variable woken_;
    bool stopping_ = false;
    std::thread watcher_;
};

// The comm a run uses: collectives watched when they are carried between processes.
// `line_prefix(rank)` is what the program's error lines start with.
inline std::unique_ptr<Comm> watch_collectives(std::unique_ptr<Comm> comm, double timeout_s,
                                               std::string (*line_prefix)(int rank)) {
    if (!comm->carries_collectives() || timeout_s <= 0) return comm;
    const int rank = comm->rank();
    return std::make_unique<WatchedComm>(std::move(comm), timeout_s, line_prefix(rank));
}

}  // namespace knngpt
