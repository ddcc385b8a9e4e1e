// tools/bench_bpe.cpp — GPT-2 BPE encoding speed: data/bpe.h against
// js-tiktoken (node, one thread), measured in the same run on the same text.
//
//   build/bench_bpe [--text FILE] [--vocab DIR] [--reps N] [--threads 1,2,4]
//
// The text: FILE, else $KNNGPT_TEXT, else data/tinyshakespeare.txt. The
// vocabulary: DIR (default data/gpt2). js-tiktoken comes from
// $KNNGPT_NODE_MODULES (default build/node/node_modules, where
// tools/fetch_gpt2_vocab.sh installs it); without node or the package the
// reference rows are left out and so are the ratios.
//
// Each encoder encodes the whole text N times (default 7); js-tiktoken inside
// one node process after one warm-up encoding (tests/gpt2_reference.js
// --repeat), ours with a fresh encoder each time (so its cache of pieces starts
// empty every time, as js-tiktoken has none). Rows: median, min and max
// milliseconds, MB/s at the median, and the ratio of js-tiktoken's median to
// ours. The ids of every encoding are checked against js-tiktoken's; a
// difference stops the bench.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "data/bpe.h"

namespace {

const char* USAGE =
    "usage: build/bench_bpe [--text FILE] [--vocab DIR] [--reps N] [--threads LIST]\n"
    "  --text FILE     text to encode (default: $KNNGPT_TEXT, else data/tinyshakespeare.txt)\n"
    "  --vocab DIR     GPT-2's encoder.json and vocab.bpe (default: data/gpt2)\n"
    "  --reps N        encodings per row (default 7)\n"
    "  --threads LIST  thread counts of encode_parallel, comma separated (default 1,2,...,cores by doubling)\n";

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path + ": cannot open");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Stats {
    double median, min, max;
};
Stats stats(std::vector<double> ms) {
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    return {n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]), ms.front(), ms.back()};
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string text_path = std::getenv("KNNGPT_TEXT") ? std::getenv("KNNGPT_TEXT") : "data/tinyshakespeare.txt";
        std::string vocab = "data/gpt2";
        int reps = 7;
        std::vector<int> threads;
        for (int i = 1; i < argc; i++) {
            const std::string flag = argv[i];
            if (flag == "-h" || flag == "--help") {
                std::fputs(USAGE, stdout);
                return 0;
            }
            if (i + 1 >= argc) throw std::runtime_error(flag + " needs a value (see --help)");
            const std::string value = argv[++i];
            if (flag == "--text") text_path = value;
            else if (flag == "--vocab") vocab = value;
            else if (flag == "--reps") reps = std::atoi(value.c_str());
            else if (flag == "--threads") {
                std::stringstream list(value);
                for (std::string item; std::getline(list, item, ',');) threads.push_back(std::atoi(item.c_str()));
            } else
                throw std::runtime_error("unknown flag '" + flag + "' (see --help)");
        }
        if (reps < 1) throw std::runtime_error("--reps must be >= 1");
        if (threads.empty()) {
            const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
            for (int t = 1; t < cores; t *= 2) threads.push_back(t);
            threads.push_back(cores);
        }
        for (int t : threads)
            if (t < 1) throw std::runtime_error("--threads: counts must be >= 1");

        const std::string text = slurp(text_path);
        const knngpt::Gpt2Bpe bpe = knngpt::Gpt2Bpe::load(vocab);
        const double mb = (double)text.size() / 1e6;
        std::printf("GPT-2 BPE encoding of %s (%.2f MB), %d encodings a row, medians\n", text_path.c_str(), mb, reps);

        // js-tiktoken
        const char* modules_env = std::getenv("KNNGPT_NODE_MODULES");
        const std::string modules = modules_env && *modules_env ? modules_env : "build/node/node_modules";
        const std::string ids_file = "/tmp/bench_bpe_ids." + std::to_string((long)getpid());
        const std::string ms_file = ids_file + ".ms";
        const std::string cmd = "NODE_PATH='" + modules + "' node tests/gpt2_reference.js --repeat " +
                                std::to_string(reps) + " '" + text_path + "' > '" + ids_file + "' 2> '" + ms_file + "'";
        const int status = std::system(cmd.c_str());
        std::vector<uint16_t> reference;
        std::vector<double> js_ms;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            std::istringstream ids(slurp(ids_file));
            for (long v; ids >> v;) reference.push_back((uint16_t)v);
            std::istringstream ms(slurp(ms_file));
            std::string word;
            ms >> word;
            for (double v; ms >> v;) js_ms.push_back(v);
        } else {
            std::printf("js-tiktoken: not run (node or %s/js-tiktoken missing: bash tools/fetch_gpt2_vocab.sh)\n",
                        modules.c_str());
        }
        std::remove(ids_file.c_str());
        std::remove(ms_file.c_str());

        std::printf("%-26s %8s %10s %10s %10s %9s %9s\n", "encoder", "threads", "median ms", "min ms", "max ms", "MB/s",
                    "speedup");
        const auto row = [&](const char* name, int t, const std::vector<double>& ms) {
            const Stats s = stats(ms);
            char ratio[32] = "-";
            if (!js_ms.empty()) std::snprintf(ratio, sizeof(ratio), "%.2fx", stats(js_ms).median / s.median);
            std::printf("%-26s %8d %10.1f %10.1f %10.1f %9.2f %9s\n", name, t, s.median, s.min, s.max, mb / (s.median / 1e3),
                        ratio);
            std::fflush(stdout);
        };
        if (!js_ms.empty()) row("js-tiktoken (node)", 1, js_ms);

        const auto check = [&](const std::vector<uint16_t>& ids, const char* what, int t) {
            if (!reference.empty() && ids != reference)
                throw std::runtime_error(std::string(what) + " on " + std::to_string(t) +
                                         " threads: ids differ from js-tiktoken's");
        };
        using clock = std::chrono::steady_clock;
        std::vector<double> ms;
        for (int r = 0; r < reps; r++) {
            const auto t0 = clock::now();
            const std::vector<uint16_t> ids = bpe.encode(text);
            ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
            check(ids, "encode", 1);
        }
        row("knngpt encode", 1, ms);
        for (int t : threads) {
            ms.clear();
            for (int r = 0; r < reps; r++) {
                const auto t0 = clock::now();
                const std::vector<uint16_t> ids = bpe.encode_parallel(text, t);
                ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
                check(ids, "encode_parallel", t);
            }
            row("knngpt encode_parallel", t, ms);
        }
        if (!reference.empty()) std::printf("ids: identical to js-tiktoken's in every encoding\n");
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_bpe: %s\n", e.what());
        return 1;
    }
}
