// Data-parallel training under `mpirun -np 2`, checked against one process.
//
// Two ranks of B rows each must train exactly like one process of 2B rows:
// rank r reads rows r·B..(r+1)·B-1 of the batch one process would read
// (data/dataloader.h), the attention draws name the global row
// (kernels/common/draws.h), and the gradients are summed over the ranks
// (model/gpt.h). What differs is summation order (the weight gradients of 2B
// rows are summed in two halves), so the runs agree to rounding: 10 AdamW steps,
// losses to 1e-5 relative and the final parameters to 1e-5 norm-wise, for
// ZeRO-0 and ZeRO-1, exact, knn and sampled-gradient attention, with gradient
// accumulation, for the CPU trainer (MPI) and the CUDA trainer on the emulator
// (NCCL emulated over MPI). Resuming under two ranks equals the uninterrupted
// run; a ZeRO-1 checkpoint of two ranks resumes in one process; a bad file on one
// rank, and a bad flag, end both ranks with one line. A rank frozen (SIGSTOP) or
// killed mid-run ends the other within the watchdog's time with one line; a job
// stopped and resumed as a whole goes on; a stale NCCL id file is never joined.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <sstream>
#include <vector>

#include "tests/test_util.h"
#include "tests/trainer_test_util.h"

namespace {

using knngpt_test::exists;
using knngpt_test::final_val_loss;
using knngpt_test::mpirun_prefix;
using knngpt_test::parameter_difference;
using knngpt_test::program_path;
using knngpt_test::relative_difference;
using knngpt_test::run;
using knngpt_test::run_with_threads;
using knngpt_test::RunResult;
using knngpt_test::step_losses;

constexpr int kSteps = 10;
constexpr double kTolerance = 1e-5;

std::string emu_trainer() { return knngpt_test::build_dir() + "/train_gpt_emu"; }

// gtest's ASSERT_* returns void; the helpers above return a value
#define ASSERT_EQ_OR_RETURN(a, b, msg)           \
    do {                                         \
        EXPECT_EQ(a, b) << (msg);                \
        if ((a) != (b)) return NAN;              \
    } while (0)

class ParallelTrainer : public ::testing::Test {
  protected:
    knngpt_test::TempDir tmp;
    std::string train, val;
    std::string cpu = program_path("train_gpt_cpu");

    void SetUp() override {
        if (!knngpt_test::have_mpirun()) GTEST_SKIP() << "mpirun not found: install openmpi-bin (tools/install_deps.sh)";
        if (!exists(cpu) || !exists(program_path("prepare_data")))
            GTEST_SKIP() << cpu << " or prepare_data not built (run `make test` from the repository root)";
        RunResult r = knngpt_test::prepare_text_shards(tmp, 30000);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        train = tmp.file("t_train.bin");
        val = tmp.file("t_val.bin");
    }

    // a tiny model (C 48 over 2 heads, T 24) with weight decay and a clip that bites
    std::string flags(int B, const std::string& out_dir) const {
        return " -i " + train + " -j " + val + " --layers 2 --heads 2 --channels 48 -t 24 -x " + std::to_string(kSteps) +
               " -l 3e-3 -c 0.1 --grad-clip 0.5 -v 5 -m 2 -s 0 -g 4 -b " + std::to_string(B) + " -o " + out_dir;
    }
    std::string final_model(const std::string& dir) const {
        char name[32];
        std::snprintf(name, sizeof(name), "/model_%08d.bin", kSteps);
        return tmp.file(dir) + name;
    }
    RunResult two_ranks(const std::string& program, int B, const std::string& dir, const std::string& extra) {
        return run_with_threads(mpirun_prefix(2) + program + flags(B, tmp.file(dir)) + extra, 1, tmp);
    }
    RunResult one_process(int B, const std::string& dir, const std::string& extra) {
        return run_with_threads(cpu + flags(B, tmp.file(dir)) + extra, 2, tmp);
    }

    // Two ranks of `program` with B = 2 against the CPU trainer with B = 4;
    // returns the parameter difference.
    double expect_two_ranks_equal_one(const std::string& extra, const std::string& program = "") {
        const std::string prog = program.empty() ? cpu : program;
        RunResult one = one_process(4, "one", extra);
        ASSERT_EQ_OR_RETURN(one.exit_code, 0, one.err);
        RunResult two = two_ranks(prog, 2, "two", extra);
        ASSERT_EQ_OR_RETURN(two.exit_code, 0, two.err + two.out);
        EXPECT_NE(two.out.find("| processes     | 2 ("), std::string::npos) << two.out;
        // only rank 0 prints: one header, one line a step
        auto want = step_losses(one.out), got = step_losses(two.out);
        EXPECT_EQ(want.size(), (size_t)kSteps) << one.out;
        EXPECT_EQ(got.size(), (size_t)kSteps) << two.out;
        for (size_t i = 0; i < want.size() && i < got.size(); i++)
            EXPECT_LT(relative_difference(std::stod(got[i]), std::stod(want[i])), kTolerance)
                << "step " << i + 1 << ": two ranks " << got[i] << ", one process " << want[i];
        EXPECT_LT(relative_difference(final_val_loss(two.out), final_val_loss(one.out)), kTolerance) << two.out;
        const double diff = parameter_difference(final_model("two"), final_model("one"));
        EXPECT_LT(diff, kTolerance) << "final parameters differ";
        std::printf("final loss %s (two ranks) vs %s (one process); parameters differ by %.2e norm-wise\n",
                    got.empty() ? "?" : got.back().c_str(), want.empty() ? "?" : want.back().c_str(), diff);
        return diff;
    }
};

TEST_F(ParallelTrainer, ZeroStage0EqualsOneProcessWithTwiceTheBatch) { expect_two_ranks_equal_one(" -z 0"); }

TEST_F(ParallelTrainer, ZeroStage1EqualsOneProcessWithTwiceTheBatch) {
    expect_two_ranks_equal_one(" -z 1");
    // one rank under mpirun runs the same collectives, and sums over one rank change nothing
    RunResult one_rank = run_with_threads(mpirun_prefix(1) + cpu + flags(4, tmp.file("one_rank")) + " -z 1", 2, tmp);
    ASSERT_EQ(one_rank.exit_code, 0) << one_rank.err;
    EXPECT_NE(one_rank.out.find("| processes     | 1 (MPI), ZeRO-1"), std::string::npos) << one_rank.out;
    EXPECT_EQ(parameter_difference(final_model("one_rank"), final_model("one")), 0.0);
    // the header names the stage and the collectives
    RunResult two = two_ranks(cpu, 2, "header", " -z 1 -x 1");
    EXPECT_NE(two.out.find("| processes     | 2 (MPI), ZeRO-1"), std::string::npos) << two.out;
}

TEST_F(ParallelTrainer, KnnAttentionEqualsOneProcess) {
    expect_two_ranks_equal_one(" -z 1 --attn knn --attn-k 5");
}

TEST_F(ParallelTrainer, SampledGradientsEqualOneProcess) {
    const std::string sampled = " --attn-grad sampled --attn-grad-samples 4 --attn-seed 7";
    expect_two_ranks_equal_one(" -z 0" + sampled);
    // the draws matter: another seed moves the parameters far more than the tolerance
    RunResult other = one_process(4, "other", " -z 0 --attn-grad sampled --attn-grad-samples 4 --attn-seed 8");
    ASSERT_EQ(other.exit_code, 0) << other.err;
    EXPECT_GT(parameter_difference(final_model("other"), final_model("one")), 20 * kTolerance);
}

TEST_F(ParallelTrainer, GradientAccumulationEqualsOneProcess) {
    // -d is the batch of all ranks: 2 ranks x 2 rows x 2 micro-batches = one process x 4 rows x 2
    // (ZeRO-0 sums each block's gradients during the last micro-batch's backward)
    expect_two_ranks_equal_one(" -z 0 --shuffle 1 -d 192");
    expect_two_ranks_equal_one(" -z 1 --shuffle 1 -d 192");
    // and one process of 2 rows accumulating 4 micro-batches draws the same samples too
    const std::string sampled = " --attn knn --attn-k 5 --attn-grad sampled --attn-grad-samples 4 --attn-seed 3 -d 192";
    RunResult four = one_process(4, "four", sampled);
    ASSERT_EQ(four.exit_code, 0) << four.err;
    RunResult two = one_process(2, "two_rows", sampled);
    ASSERT_EQ(two.exit_code, 0) << two.err;
    EXPECT_LT(parameter_difference(final_model("two_rows"), final_model("four")), kTolerance);
}

TEST_F(ParallelTrainer, EmulatedCudaTrainerOnTwoRanksEqualsCpuTrainer) {
    if (!exists(emu_trainer())) GTEST_SKIP() << emu_trainer() << " not built (run `make test`)";
    expect_two_ranks_equal_one(" -z 0", emu_trainer());
    RunResult header = two_ranks(emu_trainer(), 2, "header", " -z 1 -x 1");
    EXPECT_NE(header.out.find("| processes     | 2 (NCCL"), std::string::npos) << header.out;
    expect_two_ranks_equal_one(" -z 1 --attn knn --attn-k 5", emu_trainer());
}

// The bf16 build keeps a bf16 copy of the parameters for its matmuls; under
// ZeRO-1 a rank updates its shard only, and the all-gathered rest must reach
// the copy too. bf16 rounds the weights, so the runs agree less closely than in
// fp32 (measured: 7e-5 norm-wise); a copy left stale differs by 5e-2.
TEST_F(ParallelTrainer, EmulatedBf16TrainerKeepsItsWeightCopyUnderZero1) {
    const std::string bf16 = knngpt_test::build_dir() + "/train_gpt_emu_bf16";
    if (!exists(bf16)) GTEST_SKIP() << bf16 << " not built (run `make test`)";
    RunResult one = run_with_threads(bf16 + flags(4, tmp.file("one")), 2, tmp);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    RunResult two = two_ranks(bf16, 2, "two", " -z 1");
    ASSERT_EQ(two.exit_code, 0) << two.err;
    const double diff = parameter_difference(final_model("two"), final_model("one"));
    EXPECT_LT(diff, 2e-3);
    std::printf("bf16 build: two ZeRO-1 ranks against one process: parameters differ by %.2e norm-wise\n", diff);
}

// Without MPI to carry the NCCL id (Slurm without PMIx), the ranks meet through
// a shared directory or rank 0's TCP port. Each rank is given its own -pr
// (mpirun's ':' starts one command per rank; the emulated NCCL still needs
// MPI for its own transfers); the run must equal the one that meets over MPI.
TEST_F(ParallelTrainer, EmulatedCudaTrainerMeetsThroughFileAndTcp) {
    if (!exists(emu_trainer())) GTEST_SKIP() << emu_trainer() << " not built (run `make test`)";
    const std::string short_run = " -x 3 -n 3";
    RunResult over_mpi = run_with_threads(mpirun_prefix(2) + emu_trainer() + flags(2, tmp.file("mpi")) + short_run, 1, tmp);
    ASSERT_EQ(over_mpi.exit_code, 0) << over_mpi.err;
    const std::string port = std::to_string(20000 + getpid() % 30000);
    for (const std::string method : {"fs", "tcp"}) {
        SCOPED_TRACE(method);
        const std::string meet = method == "fs" ? " -pi fs -pp " + tmp.path : " -pi tcp -ps 127.0.0.1:" + port;
        auto rank_command = [&](int r) {
            return emu_trainer() + flags(2, tmp.file(method)) + short_run + meet + " -pn 2 -pr " + std::to_string(r);
        };
        RunResult r = run_with_threads(mpirun_prefix(1, 120) + rank_command(0) + " : -np 1 " + rank_command(1), 1, tmp);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_NE(r.out.find("| processes     | 2 (NCCL), ZeRO-0"), std::string::npos) << r.out;
        EXPECT_EQ(parameter_difference(tmp.file(method + "/model_00000003.bin"), tmp.file("mpi/model_00000003.bin")), 0.0);
    }
    EXPECT_FALSE(exists(tmp.file("ncclUniqueId.bin"))) << "rank 0 removes the id file once every rank has joined";
}

TEST_F(ParallelTrainer, ResumeOnTwoRanksEqualsUninterruptedRun) {
    for (const char* zero : {" -z 0", " -z 1"}) {
        SCOPED_TRACE(zero);
        const std::string extra = std::string(zero) + " -n 5 --shuffle 1";
        RunResult whole = two_ranks(cpu, 2, "whole", extra);
        ASSERT_EQ(whole.exit_code, 0) << whole.err;
        // the same run stopped after step 5: its directory without the step-10 files
        std::filesystem::remove_all(tmp.file("resumed"));
        std::filesystem::copy(tmp.file("whole"), tmp.file("resumed"));
        std::filesystem::remove(tmp.file("resumed/model_00000010.bin"));
        std::filesystem::remove(tmp.file("resumed/state_00000010.bin"));
        RunResult resumed = two_ranks(cpu, 2, "resumed", extra + " -y 1");
        ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
        EXPECT_EQ(step_losses(resumed.out).size(), 5u) << resumed.out;
        EXPECT_EQ(parameter_difference(final_model("resumed"), final_model("whole")), 0.0)
            << "resuming under two ranks must continue exactly";
        // a different world size re-shards the whole m and v of the state file
        std::filesystem::remove_all(tmp.file("single"));
        std::filesystem::copy(tmp.file("resumed"), tmp.file("single"));
        std::filesystem::remove(tmp.file("single/model_00000010.bin"));
        std::filesystem::remove(tmp.file("single/state_00000010.bin"));
        RunResult single = one_process(4, "single", extra + " -y 1");
        ASSERT_EQ(single.exit_code, 0) << single.err;
        EXPECT_LT(parameter_difference(final_model("single"), final_model("whole")), kTolerance);
        // and a micro-batch of other rows is refused: the data position would not carry over
        std::filesystem::remove(tmp.file("single/model_00000010.bin"));
        std::filesystem::remove(tmp.file("single/state_00000010.bin"));
        RunResult refused = one_process(2, "single", extra + " -y 1");
        EXPECT_EQ(refused.exit_code, 1);
        EXPECT_NE(refused.err.find("rows per micro-batch"), std::string::npos) << refused.err;
    }
}

// One line (and a newline) on stderr.
bool one_line(const std::string& err) { return !err.empty() && err.find('\n') == err.size() - 1; }

TEST_F(ParallelTrainer, BadShardOnOneRankEndsBothWithOneLine) {
    // rank 1 alone is given a shard with a wrong magic (mpirun's ':' gives each rank its own command)
    std::ifstream in(train, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes[0] ^= 0x5a;
    std::ofstream(tmp.file("bad_train.bin"), std::ios::binary) << bytes;
    std::string good = flags(2, tmp.file("bad")), bad = good;
    bad.replace(bad.find(train), train.size(), tmp.file("bad_train.bin"));
    RunResult r = run_with_threads(mpirun_prefix(1, 120) + cpu + good + " : -np 1 " + cpu + bad, 1, tmp);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(one_line(r.err)) << r.err;
    EXPECT_NE(r.err.find("train_gpt: error: rank 1: " + tmp.file("bad_train.bin") + ": bad magic"), std::string::npos)
        << r.err;
    EXPECT_FALSE(exists(tmp.file("bad/model_00000010.bin")));
}

TEST_F(ParallelTrainer, BadFlagEndsBothWithOneLine) {
    RunResult r = two_ranks(cpu, 2, "flag", " -z 2");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, "train_gpt: error: -z takes 0 or 1 (ZeRO stage)\n");
    RunResult d = two_ranks(cpu, 2, "d", " -d 100");
    EXPECT_EQ(d.exit_code, 1);
    EXPECT_TRUE(one_line(d.err)) << d.err;
    EXPECT_NE(d.err.find("B*T*processes = 2*24*2"), std::string::npos) << d.err;
}

}  // namespace

// ---- a rank that stops, freezes or dies (model/comm_watchdog.h) -------------------------

// Starts `mpirun_command` (whose ranks write to OUT), waits for its first step, sends `signal` to
// rank 1 (or, for "SUSPEND", stops both ranks for 2 s longer than the timeout and resumes
// them; for "TERM_BOTH", sends both SIGTERM), and returns mpirun's exit status, the seconds from the signal to mpirun's exit,
// and stderr. The ranks are found by OUT in their command line and `rank_variable`
// (mpirun's OMPI_COMM_WORLD_RANK, srun's SLURM_PROCID) in their environment.
struct SignalledRun {
    int exit_code = -1;
    double seconds = 0;
    std::string err;
};
SignalledRun signal_a_rank(const knngpt_test::TempDir& tmp, const std::string& mpirun_command, const std::string& out,
                           const std::string& signal, int timeout_s,
                           const std::string& rank_variable = "OMPI_COMM_WORLD_RANK") {
    const std::string script = tmp.file("signal.sh");
    std::ofstream(script) << "out=" << out << "\n"
                          << "OMP_NUM_THREADS=1 " << mpirun_command << " > $out.stdout 2> $out.stderr &\n"
                          << "mp=$!\n"
                          << "for i in $(seq 600); do grep -q '^step ' $out.stdout 2>/dev/null && break; sleep 0.1; done\n"
                          << "rank() { for p in $(pgrep -f \"$out \"); do\n"
                          << "  tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx " << rank_variable
                          << "=$1 && echo $p; done; }\n"
                          << "r0=$(rank 0); r1=$(rank 1)\n"
                          << "t0=$(date +%s.%N)\n"
                          << "if [ " << signal << " = SUSPEND ]; then kill -STOP $r0 $r1; sleep " << timeout_s + 2
                          << "; kill -CONT $r0 $r1; t0=$(date +%s.%N); elif [ " << signal
                          << " = TERM_BOTH ]; then kill -TERM $r0 $r1; else kill -" << signal << " $r1; fi\n"
                          << "wait $mp; rc=$?; t1=$(date +%s.%N)\n"
                          << "kill -KILL $r0 $r1 2>/dev/null\n"
                          << "echo $rc $(awk -v a=$t0 -v b=$t1 'BEGIN { print b - a }') > $out.result\n";
    std::system(("bash " + script).c_str());
    SignalledRun r;
    std::ifstream(out + ".result") >> r.exit_code >> r.seconds;
    r.err = knngpt_test::slurp(out + ".stderr");
    return r;
}

// A run long enough for the signal to come mid-run, with a short watchdog: the frozen or
// killed rank's peer must be gone within the timeout plus 5 s (mpirun's --timeout is
// the suite's guard against a hang).
#if defined(__SANITIZE_ADDRESS__)
constexpr int kCommTimeout = 12;  // a sanitized build runs several times slower
#else
constexpr int kCommTimeout = 3;
#endif

// Two CPU ranks with the short watchdog, `signal` sent as signal_a_rank does.
SignalledRun two_watched_ranks(const knngpt_test::TempDir& tmp, const std::string& command, const std::string& out,
                               const std::string& signal) {
    return signal_a_rank(tmp, mpirun_prefix(2, 120) + command + " -v 0 --comm-timeout " + std::to_string(kCommTimeout),
                         out, signal, kCommTimeout);
}

TEST_F(ParallelTrainer, AFrozenOrKilledRankEndsTheOtherWithinTheTimeoutWithOneLine) {
    for (const std::string signal : {"STOP", "KILL"}) {
        SCOPED_TRACE(signal);
        const std::string out = tmp.file("signalled_" + signal);
        SignalledRun r = two_watched_ranks(tmp, cpu + flags(2, out) + " -x 100000", out, signal);
        EXPECT_NE(r.exit_code, 0) << r.err;
        EXPECT_LT(r.seconds, kCommTimeout + 5.0) << r.err;
        EXPECT_TRUE(one_line(r.err)) << r.err;
        // frozen: rank 0's watchdog fires; killed: mpirun ends rank 0 inside its collective,
        // the gradients' all_reduce or the loss's, whichever rank 0 had reached
        const std::string want = signal == "STOP" ? "waited more than " + std::to_string(kCommTimeout) +
                                                        " s for the other ranks"
                                                  : "still waiting for the other ranks after a stop signal";
        EXPECT_TRUE(std::regex_search(r.err, std::regex("^train_gpt: error: rank 0: all_reduce( of a host value)? " +
                                                        want)))
            << r.err;
        if (signal == "STOP") {
            EXPECT_EQ(r.exit_code, 1);
        }
    }
}

// Under Slurm (srun -K1, MPI through PMIx), where a Slurm controller answers: the same two
// signals. srun and slurmstepd add lines of their own (a task's exit, the step cancelled);
// of the trainer's, only rank 0's: rank 1, frozen, is signalled on resumption and says
// nothing. Skipped where srun cannot start a step within seconds (no Slurm, as in CI).
TEST_F(ParallelTrainer, UnderSrunAFrozenOrKilledRankEndsTheOther) {
    RunResult probe = run_with_threads("timeout 10 srun -n 1 --mpi=pmix true", 1, tmp);
    if (probe.exit_code != 0) GTEST_SKIP() << "srun with PMIx could not start a step here: " << probe.err;
    for (const std::string signal : {"STOP", "KILL"}) {
        SCOPED_TRACE(signal);
        const std::string out = tmp.file("srun_" + signal);
        SignalledRun r = signal_a_rank(tmp,
                                       "srun -K1 --mpi=pmix -n 2 " + cpu + flags(2, out) +
                                           " -x 100000 -v 0 --comm-timeout " + std::to_string(kCommTimeout),
                                       out, signal, kCommTimeout, "SLURM_PROCID");
        EXPECT_NE(r.exit_code, 0) << r.err;
        EXPECT_LT(r.seconds, kCommTimeout + 5.0) << r.err;
        std::istringstream lines(r.err);
        std::vector<std::string> ours;
        for (std::string line; std::getline(lines, line);)
            if (line.rfind("srun: ", 0) != 0 && line.rfind("slurmstepd", 0) != 0) ours.push_back(line);
        ASSERT_EQ(ours.size(), 1u) << r.err;
        EXPECT_EQ(ours[0].rfind("train_gpt: error: rank 0: all_reduce", 0), 0u) << r.err;
    }
}

// A job stopped as a whole for longer than the timeout (a suspended job) and resumed goes
// on: the time a rank spent stopped is not waiting.
TEST_F(ParallelTrainer, AJobStoppedAndResumedAsAWholeGoesOn) {
    const std::string out = tmp.file("suspended");
    SignalledRun r = two_watched_ranks(tmp, cpu + flags(2, out) + " -x 400", out, "SUSPEND");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_TRUE(exists(out + "/model_00000400.bin"));
}

// A stop that reaches every rank (Ctrl-C, preemption) while rank 0 samples alone: the
// other rank waits for it (Comm::wait_for_rank0), and that wait is no sign of a dead peer.
// Every rank stops at the step's end; rank 0 writes the checkpoint; status 75, no error line,
// and no rank cut short by the launcher while rank 0 still writes.
TEST_F(ParallelTrainer, AStopReachingEveryRankWhileRank0SamplesIsGraceful) {
    const std::string out = tmp.file("stopped_in_sample");
    // a sample of 2000 tokens takes about a second: most of each step's time
    SignalledRun r = signal_a_rank(tmp, mpirun_prefix(2, 120) + cpu + flags(2, out) + " -x 100000 -v 0 -s 1 -g 2000",
                                   out, "TERM_BOTH", 0);
    EXPECT_EQ(r.exit_code, 75) << r.err;
    EXPECT_EQ(r.err, "");
    const std::string stdout_text = knngpt_test::slurp(out + ".stdout");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(stdout_text, m, std::regex("stopped by SIGTERM after step (\\d+) of")))
        << stdout_text;
    EXPECT_TRUE(exists(out + "/model_" + std::string(8 - m[1].str().size(), '0') + m[1].str() + ".bin"));
}

// The CUDA trainer on the emulator, meeting through a shared directory or rank 0's TCP port
// (-pi fs|tcp, no MPI launcher behind the NCCL id): a frozen rank ends the other the same way.
TEST_F(ParallelTrainer, EmulatedCudaTrainerFrozenRankEndsTheOther) {
    if (!exists(emu_trainer())) GTEST_SKIP() << emu_trainer() << " not built (run `make test`)";
    const std::string port = std::to_string(20000 + (getpid() + 7) % 30000);
    for (const std::string method : {"fs", "tcp"}) {
        SCOPED_TRACE(method);
        const std::string out = tmp.file("emu_frozen_" + method);
        const std::string meet = method == "fs" ? " -pi fs -pp " + tmp.path : " -pi tcp -ps 127.0.0.1:" + port;
        auto rank_command = [&](int r) {
            return emu_trainer() + flags(2, out) + " -x 100000 -v 0 --comm-timeout " + std::to_string(kCommTimeout) +
                   meet + " -pn 2 -pr " + std::to_string(r);
        };
        SignalledRun r = signal_a_rank(tmp, mpirun_prefix(1, 120) + rank_command(0) + " : -np 1 " + rank_command(1),
                                       out, "STOP", kCommTimeout);
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_LT(r.seconds, kCommTimeout + 5.0) << r.err;
        EXPECT_TRUE(one_line(r.err)) << r.err;
        EXPECT_NE(r.err.find("train_gpt: error: rank 0: "), std::string::npos) << r.err;
    }
}

// A rendezvous directory holding the id file of a run that crashed before its rank 0
// removed it: the ranks of a new run never join it. Rank 0 starts a second late, so
// rank 1 finds the stale file first; it waits for an answer from that file's rank 0,
// which never comes, and takes the new rank 0's file when it replaces the stale one.
TEST_F(ParallelTrainer, AStaleIdFileFromACrashedRunIsNeverJoined) {
    if (!exists(emu_trainer())) GTEST_SKIP() << emu_trainer() << " not built (run `make test`)";
    const std::string dir = tmp.file("rendezvous");
    std::filesystem::create_directories(dir);
    {
        std::ofstream stale(dir + "/ncclUniqueId.bin", std::ios::binary);
        const char magic[8] = {'K', 'N', 'N', 'G', 'P', 'T', 'I', 'D'};
        const uint64_t nonce = 424242;
        stale.write(magic, 8);
        stale.write(reinterpret_cast<const char*>(&nonce), 8);
        for (int i = 0; i < 128; i++) stale.put((char)(i * 37 + 11));  // another run's id
    }
    auto rank_command = [&](int r) {
        return emu_trainer() + flags(2, tmp.file("stale")) + " -x 3 -pi fs -pp " + dir + " -pn 2 -pr " + std::to_string(r);
    };
    RunResult r = run_with_threads(mpirun_prefix(1, 120) + "sh -c 'sleep 1; exec " + rank_command(0) + "' : -np 1 " +
                                       rank_command(1),
                                   1, tmp);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("| processes     | 2 (NCCL), ZeRO-0"), std::string::npos) << r.out;
    EXPECT_TRUE(exists(tmp.file("stale/model_00000003.bin")));
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the id file and its handshake files are removed once joined";
}
