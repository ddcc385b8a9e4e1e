// model/comm_watchdog.h — no rank waits forever for a peer that stopped, froze or died.
//
// WatchedComm wraps any Comm (model/comm.h) and arms a deadline around each of its
// collectives. A watcher thread checks it ten times a second; a collective still
// waiting after timeout_s (the trainer's --comm-timeout) prints one line naming this
// rank and the collective, and ends the process with status 1 at once (_exit: the main
// thread is inside the collective, so nothing else can run). A launcher (mpirun, srun)
// then ends the other ranks; without one (-pi fs, -pi tcp) every waiting rank's own
// watchdog does. Rank r waits min(r, 4) seconds longer than rank 0, so that in a small
// world the lowest waiting rank prints the one line and the launcher ends the rest
// before they print theirs. A collective's time counts only its wait: a slow step
// between collectives never trips it.
//
// On a GPU the NCCL calls return once queued; the wait the watchdog sees is the one
// for a host scalar (all_reduce_host), which synchronises after them.
#pragma once
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "model/comm.h"

namespace knngpt {

class WatchedComm final : public Comm {
 public:
    WatchedComm(std::unique_ptr<Comm> inner, double timeout_s) : inner_(std::move(inner)) {
        rank_ = inner_->rank(), world_ = inner_->world(), local_rank_ = inner_->local_rank();
        const double stagger_s = std::min(rank_, 4);
        limit_ns_ = (long long)((timeout_s + stagger_s) * 1e9);
        timeout_s_ = timeout_s;
        watcher_ = std::thread([this] {
            sigset_t cont;  // SIGCONT's handler runs on the main thread, before it goes on
            sigemptyset(&cont);
            sigaddset(&cont, SIGCONT);
            pthread_sigmask(SIG_BLOCK, &cont, nullptr);
            watch();
        });
        active_.store(this);
    }
    ~WatchedComm() override {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        woken_.notify_one();
        watcher_.join();
        active_.store(nullptr);
        give_stderr_back();
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
    // From a SIGINT or SIGTERM handler (async-signal-safe). When a launcher ends a run
    // because one rank died, the others are inside a collective that can no longer
    // complete; one still waiting kAfterSignalNs after the signal says so and exits,
    // while a stop every rank received (Ctrl-C, preemption) lets collectives finish.
    static void note_stop_signal() { signal_ns().store(now_ns()); }

    // From a SIGCONT handler (async-signal-safe): a rank resumed inside a collective holds
    // its stderr (to /dev/null) until that collective completes. A frozen rank that the
    // launcher resumes only to end it would otherwise print its MPI library's complaints
    // about the peers that have gone; a job resumed as a whole completes the collective
    // and gets its stderr back at once.
    static void note_resumed() {
        WatchedComm* c = active().load();
        if (!c || c->started_ns_.load() == 0 || c->held_stderr_.load() >= 0) return;
        const int saved = dup(STDERR_FILENO);
        const int null_fd = open("/dev/null", O_WRONLY);
        if (saved < 0 || null_fd < 0) {
            if (saved >= 0) close(saved);
            if (null_fd >= 0) close(null_fd);
            return;
        }
        dup2(null_fd, STDERR_FILENO);
        close(null_fd);
        c->held_stderr_.store(saved);
    }

    [[noreturn]] void abort(int status) override {
        inner_->abort(status);
        _exit(status);  // not reached: abort does not return
    }
    void all_reduce_start(const std::vector<FloatSpan>& spans) override {
        Armed a(*this, "all_reduce");
        inner_->all_reduce_start(spans);
    }
    void all_reduce_wait() override {
        Armed a(*this, "all_reduce");
        inner_->all_reduce_wait();
    }

 private:
    static long long now_ns() {  // clock_gettime: async-signal-safe
        timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
    }
    // a collective in progress: its start (0: none) and its name
    struct Armed {
        WatchedComm& c;
        Armed(WatchedComm& comm, const char* what) : c(comm) {
            c.what_.store(what);
            c.started_ns_.store(now_ns());
        }
        ~Armed() { c.started_ns_.store(0); }
    };

    void watch() {
        // time this process spent stopped (SIGSTOP, a suspended job) is not waiting: the
        // watcher sees it as a gap between its polls and leaves it out
        long long last_poll = now_ns(), seen_start = 0, stopped_in_wait = 0, resumed_at = 0;
        std::unique_lock<std::mutex> lock(mutex_);
        while (!woken_.wait_for(lock, std::chrono::milliseconds(kPollMs), [this] { return stopping_; })) {
            const long long now = now_ns(), started = started_ns_.load(), signalled = signal_ns().load();
            const long long gap = now - last_poll - kPollMs * 1000000LL;
            last_poll = now;
            if (started != seen_start) seen_start = started, stopped_in_wait = 0, give_stderr_back();
            if (gap > kStoppedGapNs) {
                resumed_at = now;
                if (started != 0) stopped_in_wait += gap;
            }
            if (started == 0) continue;
            if (signalled > started && now - signalled > kAfterSignalNs) {
                // the launcher ends the run, and this collective will not complete: a peer is gone.
                // A rank that was itself stopped just before is the one the others reported: no line.
                if (resumed_at != 0 && signalled - resumed_at < kStoppedGapNs * 2) _exit(1);
                give_stderr_back();
                fprintf(stderr,
                        "train_gpt: error: rank %d: %s still waiting for the other ranks after a stop signal (one "
                        "stopped or died)\n",
                        rank_, what_.load());
                fflush(stderr);
                _exit(1);
            }
            if (now - started - stopped_in_wait < limit_ns_) continue;
            give_stderr_back();
            fprintf(stderr,
                    "train_gpt: error: rank %d: %s waited more than %g s for the other ranks (one stopped, froze or "
                    "died; --comm-timeout sets the limit)\n",
                    rank_, what_.load(), timeout_s_);
            fflush(stderr);
            _exit(1);
        }
    }

    void give_stderr_back() {
        const int saved = held_stderr_.exchange(-1);
        if (saved < 0) return;
        dup2(saved, STDERR_FILENO);
        close(saved);
    }
    static std::atomic<WatchedComm*>& active() {
        return active_;
    }

    static constexpr int kPollMs = 50;
    static constexpr long long kStoppedGapNs = 1'000'000'000;  // a poll 1 s late: the process was stopped
    static constexpr long long kAfterSignalNs = 300'000'000;  // 0.3 s
    // constant-initialised, lock-free: safe to store from a signal handler
    static inline std::atomic<long long> stop_signal_ns_{0};
    static inline std::atomic<WatchedComm*> active_{nullptr};  // the process's watched comm, for the handlers
    static std::atomic<long long>& signal_ns() { return stop_signal_ns_; }

    std::unique_ptr<Comm> inner_;
    long long limit_ns_ = 0;
    double timeout_s_ = 0;
    std::atomic<long long> started_ns_{0};
    std::atomic<const char*> what_{""};
    std::atomic<int> held_stderr_{-1};  // stderr's descriptor while a resumed rank holds it
    std::mutex mutex_;
    std::condition_variable woken_;
    bool stopping_ = false;
    std::thread watcher_;
};

// The comm a run uses: collectives watched when there is more than one process.
inline std::unique_ptr<Comm> watch_collectives(std::unique_ptr<Comm> comm, double timeout_s) {
    if (!comm->carries_collectives() || timeout_s <= 0) return comm;
    return std::make_unique<WatchedComm>(std::move(comm), timeout_s);
}

}  // namespace knngpt
