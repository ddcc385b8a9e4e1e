// tests/trainer_test_util.h — running the trainer programs from a test:
// capture of stdout/stderr and exit code, a deterministic pseudo-English text,
// the losses printed on "step N/M" lines, and where the programs are. Used by
// test_trainer.cpp and test_cuda_trainer.cpp.
#pragma once
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/common/rng.h"
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

// The path of a program the tests run (train_gpt_cpu, prepare_data):
// $KNNGPT_BIN_DIR/<name>, by default ./<name> (the repository root, where
// `make` puts them; `make test-portable` points it at build/portable).
inline std::string program_path(const std::string& name) {
    const char* dir = std::getenv("KNNGPT_BIN_DIR");
    return std::string(dir && *dir ? dir : ".") + "/" + name;
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

// The "loss X" of every "step N/M" line, as printed.
inline std::vector<std::string> step_losses(const std::string& out) {
    std::vector<std::string> losses;
    std::regex re(R"(step +(\d+)/\d+ \| loss ([0-9.]+))");
    for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) losses.push_back((*it)[2]);
    return losses;
}

}  // namespace knngpt_test
