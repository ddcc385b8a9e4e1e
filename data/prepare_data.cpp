// data/prepare_data.cpp — text files -> llm.c token shards.
//
//   prepare_data --input FILE [--out-dir DIR] [--name NAME] [--val-fraction F]
//   prepare_data --tokenizer gpt2 --vocab VDIR --input FILE [--input FILE ...]
//                [--doc-sep file|blank|line:TEXT] [--shard-tokens N] [--threads N] [...]
//
// Byte level (the default): tokenizes FILE byte by byte (vocab 256: token =
// byte) and writes DIR/NAME_train.bin (the first 1-F of the bytes) and
// DIR/NAME_val.bin (the last F).
//
// GPT-2 (--tokenizer gpt2): GPT-2's BPE (data/bpe.h) from VDIR's encoder.json
// and vocab.bpe. The text is cut into documents (--doc-sep: each input file is
// one; blank: also after every "\n\n", as llm.c's tinyshakespeare script
// does; line:TEXT: also at every line equal to TEXT, the line dropped), and
// each document is written as the end-of-text token 50256 followed by its
// tokens, as llm.c's scripts do. A literal <|endoftext|> in the text is the
// token 50256 too. The last documents, holding about F of the bytes (the cut
// at the document start nearest to 1-F of them; a single document is cut at
// a line break where the cut changes no token), are validation. Each split
// goes to shards of at most N tokens (--shard-tokens): DIR/NAME_train.bin when
// one is enough, else DIR/NAME_train_000000.bin, ... (all shards of N tokens
// but the last two, which share the rest, so none is tiny); the same for val.
// Encoding runs on --threads threads over parts of about 1 MiB; the output
// does not depend on the thread count. DIR/gpt2_tokenizer.bin (llm.c's
// tokenizer file, version 2) is written beside the shards, to decode samples.
//
// Every argument is checked before anything is written; a problem prints one
// line "prepare_data: <problem>" and exits with status 1 (and removes the
// shards of this run if it was already writing).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "data/bpe.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"

namespace {

const char* USAGE =
    "usage: prepare_data --input FILE [--out-dir DIR] [--name NAME] [--val-fraction F]\n"
    "       prepare_data --tokenizer gpt2 --vocab VDIR --input FILE [--input FILE ...] [--doc-sep SEP]\n"
    "                    [--shard-tokens N] [--threads N] [--out-dir DIR] [--name NAME] [--val-fraction F]\n"
    "\n"
    "Tokenizes text into llm.c token shards: DIR/NAME_train.bin holds the first 1-F\n"
    "of the text, DIR/NAME_val.bin the last F.\n"
    "\n"
    "  --input FILE          a text file (required; several with --tokenizer gpt2)\n"
    "  --out-dir DIR         output directory, created if needed (default: data)\n"
    "  --name NAME           shard name prefix (default: the first FILE's name without extension)\n"
    "  --val-fraction F      fraction of the text for validation, 0 < F < 1 (default: 0.1)\n"
    "  --tokenizer T         byte (vocab 256, token = byte; default) or gpt2 (GPT-2's BPE, vocab 50257)\n"
    "GPT-2 only (also writes DIR/gpt2_tokenizer.bin, llm.c's tokenizer file, to decode samples)\n"
    "  --vocab VDIR          the directory of GPT-2's encoder.json and vocab.bpe (required;\n"
    "                        tools/fetch_gpt2_vocab.sh VDIR fetches them)\n"
    "  --doc-sep SEP         documents, each written as <|endoftext|> and its tokens: file (each\n"
    "                        input file is one; default), blank (also after every blank line,\n"
    "                        \"\\n\\n\", as llm.c's tinyshakespeare), line:TEXT (also at each line equal\n"
    "                        to TEXT, which is dropped). A literal <|endoftext|> is token 50256 too\n"
    "  --shard-tokens N      at most N tokens a shard; more go to NAME_train_000000.bin, ...\n"
    "                        (default: 100000000)\n"
    "  --threads N           encoding threads (default: all cores); the output is the same\n"
    "  -h, --help            this text\n";

struct Options {
    std::vector<std::string> inputs;
    std::string out_dir = "data", name;
    double val_fraction = 0.1;
    std::string tokenizer = "byte", vocab, doc_sep = "file";
    long shard_tokens = 100000000;
    int threads = 0;
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

long parse_count(const std::string& flag, const std::string& value, long lo, long hi) {
    const char* s = value.c_str();
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(s, &end, 10);
    if (value.empty() || end != s + value.size() || errno != 0)
        throw std::runtime_error(flag + ": '" + value + "' is not an integer");
    if (v < lo || v > hi)
        throw std::runtime_error(flag + ": " + value + " is outside " + std::to_string(lo) + ".." + std::to_string(hi));
    return v;
}

Options parse_args(int argc, char** argv) {
    Options opt;
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            std::fputs(USAGE, stdout);
            std::exit(0);
        }
        const bool known = flag == "--input" || flag == "--out-dir" || flag == "--name" ||
                           flag == "--val-fraction" || flag == "--tokenizer" || flag == "--vocab" ||
                           flag == "--doc-sep" || flag == "--shard-tokens" || flag == "--threads";
        if (!known) throw std::runtime_error("unknown flag '" + flag + "' (see --help)");
        if (i + 1 >= argc) throw std::runtime_error(flag + " needs a value");
        const std::string value = argv[++i];
        if (flag == "--input") opt.inputs.push_back(value);
        else if (flag == "--out-dir") opt.out_dir = value;
        else if (flag == "--name") opt.name = value;
        else if (flag == "--tokenizer") opt.tokenizer = value;
        else if (flag == "--vocab") opt.vocab = value;
        else if (flag == "--doc-sep") opt.doc_sep = value;
        else if (flag == "--shard-tokens") opt.shard_tokens = parse_count(flag, value, 2, INT32_MAX);
        else if (flag == "--threads") opt.threads = (int)parse_count(flag, value, 1, 4096);
        else opt.val_fraction = parse_fraction(flag, value);
    }
    if (opt.inputs.empty()) throw std::runtime_error("--input FILE is required (see --help)");
    if (opt.tokenizer != "byte" && opt.tokenizer != "gpt2")
        throw std::runtime_error("--tokenizer: '" + opt.tokenizer + "' is neither byte nor gpt2");
    const bool gpt2 = opt.tokenizer == "gpt2";
    if (!gpt2) {
        for (const char* f : {"--vocab", "--doc-sep", "--shard-tokens", "--threads"})
            for (int i = 1; i < argc; i++)
                if (std::string(argv[i]) == f) throw std::runtime_error(std::string(f) + " needs --tokenizer gpt2");
        if (opt.inputs.size() > 1) throw std::runtime_error("several --input need --tokenizer gpt2");
    } else {
        if (opt.vocab.empty())
            throw std::runtime_error("--tokenizer gpt2 needs --vocab DIR (GPT-2's encoder.json and vocab.bpe; "
                                     "tools/fetch_gpt2_vocab.sh DIR fetches them)");
        if (opt.doc_sep != "file" && opt.doc_sep != "blank" && !(opt.doc_sep.rfind("line:", 0) == 0 && opt.doc_sep.size() > 5))
            throw std::runtime_error("--doc-sep: '" + opt.doc_sep + "' is none of file, blank, line:TEXT");
        if (opt.doc_sep.find('\n') != std::string::npos)
            throw std::runtime_error("--doc-sep line:TEXT: TEXT must not hold a line break");
    }
    if (opt.out_dir.empty()) throw std::runtime_error("--out-dir must not be empty");
    if (opt.name.empty()) opt.name = stem_of(opt.inputs[0]);
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

int run_byte_level(const Options& opt) {
    const std::string& input = opt.inputs[0];
    const std::string text = read_file(input);
    if (text.empty()) throw std::runtime_error(input + ": empty file");

    // split by bytes: the last F go to validation
    const size_t total = text.size();
    const size_t val_bytes = (size_t)std::llround((double)total * opt.val_fraction);
    const size_t train_bytes = total - val_bytes;
    if (val_bytes < 2)
        throw std::runtime_error(input + ": validation part too small: " + std::to_string(val_bytes) +
                                 " tokens of " + std::to_string(total) + " at --val-fraction " +
                                 format_number(opt.val_fraction) + " (need at least 2)");
    if (train_bytes < 2)
        throw std::runtime_error(input + ": training part too small: " + std::to_string(train_bytes) +
                                 " tokens of " + std::to_string(total) + " (need at least 2)");
    if (train_bytes > (size_t)INT32_MAX)
        throw std::runtime_error(input + ": " + std::to_string(total) +
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

// ---------------------------------------------------------------- GPT-2

// An input file, mapped read-only.
class MappedFile {
 public:
    explicit MappedFile(const std::string& path) : path_(path) {
        if (std::filesystem::is_directory(path)) throw std::runtime_error(path + ": is a directory");
        const int fd = ::open(path.c_str(), O_RDONLY);
        if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
        struct stat st;
        if (fstat(fd, &st) != 0) {
            const int e = errno;
            ::close(fd);
            throw std::runtime_error(path + ": cannot stat: " + std::strerror(e));
        }
        size_ = (size_t)st.st_size;
        if (size_ > 0) {
            void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                const int e = errno;
                ::close(fd);
                throw std::runtime_error(path + ": cannot map: " + std::strerror(e));
            }
            madvise(p, size_, MADV_SEQUENTIAL);
            data_ = (const char*)p;
        }
        ::close(fd);
    }
    ~MappedFile() {
        if (data_) munmap((void*)data_, size_);
    }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    std::string_view text() const { return std::string_view(data_ ? data_ : "", size_); }
    const std::string& path() const { return path_; }

 private:
    std::string path_;
    const char* data_ = nullptr;
    size_t size_ = 0;
};

// A run of text encoded as one unit; `eot`: a document starts here (50256 first).
struct Span {
    std::string_view text;
    bool eot;
};

// The documents of one file under --doc-sep (see the opening comment).
std::vector<std::string_view> split_documents(std::string_view text, const std::string& sep) {
    std::vector<std::string_view> docs;
    if (sep == "file") {
        docs.push_back(text);
    } else if (sep == "blank") {  // a new document after each "\n\n", scanning from the left
        size_t start = 0;
        for (size_t at; (at = text.find("\n\n", start)) != std::string_view::npos;) {
            docs.push_back(text.substr(start, at + 2 - start));
            start = at + 2;
        }
        if (start < text.size() || docs.empty()) docs.push_back(text.substr(start));
    } else {  // line:TEXT: lines equal to TEXT separate documents and are dropped
        const std::string_view marker = std::string_view(sep).substr(5);
        size_t start = 0, line = 0;
        while (line <= text.size()) {
            size_t nl = text.find('\n', line);
            const size_t end = nl == std::string_view::npos ? text.size() : nl;
            if (text.substr(line, end - line) == marker) {
                docs.push_back(text.substr(start, line - start));
                start = nl == std::string_view::npos ? text.size() : nl + 1;
            }
            if (nl == std::string_view::npos) break;
            line = nl + 1;
        }
        docs.push_back(text.substr(start));
        docs.erase(std::remove_if(docs.begin(), docs.end(), [](std::string_view d) { return d.empty(); }), docs.end());
    }
    return docs;
}

// Writes one split's tokens as shards of at most `limit` tokens: while more
// than 2 * limit wait, the first `limit` go to the next shard; at the end what
// is left makes one shard, or two halves if it is over `limit`.
class ShardWriter {
 public:
    ShardWriter(std::string dir, std::string name, std::string split, size_t limit)
        : dir_(std::move(dir)), name_(std::move(name)), split_(std::move(split)), limit_(limit) {}

    void append(const std::vector<uint16_t>& ids) {
        buffer_.insert(buffer_.end(), ids.begin(), ids.end());
        total_ += ids.size();
        while (buffer_.size() >= 2 * limit_) {
            write(std::vector<uint16_t>(buffer_.begin(), buffer_.begin() + limit_), true);
            buffer_.erase(buffer_.begin(), buffer_.begin() + limit_);
        }
    }
    void finish() {
        if (buffer_.size() > limit_) {
            const size_t half = buffer_.size() / 2;
            write(std::vector<uint16_t>(buffer_.begin(), buffer_.begin() + half), true);
            write(std::vector<uint16_t>(buffer_.begin() + half, buffer_.end()), true);
        } else {
            write(buffer_, !written_.empty());  // one shard only when nothing was written before
        }
        buffer_.clear();
    }
    size_t total() const { return total_; }
    const std::vector<std::string>& written() const { return written_; }
    // the path, or the trainer's pattern for several shards
    std::string pattern() const {
        return written_.size() == 1 ? written_[0] : dir_ + "/" + name_ + "_" + split_ + "_*.bin";
    }
    // Removes shards of this name and split left by an earlier run (another shard count).
    void remove_stale() const {
        std::error_code ec;
        for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
            const std::string path = dir_ + "/" + entry.path().filename().string();
            if (std::find(written_.begin(), written_.end(), path) != written_.end()) continue;
            const std::string file = entry.path().filename().string(), prefix = name_ + "_" + split_;
            const bool single = file == prefix + ".bin";
            const bool numbered = file.size() == prefix.size() + 11 && file.rfind(prefix + "_", 0) == 0 &&
                                  file.compare(file.size() - 4, 4, ".bin") == 0 &&
                                  std::all_of(file.begin() + prefix.size() + 1, file.end() - 4, ::isdigit);
            if ((single || numbered) && std::remove(path.c_str()) == 0)
                std::printf("%s: removed (a shard of an earlier run)\n", path.c_str());
        }
    }
    void remove_written() const {
        for (const std::string& p : written_) std::remove(p.c_str());
    }

 private:
    void write(const std::vector<uint16_t>& tokens, bool several) {
        char index[16];
        std::snprintf(index, sizeof(index), "_%06zu", written_.size());
        const std::string path = dir_ + "/" + name_ + "_" + split_ + (several ? index : "") + ".bin";
        knngpt::write_token_shard(path, tokens);
        written_.push_back(path);
    }
    std::string dir_, name_, split_;
    size_t limit_;
    std::vector<uint16_t> buffer_;
    std::vector<std::string> written_;
    size_t total_ = 0;
};

std::string megabytes(double bytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f MB", bytes / 1e6);
    return text;
}

int run_gpt2(const Options& opt) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const knngpt::Gpt2Bpe bpe = knngpt::Gpt2Bpe::load(opt.vocab);

    std::vector<std::unique_ptr<MappedFile>> files;
    std::vector<std::string_view> docs;
    size_t total = 0;
    for (const std::string& path : opt.inputs) {
        files.push_back(std::make_unique<MappedFile>(path));
        if (files.back()->text().empty()) throw std::runtime_error(path + ": empty file");
        for (std::string_view d : split_documents(files.back()->text(), opt.doc_sep)) {
            docs.push_back(d);
            total += d.size();
        }
    }

    // the train/val cut: a document start, or a safe line break inside a single document
    const double target = (1.0 - opt.val_fraction) * (double)total;
    std::vector<Span> train, val;
    if (docs.size() >= 2) {
        size_t best = 1, best_before = docs[0].size();
        for (size_t k = 1, before = 0; k < docs.size(); k++) {  // before: the bytes of docs[0..k)
            before += docs[k - 1].size();
            if (std::fabs((double)before - target) < std::fabs((double)best_before - target))
                best = k, best_before = before;
        }
        for (size_t k = 0; k < docs.size(); k++) (k < best ? train : val).push_back(Span{docs[k], true});
    } else {
        const std::string_view d = docs[0];
        const std::vector<size_t> cuts = knngpt::Gpt2Bpe::safe_cuts(d, 1);
        if (cuts.empty())
            throw std::runtime_error(opt.inputs[0] + ": one document with no line break to cut it into train and "
                                     "validation at (use --doc-sep, or a longer text)");
        size_t cut = cuts[0];
        for (size_t c : cuts)
            if (std::fabs((double)c - target) < std::fabs((double)cut - target)) cut = c;
        train.push_back(Span{d.substr(0, cut), true});
        val.push_back(Span{d.substr(cut), false});
    }

    std::error_code ec;
    std::filesystem::create_directories(opt.out_dir, ec);
    if (ec) throw std::runtime_error(opt.out_dir + ": cannot create directory: " + ec.message());

    const int threads = opt.threads > 0 ? opt.threads : (int)std::max(1u, std::thread::hardware_concurrency());
    std::vector<knngpt::BpeEncoder> encoders;
    for (int t = 0; t < threads; t++) encoders.emplace_back(bpe);
    const bool tty = isatty(2);
    size_t done_bytes = 0, done_tokens = 0;
    auto last_report = clock::now();

    // Encodes one split: its spans cut into parts of about 1 MiB, grouped into
    // items, encoded a batch of items at a time on all threads, appended in order.
    const auto encode_split = [&](const std::vector<Span>& spans, ShardWriter& writer) {
        constexpr size_t PART = 1 << 20;
        std::vector<std::vector<Span>> items(1);
        size_t item_bytes = 0;
        for (const Span& span : spans) {
            std::vector<size_t> cuts = knngpt::Gpt2Bpe::safe_cuts(span.text, PART);
            cuts.insert(cuts.begin(), 0);
            cuts.push_back(span.text.size());
            for (size_t c = 0; c + 1 < cuts.size(); c++) {
                items.back().push_back(Span{span.text.substr(cuts[c], cuts[c + 1] - cuts[c]), span.eot && c == 0});
                item_bytes += cuts[c + 1] - cuts[c];
                if (item_bytes >= PART) items.emplace_back(), item_bytes = 0;
            }
        }
        const size_t batch = (size_t)threads * 4;
        for (size_t first = 0; first < items.size(); first += batch) {
            const size_t n = std::min(batch, items.size() - first);
            std::vector<std::vector<uint16_t>> ids(n);
            std::atomic<size_t> next{0};
            const auto work = [&](int t) {
                // into this thread's vector, then copied (as in encode_parallel:
                // ids[i] and ids[i + 1] share a cache line)
                std::vector<uint16_t> item;
                for (size_t i; (i = next.fetch_add(1)) < n;) {
                    item.clear();
                    for (const Span& span : items[first + i]) {
                        if (span.eot) item.push_back((uint16_t)bpe.eot_token());
                        encoders[t].encode(span.text, item, true);
                    }
                    ids[i].assign(item.begin(), item.end());
                }
            };
            std::vector<std::thread> pool;
            for (int t = 1; t < std::min<int>(threads, (int)n); t++) pool.emplace_back(work, t);
            work(0);
            for (auto& t : pool) t.join();
            for (size_t i = 0; i < n; i++) {
                writer.append(ids[i]);
                done_tokens += ids[i].size();
                for (const Span& span : items[first + i]) done_bytes += span.text.size();
            }
            const auto now = clock::now();
            if (tty && std::chrono::duration<double>(now - last_report).count() > 0.5) {
                last_report = now;
                const double s = std::chrono::duration<double>(now - start).count();
                const double rate = (double)done_bytes / std::max(s, 1e-9);
                std::fprintf(stderr, "\rprepare_data: %s of %s (%.0f%%) | %.1f MB/s | %zu tokens | eta %.0f s   ",
                             megabytes((double)done_bytes).c_str(), megabytes((double)total).c_str(),
                             100.0 * (double)done_bytes / (double)total, rate / 1e6, done_tokens,
                             (double)(total - done_bytes) / std::max(rate, 1.0));
            }
        }
        writer.finish();
    };

    ShardWriter train_writer(opt.out_dir, opt.name, "train", (size_t)opt.shard_tokens);
    ShardWriter val_writer(opt.out_dir, opt.name, "val", (size_t)opt.shard_tokens);
    const std::string tokenizer_path = opt.out_dir + "/gpt2_tokenizer.bin";
    try {
        encode_split(train, train_writer);
        encode_split(val, val_writer);
        if (tty) std::fputs("\n", stderr);
        if (train_writer.total() < 2 || val_writer.total() < 2)
            throw std::runtime_error(opt.inputs[0] + ": a split too small: " + std::to_string(train_writer.total()) +
                                     " train and " + std::to_string(val_writer.total()) +
                                     " validation tokens at --val-fraction " + format_number(opt.val_fraction) +
                                     " (need at least 2 each)");
        knngpt::write_llmc_tokenizer(
            tokenizer_path, knngpt::Tokenizer::from_pieces(bpe.all_token_bytes(), bpe.eot_token(), opt.vocab));
    } catch (...) {
        train_writer.remove_written();
        val_writer.remove_written();
        throw;
    }
    train_writer.remove_stale();
    val_writer.remove_stale();
    for (const ShardWriter* w : {&train_writer, &val_writer}) {
        const bool is_train = w == &train_writer;
        if (w->written().size() == 1)
            std::printf("%s: %zu tokens (%s)\n", w->pattern().c_str(), w->total(), is_train ? "train" : "val");
        else
            std::printf("%s: %zu tokens in %zu shards (%s)\n", w->pattern().c_str(), w->total(), w->written().size(),
                        is_train ? "train" : "val");
    }
    const double s = std::chrono::duration<double>(clock::now() - start).count();
    std::printf("%s: GPT-2's tokenizer for samples (%d tokens, end-of-text %d)\n", tokenizer_path.c_str(),
                bpe.vocab_size(), bpe.eot_token());
    std::printf("prepare_data: %s in %.2f s (%.1f MB/s, %d threads), %zu documents, %zu tokens\n",
                megabytes((double)total).c_str(), s, (double)total / 1e6 / std::max(s, 1e-9), threads, docs.size(),
                done_tokens);
    return 0;
}

int run(int argc, char** argv) {
    const Options opt = parse_args(argc, argv);
    return opt.tokenizer == "gpt2" ? run_gpt2(opt) : run_byte_level(opt);
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
