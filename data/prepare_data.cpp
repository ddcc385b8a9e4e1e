// data/prepare_data.cpp — text file -> llm.c token shards, byte-level.
//
//   prepare_data --input FILE [--out-dir DIR] [--name NAME] [--val-fraction F]
//
// Tokenizes FILE byte-level (vocab 256: token = byte) and writes
// DIR/NAME_train.bin (the first 1-F of the bytes) and DIR/NAME_val.bin (the
// last F). Every argument is checked before anything is written; a problem
// prints one line "prepare_data: <problem>" and exits with status 1.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "data/tokenizer.h"

namespace {

const char* USAGE =
    "usage: prepare_data --input FILE [--out-dir DIR] [--name NAME] [--val-fraction F]\n"
    "\n"
    "Tokenizes a text file byte-level (vocab 256) into two llm.c token shards:\n"
    "DIR/NAME_train.bin holds the first 1-F of the bytes, DIR/NAME_val.bin the last F.\n"
    "\n"
    "  --input FILE          the text file (required)\n"
    "  --out-dir DIR         output directory, created if needed (default: data)\n"
    "  --name NAME           shard name prefix (default: FILE's name without extension)\n"
    "  --val-fraction F      fraction of the bytes for validation, 0 < F < 1 (default: 0.1)\n"
    "  -h, --help            this text\n";

struct Options {
    std::string input, out_dir = "data", name;
    double val_fraction = 0.1;
};

// "dir/tiny.shakespeare.txt" -> "tiny.shakespeare"; a leading dot is part of the name.
std::string stem_of(const std::string& path) {
    std::string base = std::filesystem::path(path).filename().string();
    size_t dot = base.rfind('.');
    if (dot != std::string::npos && dot > 0) base.resize(dot);
    return base;
}

double parse_fraction(const std::string& flag, const std::string& value) {
    const char* s = value.c_str();
    char* end = nullptr;
    errno = 0;
    double f = std::strtod(s, &end);
    if (value.empty() || end != s + value.size() || errno != 0 || !std::isfinite(f))
        throw std::runtime_error(flag + ": '" + value + "' is not a number");
    if (!(f > 0.0 && f < 1.0))
        throw std::runtime_error(flag + ": " + value + " is outside (0, 1)");
    return f;
}

Options parse_args(int argc, char** argv) {
    Options opt;
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            std::fputs(USAGE, stdout);
            std::exit(0);
        }
        const bool known =
            flag == "--input" || flag == "--out-dir" || flag == "--name" || flag == "--val-fraction";
        if (!known) throw std::runtime_error("unknown flag '" + flag + "' (see --help)");
        if (i + 1 >= argc) throw std::runtime_error(flag + " needs a value");
        const std::string value = argv[++i];
        if (flag == "--input") opt.input = value;
        else if (flag == "--out-dir") opt.out_dir = value;
        else if (flag == "--name") opt.name = value;
        else opt.val_fraction = parse_fraction(flag, value);
    }
    if (opt.input.empty()) throw std::runtime_error("--input FILE is required (see --help)");
    if (opt.out_dir.empty()) throw std::runtime_error("--out-dir must not be empty");
    if (opt.name.empty()) opt.name = stem_of(opt.input);
    if (opt.name.empty()) throw std::runtime_error("--name must not be empty");
    if (opt.name.find('/') != std::string::npos)
        throw std::runtime_error("--name '" + opt.name + "' must not contain '/'");
    return opt;
}

std::string format_number(double x) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", x);
    return text;
}

std::string read_file(const std::string& path) {
    if (std::filesystem::is_directory(path)) throw std::runtime_error(path + ": is a directory");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw std::runtime_error(path + ": read error");
    return text;
}

int run(int argc, char** argv) {
    const Options opt = parse_args(argc, argv);
    const std::string text = read_file(opt.input);
    if (text.empty()) throw std::runtime_error(opt.input + ": empty file");

    // split by bytes: the last F go to validation
    const size_t total = text.size();
    const size_t val_bytes = (size_t)std::llround((double)total * opt.val_fraction);
    const size_t train_bytes = total - val_bytes;
    if (val_bytes < 2)
        throw std::runtime_error(opt.input + ": validation part too small: " + std::to_string(val_bytes) +
                                 " tokens of " + std::to_string(total) + " at --val-fraction " +
                                 format_number(opt.val_fraction) + " (need at least 2)");
    if (train_bytes < 2)
        throw std::runtime_error(opt.input + ": training part too small: " + std::to_string(train_bytes) +
                                 " tokens of " + std::to_string(total) + " (need at least 2)");
    if (train_bytes > (size_t)INT32_MAX)
        throw std::runtime_error(opt.input + ": " + std::to_string(total) +
                                 " bytes is too large for one shard per split (at most 2147483647 tokens)");

    const knngpt::Tokenizer tokenizer = knngpt::Tokenizer::byte_level();
    const std::vector<uint16_t> train = tokenizer.encode_bytes(text.substr(0, train_bytes));
    const std::vector<uint16_t> val = tokenizer.encode_bytes(text.substr(train_bytes));

    std::error_code ec;
    std::filesystem::create_directories(opt.out_dir, ec);
    if (ec) throw std::runtime_error(opt.out_dir + ": cannot create directory: " + ec.message());
    const std::string train_path = opt.out_dir + "/" + opt.name + "_train.bin";
    const std::string val_path = opt.out_dir + "/" + opt.name + "_val.bin";
    knngpt::write_token_shard(train_path, train);
    try {
        knngpt::write_token_shard(val_path, val);
    } catch (...) {
        std::remove(train_path.c_str());  // never leave one split without the other
        throw;
    }
    std::printf("%s: %zu tokens (train)\n", train_path.c_str(), train.size());
    std::printf("%s: %zu tokens (val)\n", val_path.c_str(), val.size());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "prepare_data: %s\n", e.what());
        return 1;
    }
}
