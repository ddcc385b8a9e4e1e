// tests/test_reliability.cpp — what a run survives, end to end through the
// train_gpt_cpu program: a trainer killed (SIGKILL) at random points, during
// checkpoint writes among them, resumes each time from a complete checkpoint
// and ends in the uninterrupted run's model, bit for bit; a flipped bit in a
// saved weight or state is refused with a line naming the file (and loaded
// with --verify-checksum 0); a full disk (RLIMIT_FSIZE) stops with one line and
// leaves the previous checkpoint intact; SIGTERM leaves a checkpoint from which
// -y 1 prints the same losses as the uninterrupted run, on one process and on
// two ranks signalled one at a time; an injected NaN is named with its step and
// layer (and skipped with --skip-nonfinite 1); -nk / -nm keep exactly the files
// llm.c's rules keep. The checksum itself is checked against `xxhsum`.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "model/checkpoint.h"
#include "model/checkpoint_dir.h"
#include "model/checksum.h"
#include "model/gpt.h"
#include "tests/test_util.h"
#include "tests/trainer_test_util.h"

namespace {

using namespace knngpt_test;  // run, slurp, step_losses, program_path, exists, RunResult, TempDir

// One line (and a newline).
bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; }

// A program started in the background: `sh -c "exec CMD"`, so the pid is the
// program's own, with stdout and stderr to files and `threads` OpenMP threads
// (one for a test that depends on timing: on busy cores two threads wait a time
// slice at each of a step's barriers). fsize_limit > 0: RLIMIT_FSIZE of that
// many bytes, SIGXFSZ ignored, so that a write past it fails with EFBIG as on a
// full disk.
struct Child {
    pid_t pid = -1;
    std::string out, err;
};

Child spawn(const std::string& cmd, const std::string& out, const std::string& err, int threads = 2,
            rlim_t fsize_limit = 0) {
    Child c{-1, out, err};
    // the files go before the fork: a reader must never see a previous child's output
    std::remove(out.c_str());
    std::remove(err.c_str());
    fflush(nullptr);
    c.pid = fork();
    if (c.pid == 0) {
        if (fsize_limit > 0) {
            struct rlimit limit = {fsize_limit, fsize_limit};
            setrlimit(RLIMIT_FSIZE, &limit);
            signal(SIGXFSZ, SIG_IGN);
        }
        setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
        int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), (char*)nullptr);
        _exit(127);
    }
    return c;
}

// The exit status, or 128 + the signal that ended it (as a shell reports it).
int wait_for(const Child& c) {
    int status = 0;
    waitpid(c.pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Waits until file holds `text` (true) or the child ended or `seconds` passed (false).
bool wait_for_text(const Child& c, const std::string& file, const std::string& text, double seconds) {
    auto start = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
        if (slurp(file).find(text) != std::string::npos) return true;
        int status;
        if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) != 0) return slurp(file).find(text) != std::string::npos;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
}

std::set<std::string> files_in(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
}

std::set<std::string> checkpoint_files(const std::vector<int>& steps) {
    std::set<std::string> names = {"main.log"};
    for (int s : steps)
        for (const char* kind : {"model", "state"}) {
            char name[40];
            snprintf(name, sizeof(name), "%s_%08d.bin", kind, s);
            names.insert(name);
        }
    return names;
}

std::string model_at(const std::string& dir, int step) { return knngpt::checkpoint_path(dir, "model", step); }
std::string state_at(const std::string& dir, int step) { return knngpt::checkpoint_path(dir, "state", step); }

void flip_bit(const std::string& path, long offset, int bit) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c;
    f.get(c);
    c ^= (char)(1 << bit);
    f.seekp(offset);
    f.put(c);
}

class Reliability : public knngpt_test::CpuTrainerTest {};

}  // namespace

// ---------------------------------------------------------------------------
// Checksums

// XXH64 as written here against the xxHash project's own program, on lengths
// around every branch of the definition (0, < 4, < 8, < 32, stripes, tails)
// and fed in pieces.
TEST(Checksum, EqualsXxhsum) {
    if (std::system("command -v xxhsum > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "xxhsum not found: install Debian's xxhash (tools/install_deps.sh --tests)";
    knngpt_test::TempDir tmp;
    std::mt19937 rng(5);
    for (size_t n : {0, 1, 3, 4, 5, 8, 11, 31, 32, 33, 63, 64, 65, 100, 1023, 1 << 20, (1 << 20) + 29}) {
        std::vector<unsigned char> bytes(n);
        for (auto& b : bytes) b = (unsigned char)rng();
        std::ofstream(tmp.file("f"), std::ios::binary).write((const char*)bytes.data(), n);
        RunResult r = run("xxhsum -H1 " + tmp.file("f"), tmp);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const std::string theirs = r.out.substr(0, 16);
        EXPECT_EQ(knngpt::hex64(knngpt::xxh64(bytes.data(), n)), theirs) << n << " bytes";
        knngpt::Xxh64 pieces;  // the same bytes in three uneven pieces
        const size_t a = n / 7, b = n / 2;
        pieces.update(bytes.data(), a);
        pieces.update(bytes.data() + a, b - a);
        pieces.update(bytes.data() + b, n - b);
        EXPECT_EQ(knngpt::hex64(pieces.digest()), theirs) << n << " bytes in pieces";
    }
}

// Our model file is llm.c's: the header slots llm.c reads, the parameters right
// after the 256 ints, nothing else but the checksum slots; a file without them
// (as llm.c writes) loads unchecked.
TEST(Checksum, ModelFileKeepsLlmcsLayout) {
    knngpt_test::TempDir tmp;
    knngpt::GPTConfig c;
    c.max_seq_len = 16, c.vocab_size = 200, c.padded_vocab_size = 256, c.num_layers = 2, c.num_heads = 2, c.channels = 16;
    const std::vector<float> params = knngpt::gpt_random_init(c, 3);
    const uint64_t sum = knngpt::write_model_file(tmp.file("m.bin"), c, params);
    const std::string bytes = slurp(tmp.file("m.bin"));
    ASSERT_EQ(bytes.size(), 256 * 4 + params.size() * 4);
    std::vector<int> header(256);
    std::memcpy(header.data(), bytes.data(), 1024);
    const std::vector<int> llmc = {20240326, 3, 16, 200, 2, 2, 16, 256};
    for (int i = 0; i < 8; i++) EXPECT_EQ(header[i], llmc[i]) << "slot " << i;
    for (int i = 8; i < 256; i++)
        if (i < knngpt::MODEL_CHECKSUM_SLOT || i > knngpt::MODEL_CHECKSUM_SLOT + 3) {
            EXPECT_EQ(header[i], 0) << "slot " << i;
        }
    EXPECT_EQ(std::memcmp(bytes.data() + 1024, params.data(), params.size() * 4), 0);
    EXPECT_EQ(sum, knngpt::xxh64(params.data(), params.size() * 4));
    knngpt::ModelFile back = knngpt::read_model_file(tmp.file("m.bin"));
    EXPECT_TRUE(back.has_checksum);
    EXPECT_EQ(back.checksum, sum);
    // an llm.c file: the checksum slots zero; a flipped weight then goes unnoticed, as before
    std::string plain = bytes;
    std::memset(&plain[4 * knngpt::MODEL_CHECKSUM_SLOT], 0, 16);
    plain[2000] ^= 1;
    std::ofstream(tmp.file("llmc.bin"), std::ios::binary) << plain;
    knngpt::ModelFile old = knngpt::read_model_file(tmp.file("llmc.bin"));
    EXPECT_FALSE(old.has_checksum);
    EXPECT_EQ(old.params.size(), params.size());
}

TEST_F(Reliability, BitFlipInASavedWeightIsRefusedWithTheFileNamed) {
    const std::string dir = tmp.file("run");
    const std::string cmd = base() + " -x 4 -n 2 -o " + dir;
    RunResult first = run(cmd, tmp);
    ASSERT_EQ(first.exit_code, 0) << first.err;
    std::filesystem::remove(model_at(dir, 4));
    std::filesystem::remove(state_at(dir, 4));
    const std::string model = model_at(dir, 2), state = state_at(dir, 2), good_model = slurp(model);
    // one bit of one weight (wpe's, a few hundred floats in): the file still parses
    flip_bit(model, 1024 + 4 * 9000 + 1, 3);
    RunResult refused = run(cmd + " -y 1", tmp);
    EXPECT_EQ(refused.exit_code, 1);
    EXPECT_TRUE(one_line(refused.err)) << refused.err;
    EXPECT_NE(refused.err.find(model + ": checksum mismatch"), std::string::npos) << refused.err;
    EXPECT_FALSE(exists(model_at(dir, 4)));
    RunResult as_init = run(base() + " -x 1 -e " + model, tmp);
    EXPECT_EQ(as_init.exit_code, 1);
    EXPECT_NE(as_init.err.find(model + ": checksum mismatch"), std::string::npos) << as_init.err;
    // the flag loads it (a file edited elsewhere)
    RunResult accepted = run(cmd + " -y 1 --verify-checksum 0", tmp);
    EXPECT_EQ(accepted.exit_code, 0) << accepted.err;
    EXPECT_TRUE(exists(model_at(dir, 4)));
    std::filesystem::remove(model_at(dir, 4));
    std::filesystem::remove(state_at(dir, 4));
    // a bit of the AdamW state, and one of the state's header
    std::ofstream(model, std::ios::binary) << good_model;
    const std::string good_state = slurp(state);
    for (long offset : {1024L + 4 * 500 + 2, 4L * 10}) {
        std::ofstream(state, std::ios::binary) << good_state;
        flip_bit(state, offset, 6);
        RunResult r = run(cmd + " -y 1", tmp);
        EXPECT_EQ(r.exit_code, 1) << offset;
        EXPECT_TRUE(one_line(r.err)) << r.err;
        EXPECT_NE(r.err.find(state + ": checksum mismatch"), std::string::npos) << r.err;
    }
    // a valid model file of another run beside this state: the pair is refused
    std::ofstream(state, std::ios::binary) << good_state;
    RunResult other = run(base() + " -x 2 --seed 9 -o " + tmp.file("other"), tmp);
    ASSERT_EQ(other.exit_code, 0) << other.err;
    std::filesystem::copy_file(model_at(tmp.file("other"), 2), model, std::filesystem::copy_options::overwrite_existing);
    RunResult mixed = run(cmd + " -y 1", tmp);
    EXPECT_EQ(mixed.exit_code, 1);
    EXPECT_TRUE(one_line(mixed.err)) << mixed.err;
    EXPECT_NE(mixed.err.find(state + ": belongs to another model file"), std::string::npos) << mixed.err;
    // and the intact pair resumes
    std::ofstream(model, std::ios::binary) << good_model;
    RunResult resumed = run(cmd + " -y 1", tmp);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
}

// A write that fails part-way (RLIMIT_FSIZE, the way a full disk fails it):
// one line naming the file and the reason, exit status 1, no temporary file,
// the new step absent and the previous checkpoint unchanged.
TEST_F(Reliability, DiskFullStopsWithOneLineAndKeepsThePreviousCheckpoint) {
    const std::string dir = tmp.file("run");
    const std::string cmd = base() + " -x 4 -n 2 -o " + dir;
    RunResult first = run(base() + " -x 2 -n 2 -o " + dir, tmp);  // checkpoint 2 only
    ASSERT_EQ(first.exit_code, 0) << first.err;
    const std::string model2 = slurp(model_at(dir, 2)), state2 = slurp(state_at(dir, 2));
    ASSERT_EQ(state2.size(), 2 * model2.size() - 1024);
    // below the model file's size: the model write fails; between it and the state's: the state write
    for (rlim_t limit : {(rlim_t)model2.size() / 2, (rlim_t)model2.size() + 4096}) {
        const bool model_fails = limit < model2.size();
        SCOPED_TRACE(model_fails ? "model write fails" : "state write fails");
        Child c = spawn(cmd + " -y 1", tmp.file("out"), tmp.file("err"), 2, limit);
        EXPECT_EQ(wait_for(c), 1);
        const std::string err = slurp(c.err);
        EXPECT_TRUE(one_line(err)) << err;
        const std::string failed = model_fails ? model_at(dir, 4) : state_at(dir, 4);
        EXPECT_NE(err.find(failed + ": write failed (File too large)"), std::string::npos) << err;
        EXPECT_EQ(slurp(model_at(dir, 2)), model2);
        EXPECT_EQ(slurp(state_at(dir, 2)), state2);
        EXPECT_EQ(files_in(dir), checkpoint_files({2})) << "only checkpoint 2 and the log";
    }
    RunResult resumed = run(cmd + " -y 1", tmp);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("(from step 2)"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Retention: -nk / -nm keep exactly what llm.c's rules keep

TEST_F(Reliability, RetentionKeepsExactlyTheExpectedCheckpoints) {
    struct Case {
        std::string flags;
        std::vector<int> kept;
    };
    const std::vector<Case> cases = {
        {"-x 10 -n 1 -nk 3 -nm 4", {4, 8, 9, 10}},  // the last 3, and the majors 4 and 8
        {"-x 12 -n 2 -nk 2 -nm 4", {4, 8, 10, 12}},  // llm.c's own arithmetic keeps the same
        {"-x 10 -n 3 -nk 2", {9, 10}},               // the final step, not a multiple of -n, counts as one
        {"-x 6 -n 2", {2, 4, 6}},                    // no -nk: every checkpoint
        {"-x 5 -n 1 -nk 1 -nm 2", {2, 4, 5}},
    };
    for (const Case& c : cases) {
        const std::string dir = tmp.file("run_" + std::to_string(&c - cases.data()));
        RunResult r = run(base() + " " + c.flags + " -o " + dir, tmp);
        ASSERT_EQ(r.exit_code, 0) << c.flags << ": " << r.err;
        EXPECT_EQ(files_in(dir), checkpoint_files(c.kept)) << c.flags;
    }
    // a resumed run keeps counting across the restart, and removes the leftover
    // temporary files of a killed write (nothing else)
    const std::string dir = tmp.file("resumed");
    RunResult a = run(base() + " -x 6 -n 1 -nk 2 -nm 3 -o " + dir, tmp);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    for (const char* name : {"model_00000007.bin.tmp", "state_00000007.bin.tmp", "notes.bin.tmp"})
        std::ofstream(dir + "/" + name) << "partial";
    RunResult b = run(base() + " -x 10 -n 1 -nk 2 -nm 3 -y 1 -o " + dir, tmp);
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_NE(b.out.find("removed " + dir + "/model_00000007.bin.tmp (an unfinished checkpoint write)"), std::string::npos)
        << b.out;
    std::set<std::string> expected = checkpoint_files({3, 6, 9, 10});
    expected.insert("notes.bin.tmp");
    EXPECT_EQ(files_in(dir), expected);
    RunResult bad = run(base() + " -x 2 -nk -1", tmp);
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_EQ(bad.err, "train_gpt: error: -nk and -nm must be >= 0\n");
}

// ---------------------------------------------------------------------------
// Signals

// SIGTERM (and SIGINT) mid-run: the step finishes, its checkpoint is written,
// one line says so, exit status 75; -y 1 then prints the losses and samples of
// the uninterrupted run and ends in its model file, byte for byte. Shuffled
// batches, samples every 4 steps and a validation every 5, so the data
// position and the sampling RNG must both carry over.
TEST_F(Reliability, SigtermLeavesACheckpointThatResumesWithTheSameLosses) {
    // 128 micro-batches a step (tens of ms), one thread (spawn): the signal, sent once step 3 or
    // 6 is seen in the output, must land before the last step starts, also on a loaded machine
    const std::string flags = " -x 16 --shuffle 1 -s 4 -v 5 -d 16384";
    RunResult whole = knngpt_test::run_with_threads(base() + flags + " -o " + tmp.file("whole"), 1, tmp);
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    const auto want = step_losses(whole.out);
    ASSERT_EQ(want.size(), 16u);
    for (int sig : {SIGTERM, SIGINT}) {
        const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT", dir = tmp.file("stopped_" + name);
        SCOPED_TRACE(name);
        Child c = spawn(base() + flags + " -o " + dir, tmp.file("out"), tmp.file("err"), 1);
        ASSERT_TRUE(wait_for_text(c, c.out, sig == SIGTERM ? "step     3/" : "step     6/", 60)) << slurp(c.out);
        kill(c.pid, sig);
        EXPECT_EQ(wait_for(c), 75) << "(0: the run ended before the signal landed) " << slurp(c.err);
        const std::string out = slurp(c.out);
        EXPECT_EQ(slurp(c.err), "");
        std::smatch m;
        const std::regex stopped("stopped by " + name + " after step (\\d+) of 16: checkpoint (\\S+), resume with -y 1\n");
        ASSERT_TRUE(std::regex_search(out, m, stopped)) << out;
        const int at = std::stoi(m[1]);
        EXPECT_EQ(m[2].str(), model_at(dir, at));
        const auto before = step_losses(out);
        ASSERT_EQ(before.size(), (size_t)at) << "the signal's step finished, no other began";
        RunResult resumed = knngpt_test::run_with_threads(base() + flags + " -o " + dir + " -y 1", 1, tmp);
        ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
        auto got = before;
        for (const auto& l : step_losses(resumed.out)) got.push_back(l);
        EXPECT_EQ(got, want);
        EXPECT_EQ(slurp(model_at(dir, 16)), slurp(model_at(tmp.file("whole"), 16))) << "resumed run ended elsewhere";
        // every sample of the uninterrupted run, the same text: the sampling RNG carried over
        const std::regex sample("---- sample \\(step \\d+\\) ----\n[^\n]*\n");
        auto samples = [&](const std::string& s) {
            std::vector<std::string> v;
            for (std::sregex_iterator it(s.begin(), s.end(), sample), end; it != end; ++it) v.push_back(it->str());
            return v;
        };
        auto got_samples = samples(out + resumed.out);
        EXPECT_EQ(got_samples, samples(whole.out));
    }
}

// A second signal does not wait for the step: status 128 + SIGTERM, one line, no checkpoint.
TEST_F(Reliability, SecondSignalExitsAtOnce) {
    const std::string dir = tmp.file("run");
    // slow steps (512 micro-batches each: about a second on an idle core), so that both
    // signals land inside one on any machine; one thread (spawn)
    Child c = spawn(base() + " -x 50 -d 65536 -o " + dir, tmp.file("out"), tmp.file("err"), 1);
    ASSERT_TRUE(wait_for_text(c, c.out, "step     1/", 120)) << slurp(c.out);
    kill(c.pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    kill(c.pid, SIGTERM);
    EXPECT_EQ(wait_for(c), 128 + SIGTERM);
    EXPECT_EQ(slurp(c.err), "train_gpt: second signal: exiting now, without a checkpoint\n");
    EXPECT_EQ(slurp(c.out).find("stopped by"), std::string::npos);
    EXPECT_EQ(knngpt::latest_checkpoint(dir), -1);
}

// Two ranks, the signal sent to rank 1 alone: both agree to stop at the same
// step (rank 0 says so and writes the checkpoint), neither hangs, and two
// ranks resumed from it end in the uninterrupted two-rank run's model.
TEST_F(Reliability, SignalToOneRankStopsBothAtTheSameStep) {
    if (!knngpt_test::have_mpirun()) GTEST_SKIP() << "mpirun not found: install openmpi-bin (tools/install_deps.sh)";
    // 256 micro-batches a step on each rank (tens of ms), 24 steps: the signal, sent once rank 0's
    // step 3 has come through mpirun's output forwarding, must land before the last step starts,
    // also on a loaded machine (with sub-millisecond steps a run could finish first)
    const int steps = 24;
    const std::string flags = base() + " -b 2 -x " + std::to_string(steps) + " --shuffle 1 -z 1 -d 32768";
    RunResult whole = knngpt_test::run_with_threads(knngpt_test::mpirun_prefix(2, 120) + flags + " -o " + tmp.file("whole"), 1, tmp);
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    const std::string dir = tmp.file("stopped");
    // each rank writes its pid, then becomes the trainer
    const std::string rank_cmd = "sh -c 'echo $$ > " + tmp.path + "/pid.$OMPI_COMM_WORLD_RANK; exec " + flags + " -o " +
                                 dir + "'";
    Child c = spawn(knngpt_test::mpirun_prefix(2, 120) + rank_cmd, tmp.file("out"), tmp.file("err"), 1);
    ASSERT_TRUE(wait_for_text(c, c.out, "step     3/", 120)) << slurp(c.out) << slurp(c.err);
    const int rank1 = std::stoi(slurp(tmp.path + "/pid.1"));
    kill(rank1, SIGTERM);
    EXPECT_EQ(wait_for(c), 75) << "(0: the run ended before the signal landed) " << slurp(c.err);
    std::smatch m;
    const std::string out = slurp(c.out);
    ASSERT_TRUE(std::regex_search(out, m, std::regex("stopped by a signal to another rank after step (\\d+) of " + std::to_string(steps)))) << out;
    const int at = std::stoi(m[1]);
    EXPECT_EQ(step_losses(out).size(), (size_t)at);
    EXPECT_EQ(knngpt::latest_checkpoint(dir), at);
    RunResult resumed = knngpt_test::run_with_threads(knngpt_test::mpirun_prefix(2, 120) + flags + " -o " + dir + " -y 1", 1, tmp);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_EQ(step_losses(resumed.out).size(), (size_t)(steps - at));
    EXPECT_EQ(slurp(model_at(dir, steps)), slurp(model_at(tmp.file("whole"), steps)));
}

// ---------------------------------------------------------------------------
// Numerical faults

// A NaN written into layer 1's attention output in step 3: the run stops with
// one line naming the step and the layer, after steps 1 and 2 and their
// checkpoints, none for step 3. With --skip-nonfinite 1 the step's update is
// skipped (its checkpoint equals step 2's: parameters and moments untouched)
// and the run goes on to a finite end.
TEST_F(Reliability, InjectedNanIsNamedWithItsStepAndLayer) {
    const std::string dir = tmp.file("stop");
    RunResult stopped = run(base() + " -x 6 -n 1 --inject-nan 3:1 -o " + dir, tmp);
    EXPECT_EQ(stopped.exit_code, 1);
    EXPECT_TRUE(one_line(stopped.err)) << stopped.err;
    EXPECT_NE(stopped.err.find("train_gpt: error: step 3: loss nan, gradient norm nan: not finite; first non-finite "
                               "activation: layer 1 atty (micro-batch 0); stopped"),
              std::string::npos)
        << stopped.err;
    EXPECT_EQ(step_losses(stopped.out).size(), 2u);
    EXPECT_NE(stopped.out.find("step     3/6 | loss nan | lr"), std::string::npos) << stopped.out;
    EXPECT_EQ(knngpt::latest_checkpoint(dir), 2);
    // layer 0 is named as such
    RunResult layer0 = run(base() + " -x 3 --inject-nan 2", tmp);
    EXPECT_NE(layer0.err.find("step 2: loss nan"), std::string::npos) << layer0.err;
    EXPECT_NE(layer0.err.find("layer 0 atty"), std::string::npos) << layer0.err;
    // skip mode
    const std::string skip_dir = tmp.file("skip");
    RunResult skipped = run(base() + " -x 6 -n 1 --inject-nan 3:1 --skip-nonfinite 1 -o " + skip_dir, tmp);
    ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
    EXPECT_NE(skipped.out.find("step 3: loss nan, gradient norm nan: not finite; first non-finite activation: layer 1 "
                               "atty (micro-batch 0); update skipped\n"),
              std::string::npos)
        << skipped.out;
    EXPECT_NE(skipped.out.find("step     3/6 | loss nan | lr"), std::string::npos) << skipped.out;
    const auto losses = step_losses(skipped.out);  // the finite ones
    ASSERT_EQ(losses.size(), 5u) << skipped.out;
    EXPECT_NE(skipped.out.find("| 1 update(s) skipped (not finite)"), std::string::npos);
    EXPECT_EQ(slurp(model_at(skip_dir, 3)), slurp(model_at(skip_dir, 2)));
    const auto s2 = knngpt::read_state_file(state_at(skip_dir, 2), 34688), s3 = knngpt::read_state_file(state_at(skip_dir, 3), 34688);
    EXPECT_TRUE(s2.m == s3.m && s2.v == s3.v) << "a skipped update leaves the moments as they were";
    // steps 1-2 trained as without the fault
    RunResult clean = run(base() + " -x 6", tmp);
    EXPECT_EQ(step_losses(clean.out)[1], losses[1]);
    RunResult bad = run(base() + " -x 2 --inject-nan 1:2", tmp);
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("--inject-nan: layer 2 does not exist (the model has 2)"), std::string::npos) << bad.err;
}

// The locators on a model built here: a NaN planted in one gradient slice is
// named by tensor and layer, and gpt_update leaves the parameters alone; one
// planted in an activation is found where it was planted.
TEST(NumericalFaults, LocatorsNameTheTensorAndLayer) {
    knngpt::GPTConfig c;
    c.max_seq_len = 8, c.vocab_size = 64, c.padded_vocab_size = 128, c.num_layers = 3, c.num_heads = 2, c.channels = 16;
    knngpt::GPT model;
    knngpt::gpt_build(model, c, knngpt::gpt_random_init(c, 1), 2, 8);
    const std::vector<int> tokens = knngpt_test::random_ints(16, 2, 64), targets = knngpt_test::random_ints(16, 3, 64);
    knngpt::gpt_forward(model, tokens.data(), targets.data(), 2, 8, 0);
    EXPECT_EQ(knngpt::gpt_first_nonfinite_activation(model), "");
    knngpt::gpt_zero_grad(model);
    knngpt::gpt_backward(model, 1.0f / 16);
    EXPECT_EQ(knngpt::gpt_first_nonfinite_gradient(model), "");
    const std::vector<float> before = knngpt::gpt_host_parameters(model);
    const float nan = NAN;
    // layer 1's qkvw: tensor 4, per layer 3C·C
    model.grads.qkvw[1 * 3 * 16 * 16 + 5] = nan;
    EXPECT_EQ(knngpt::gpt_first_nonfinite_gradient(model), "layer 1 qkvw");
    model.grads.fcb[2 * 4 * 16] = INFINITY;  // layer 2 comes first in the backward
    EXPECT_EQ(knngpt::gpt_first_nonfinite_gradient(model), "layer 2 fcb");
    knngpt::AdamWConfig opt;
    EXPECT_FALSE(std::isfinite(knngpt::gpt_update(model, 1e-2f, opt, 1)));
    EXPECT_TRUE(knngpt::gpt_host_parameters(model) == before) << "a non-finite gradient reached the parameters";
    model.poison_layer = 2;
    knngpt::gpt_forward(model, tokens.data(), targets.data(), 2, 8, 0);
    EXPECT_FALSE(std::isfinite(model.mean_loss));
    EXPECT_EQ(knngpt::gpt_first_nonfinite_activation(model), "layer 2 atty");
}

// ---------------------------------------------------------------------------
// The kill -9 loop

// One run killed with SIGKILL 20 times once it trains: after a random delay (up to
// about two steps of the uninterrupted run's pace),
// and (every other time) the moment a checkpoint's temporary file appears,
// i.e. inside a write.
// After each kill every complete checkpoint in the directory reads back with
// valid checksums and pairs with its model; each restart (-y 1 once there is a
// checkpoint) resumes from the latest; the last run, left to finish, ends in
// the model of the run never killed, bit for bit, with exactly the checkpoints
// retention keeps and no temporary file.
TEST_F(Reliability, KillDashNineLoopEndsInTheUninterruptedModel) {
    const std::string flags = program_path("train_gpt_cpu") + " -i " + train + " -j " + val +
                              " --layers 2 --heads 2 --channels 64 -b 4 -t 32 -l 3e-3 -v 0 -m 2 -s 0 -g 8 --shuffle 1"
                              " -x 40 -n 1 -nk 2 -nm 20";
    const auto whole_start = std::chrono::steady_clock::now();
    RunResult whole = run(flags + " -o " + tmp.file("whole"), tmp);
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    // the random kills fall within about two steps of this machine's pace, so that 20 of
    // them happen before the run's 40 steps are done, on a fast machine as on a slow one;
    // where a run still ends before its kill (the pace measured while the machine was
    // busier), the loop starts over with half the window
    const double whole_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - whole_start).count();
    int kill_window_ms = std::max(1, (int)(2.0 * whole_ms / 40));
    const std::string dir = tmp.file("killed");
    std::mt19937 rng(2024);
    int kills = 0, kills_in_writes = 0, resumes = 0;
    for (int attempt = 0; attempt < 60 && kills < 20; attempt++) {
        const int latest = knngpt::latest_checkpoint(dir);
        const bool resume = latest >= 0;
        Child c = spawn(flags + " -o " + dir + (resume ? " -y 1" : ""), tmp.file("out"), tmp.file("err"));
        auto temporaries = [&] {
            int n = 0;
            if (std::filesystem::exists(dir))
                for (const auto& name : files_in(dir)) n += name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
            return n;
        };
        // once training runs (the first step line: the start has removed the temporary files a
        // previous kill left), either the moment a temporary file exists, i.e. inside
        // write_atomically, or after a random delay within kill_window_ms
        wait_for_text(c, c.out, "\nstep ", 60);
        if (kills % 2 == 1) {
            auto start = std::chrono::steady_clock::now();
            while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 5 && temporaries() == 0)
                std::this_thread::sleep_for(std::chrono::microseconds(200));
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(rng() % kill_window_ms));
        }
        kill(c.pid, SIGKILL);
        const int status = wait_for(c);
        const bool in_write = temporaries() > 0;  // the kill left a temporary file: it cut a write short
        const std::string out = slurp(c.out);
        if (resume && out.find("| steps ") != std::string::npos) {
            EXPECT_NE(out.find("(from step " + std::to_string(latest) + ")"), std::string::npos)
                << "latest complete checkpoint before the start: " << latest << "\n" << out;
        }
        EXPECT_EQ(slurp(c.err), "") << "attempt " << attempt;
        if (status == 0) {  // finished before the kill
            std::printf("a run ended before its kill (window %d ms): starting over with half of it\n", kill_window_ms);
            std::filesystem::remove_all(dir);
            kill_window_ms = std::max(1, kill_window_ms / 2);
            continue;
        }
        ASSERT_EQ(status, 128 + SIGKILL) << slurp(c.err);
        kills++;
        resumes += resume;
        kills_in_writes += in_write;
        // every complete checkpoint is whole: both checksums and the pairing
        for (int step : knngpt::complete_checkpoints(dir)) {
            knngpt::ModelFile m = knngpt::read_model_file(model_at(dir, step));
            knngpt::TrainState s = knngpt::read_state_file(state_at(dir, step), m.params.size());
            EXPECT_EQ(s.model_checksum, m.checksum) << "step " << step;
            EXPECT_EQ(s.step, step);
        }
    }
    std::printf("%d kills (%d inside a checkpoint write), %d of them in resumed runs\n", kills, kills_in_writes, resumes);
    EXPECT_EQ(kills, 20);
    EXPECT_GE(kills_in_writes, 8);
    RunResult last = run(flags + " -o " + dir + (knngpt::latest_checkpoint(dir) >= 0 ? " -y 1" : ""), tmp);
    ASSERT_EQ(last.exit_code, 0) << last.err;
    EXPECT_EQ(slurp(model_at(dir, 40)), slurp(model_at(tmp.file("whole"), 40))) << "the killed run ended elsewhere";
    EXPECT_EQ(files_in(dir), checkpoint_files({20, 39, 40}));
}

// The flags of this file's features are in -h and in the trainer's README (train/README.md).
TEST_F(Reliability, NewFlagsAreInHelpAndReadme) {
    RunResult help = run(program_path("train_gpt_cpu") + " -h", tmp);
    ASSERT_EQ(help.exit_code, 0);
    const std::string readme = slurp("train/README.md");
    ASSERT_FALSE(readme.empty()) << "train/README.md not found";
    for (const char* flag : {"-nk", "-nm", "--verify-checksum", "--skip-nonfinite", "--inject-nan"}) {
        std::regex documented(std::string("(^|[\\s`])") + flag + "[\\s`,]");
        EXPECT_TRUE(std::regex_search(help.out, documented)) << flag << " missing from -h";
        EXPECT_TRUE(std::regex_search(readme, documented)) << flag << " missing from train/README.md";
    }
}
