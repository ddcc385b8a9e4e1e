// tests/trainer_test_util.h — running the trainer programs from a test:
// capture of stdout/stderr and exit code, a deterministic pseudo-English text,
// the losses printed on "step N/M" lines and the final val loss, the distance
// of two model files, where the programs are, and the fixture of a CPU
// trainer test. Used by test_trainer.cpp, test_cuda_trainer.cpp,
// test_parallel_trainer.cpp and test_reliability.cpp.
#pragma once
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/common/rng.h"
#include "model/checkpoint.h"
#include "tests/test_util.h"

namespace knngpt_test {

struct RunResult {
    int exit_code;
    std::string out, err;
};

inline std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Runs a shell command with a fixed thread count, capturing stdout and stderr.
inline RunResult run(const std::string& cmd, const TempDir& tmp) {
    std::string full = "OMP_NUM_THREADS=2 " + cmd + " > " + tmp.file("stdout") + " 2> " + tmp.file("stderr");
    int status = std::system(full.c_str());
    return {WEXITSTATUS(status), slurp(tmp.file("stdout")), slurp(tmp.file("stderr"))};
}

// The same with `threads` OpenMP threads per process; the command may be an
// mpirun line (mpirun_prefix), whose processes inherit them.
inline RunResult run_with_threads(const std::string& cmd, int threads, const TempDir& tmp) {
    std::string full = "OMP_NUM_THREADS=" + std::to_string(threads) + " " + cmd + " > " + tmp.file("stdout") + " 2> " +
                       tmp.file("stderr");
    int status = std::system(full.c_str());
    return {WEXITSTATUS(status), slurp(tmp.file("stdout")), slurp(tmp.file("stderr"))};
}

// Is OpenMPI's mpirun on PATH?
inline bool have_mpirun() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

// "mpirun ... -np N ": quiet (its own notices would add lines to a one-line
// error), a time limit so that a hang fails instead of stalling the suite, the
// thread count forwarded. The allow-run-as-root settings come from the test
// runner (tools/run_tests.sh).
// (a sanitized build, make test SANITIZE=1, runs several times slower: its time limit is 8 times longer)
inline std::string mpirun_prefix(int processes, int timeout_s = 300) {
#if defined(__SANITIZE_ADDRESS__)
    timeout_s *= 8;
#endif
    return "mpirun -q --timeout " + std::to_string(timeout_s) + " -x OMP_NUM_THREADS -np " + std::to_string(processes) + " ";
}

inline bool exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}

// Pseudo-English text made of a small word list, deterministic.
inline std::string make_text(size_t bytes) {
    const char* words[] = {"the", "king", "shall", "speak", "of", "love", "and", "war", "to", "thee",
                           "my", "lord", "what", "is", "in", "a", "name", "good", "night", "sweet"};
    knngpt::Rng rng(99);
    std::string text;
    while (text.size() < bytes) {
        text += words[rng.below(20)];
        text += rng.below(8) == 0 ? ".\n" : " ";
    }
    return text;
}

// Writes make_text(bytes) to tmp and turns it into byte-level shards with
// prepare_data: tmp/t_train.bin and tmp/t_val.bin. The result of prepare_data.
inline RunResult prepare_text_shards(const TempDir& tmp, size_t bytes) {
    std::ofstream(tmp.file("text.txt")) << make_text(bytes);
    return run(program_path("prepare_data") + " --input " + tmp.file("text.txt") + " --out-dir " + tmp.path +
               " --name t", tmp);
}

// The "loss X" of every "step N/M" line, as printed.
inline std::vector<std::string> step_losses(const std::string& out) {
    std::vector<std::string> losses;
    std::regex re(R"(step +(\d+)/\d+ \| loss ([0-9.]+))");
    for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) losses.push_back((*it)[2]);
    return losses;
}

inline double relative_difference(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

// ||a - b|| / ||b|| over the parameters of two model files.
inline double parameter_difference(const std::string& path_a, const std::string& path_b) {
    auto a = knngpt::read_model_file(path_a);
    auto b = knngpt::read_model_file(path_b);
    EXPECT_EQ(a.params.size(), b.params.size());
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < a.params.size() && i < b.params.size(); i++) {
        diff += ((double)a.params[i] - b.params[i]) * ((double)a.params[i] - b.params[i]);
        norm += (double)b.params[i] * b.params[i];
    }
    return std::sqrt(diff / norm);
}

// A test of the train_gpt_cpu program on byte-level shards of make_text
// (60000 bytes) in a temporary directory; skipped where the programs are not built.
class CpuTrainerTest : public ::testing::Test {
  protected:
    TempDir tmp;
    std::string train, val;
    void SetUp() override {
        if (!exists(program_path("train_gpt_cpu")) || !exists(program_path("prepare_data")))
            GTEST_SKIP() << program_path("train_gpt_cpu") << " or " << program_path("prepare_data")
                         << " not built (run `make test` from the repository root)";
        RunResult r = prepare_text_shards(tmp, 60000);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        train = tmp.file("t_train.bin");
        val = tmp.file("t_val.bin");
    }
    // A small, fast model on the test text.
    std::string base() const {
        return program_path("train_gpt_cpu") + " -i " + train + " -j " + val +
               " --layers 2 --heads 2 --channels 32 -b 4 -t 32 -l 3e-3 -v 0 -m 2 -s 0 -g 8";
    }
};

// "val loss X" of the summary line.
inline double final_val_loss(const std::string& out) {
    size_t at = out.find("done:");
    size_t v = out.find("val loss ", at);
    return v == std::string::npos ? NAN : std::stod(out.substr(v + 9));
}

}  // namespace knngpt_test
