// data/dataloader.h — llm.c token shards: the writer, and the loader that cuts
// them into (B, T) training batches.
//
// Shard format (llm.c's): a header of 256 little-endian int32
//   [0] = 20240520 (SHARD_MAGIC), [1] = 1 (SHARD_VERSION), [2] = ntok,
//   the rest 0,
// followed by ntok tokens as little-endian uint16. The file size is exactly
// 1024 + 2 * ntok bytes.
//
// Batches. A shard is cut into windows of T + 1 tokens at stride T: window w
// is tokens [w*T, w*T + T] (nw = (ntok - 1) / T of them). A row of a batch is
// one window: inputs are its first T tokens, targets its last T (shifted by
// one). With `world` processes, a shard holds nb = nw / (world * B) batch slots
// (integer division); row i of slot k on rank r is window number
// (k * world + r) * B + i in the shard's window order, so the ranks of one
// step read disjoint windows and together read what one process with
// world * B rows would.
//
// Order.
// - Sequential (shuffle = false), as llm.c: shards in name order, windows in
//   file order, so slot k of rank r is the B*T + 1 consecutive tokens from
//   token (k * world + r) * B * T. After the last slot of a shard comes the
//   next shard; after the last shard the epoch counter increments and the
//   loader wraps to the first shard.
// - Shuffled (shuffle = true): in epoch e the shards are visited in a
//   permutation of their order, and the windows of shard s in a permutation of
//   0..nw-1, so every row of every batch is an independent window, as in
//   nanoGPT's random batches, but each window is read at most once an epoch.
//   Each permutation is a pure function of (seed, e, s) (Fisher-Yates driven by
//   an Rng seeded from a mix of the three), so every rank that gets the same
//   seed sees the same order, and the position (epoch, shard_pos, batch_pos) is
//   the whole state.
//
// Resuming. state() is the position of the next batch to be read:
// shard_pos indexes the epoch's shard order, batch_pos the shard's slot order.
// restore(state()) on a loader built with the same arguments continues with
// exactly the batches the saved loader would have read.
//
// Validation, all at construction so that bad data stops training before it
// starts: no file matching the pattern, a file that cannot be opened, bad
// magic or version, a file shorter (or longer) than its header says, a shard
// too small for one batch (ntok < world*B*T + 1), and any token >= vocab_size
// (this reads every shard once). Each error is one line naming the file.
//
// Memory: only the shard being read is mapped (mmap), read-only.
#pragma once
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/rng.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token shards are little endian and read in place");

namespace knngpt {

constexpr int SHARD_MAGIC = 20240520, SHARD_VERSION = 1;
constexpr int SHARD_HEADER_INTS = 256;
constexpr size_t SHARD_HEADER_BYTES = SHARD_HEADER_INTS * sizeof(int32_t);

// Writes `tokens` as one shard at `path`: first to "<path>.tmp.<pid>", then
// renamed, so `path` is never left half written. Throws on any I/O error.
inline void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
    if (tokens.size() > (size_t)INT32_MAX)
        throw std::runtime_error(path + ": " + std::to_string(tokens.size()) +
                                 " tokens do not fit one shard (at most 2147483647)");
    int32_t header[SHARD_HEADER_INTS] = {};
    header[0] = SHARD_MAGIC;
    header[1] = SHARD_VERSION;
    header[2] = (int32_t)tokens.size();

    const std::string tmp = path + ".tmp." + std::to_string((long)getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
    bool ok = std::fwrite(header, sizeof(int32_t), SHARD_HEADER_INTS, f) == (size_t)SHARD_HEADER_INTS;
    if (ok && !tokens.empty())
        ok = std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f) == tokens.size();
    int write_errno = errno;
    if (std::fclose(f) != 0 && ok) { ok = false; write_errno = errno; }
    if (!ok) {
        std::remove(tmp.c_str());
        throw std::runtime_error(path + ": write failed: " + std::strerror(write_errno));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        int rename_errno = errno;
        std::remove(tmp.c_str());
        throw std::runtime_error(path + ": cannot rename " + tmp + " into place: " +
                                 std::strerror(rename_errno));
    }
}

struct DataLoaderState {
    uint64_t epoch = 0, shard_pos = 0, batch_pos = 0;
};

namespace data_detail {

// A shard file opened, its header checked, its tokens mapped read-only.
class MappedShard {
 public:
    MappedShard() = default;
    explicit MappedShard(const std::string& path) : path_(path) {
        int fd = ::open(path.c_str(), O_RDONLY);
        if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
        try {
            map_checked(fd);
        } catch (...) {
            ::close(fd);
            throw;
        }
        ::close(fd);  // the mapping stays valid without the descriptor
    }
    ~MappedShard() { unmap(); }
    MappedShard(const MappedShard&) = delete;
    MappedShard& operator=(const MappedShard&) = delete;
    MappedShard(MappedShard&& o) noexcept { *this = std::move(o); }
    MappedShard& operator=(MappedShard&& o) noexcept {
        if (this != &o) {
            unmap();
            path_ = std::move(o.path_);
            map_ = o.map_; map_bytes_ = o.map_bytes_; ntok_ = o.ntok_;
            o.map_ = nullptr; o.map_bytes_ = 0; o.ntok_ = 0;
        }
        return *this;
    }

    size_t num_tokens() const { return ntok_; }
    const uint16_t* tokens() const {
        return (const uint16_t*)((const char*)map_ + SHARD_HEADER_BYTES);
    }

    // Throws (naming the file, the token and its position) if a token >= vocab_size.
    void check_vocab(int vocab_size) const {
        if (vocab_size > 65535) return;  // every uint16 fits
        const uint16_t* tok = tokens();
        uint16_t max_tok = 0;
        for (size_t i = 0; i < ntok_; i++) max_tok = tok[i] > max_tok ? tok[i] : max_tok;
        if ((int)max_tok < vocab_size) return;
        size_t first = 0;
        while ((int)tok[first] < vocab_size) first++;
        throw std::runtime_error(path_ + ": token " + std::to_string(tok[first]) + " at position " +
                                 std::to_string(first) + " is >= the vocab size " +
                                 std::to_string(vocab_size) + " (data vocab larger than the model's)");
    }

 private:
    void map_checked(int fd) {
        struct stat st;
        if (fstat(fd, &st) != 0)
            throw std::runtime_error(path_ + ": cannot stat: " + std::strerror(errno));
        if (!S_ISREG(st.st_mode)) throw std::runtime_error(path_ + ": not a regular file");
        const size_t file_bytes = (size_t)st.st_size;
        if (file_bytes < SHARD_HEADER_BYTES)
            throw std::runtime_error(path_ + ": truncated: file holds " + std::to_string(file_bytes) +
                                     " bytes, less than the " + std::to_string(SHARD_HEADER_BYTES) +
                                     "-byte header of an llm.c token shard");
        int32_t header[SHARD_HEADER_INTS];
        if (::pread(fd, header, SHARD_HEADER_BYTES, 0) != (ssize_t)SHARD_HEADER_BYTES)
            throw std::runtime_error(path_ + ": cannot read the header: " + std::strerror(errno));
        if (header[0] != SHARD_MAGIC)
            throw std::runtime_error(path_ + ": bad magic " + std::to_string(header[0]) + " (expected " +
                                     std::to_string(SHARD_MAGIC) + ", an llm.c token shard)");
        if (header[1] != SHARD_VERSION)
            throw std::runtime_error(path_ + ": bad version " + std::to_string(header[1]) +
                                     " (expected " + std::to_string(SHARD_VERSION) + ")");
        if (header[2] < 0)
            throw std::runtime_error(path_ + ": bad token count " + std::to_string(header[2]) +
                                     " in the header");
        const size_t ntok = (size_t)header[2];
        const size_t file_tokens = (file_bytes - SHARD_HEADER_BYTES) / sizeof(uint16_t);
        if (file_bytes < SHARD_HEADER_BYTES + ntok * sizeof(uint16_t))
            throw std::runtime_error(path_ + ": truncated: header says " + std::to_string(ntok) +
                                     " tokens, file holds " + std::to_string(file_tokens));
        if (file_bytes != SHARD_HEADER_BYTES + ntok * sizeof(uint16_t))
            throw std::runtime_error(path_ + ": header says " + std::to_string(ntok) + " tokens (" +
                                     std::to_string(SHARD_HEADER_BYTES + 2 * ntok) +
                                     " bytes) but the file holds " + std::to_string(file_bytes) +
                                     " bytes");
        void* p = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) throw std::runtime_error(path_ + ": cannot mmap: " + std::strerror(errno));
        map_ = p;
        map_bytes_ = file_bytes;
        ntok_ = ntok;
    }
    void unmap() {
        if (map_) ::munmap(map_, map_bytes_);
        map_ = nullptr;
    }

    std::string path_;
    void* map_ = nullptr;
    size_t map_bytes_ = 0;
    size_t ntok_ = 0;
};

// The files a pattern names: the path itself when it has no glob
// metacharacters (so a missing file is reported as such), else glob(3)'s
// matches, sorted by name.
inline std::vector<std::string> expand_shard_pattern(const std::string& pattern) {
    if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
    glob_t g;
    int rc = ::glob(pattern.c_str(), 0, nullptr, &g);  // glob sorts unless GLOB_NOSORT
    if (rc == GLOB_NOMATCH) {
        ::globfree(&g);
        throw std::runtime_error(pattern + ": no file matches this pattern");
    }
    if (rc != 0) {
        ::globfree(&g);
        throw std::runtime_error(pattern + ": glob failed (" +
                                 std::string(rc == GLOB_NOSPACE ? "out of memory" : "read error") + ")");
    }
    std::vector<std::string> paths(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    ::globfree(&g);
    return paths;
}

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// A permutation of 0..n-1 that depends only on (seed, epoch, stream):
// Fisher-Yates with an Rng seeded from a mix of the three.
inline std::vector<uint32_t> seeded_permutation(uint32_t n, uint64_t seed, uint64_t epoch, uint64_t stream) {
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    Rng rng(splitmix64(splitmix64(seed ^ splitmix64(epoch)) ^ splitmix64(~stream)));
    for (uint32_t i = n; i > 1; i--) std::swap(order[i - 1], order[rng.below(i)]);
    return order;
}

}  // namespace data_detail

class DataLoader {
 public:
    // pattern: a shard path or a glob(3) pattern (files sorted by name).
    // B, T: batch shape. rank, world: this process reads slot slices of rank
    // `rank` among `world`. shuffle, seed: see the opening comment (the seed
    // must be the same on every rank). vocab_size: every token must be below it.
    DataLoader(const std::string& pattern, int B, int T, int rank, int world, bool shuffle,
               uint64_t seed, int vocab_size)
        : B_(B), T_(T), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed) {
        if (B < 1 || T < 1)
            throw std::runtime_error("DataLoader: batch shape B=" + std::to_string(B) + " T=" +
                                     std::to_string(T) + " (both must be >= 1)");
        if (world < 1 || rank < 0 || rank >= world)
            throw std::runtime_error("DataLoader: rank " + std::to_string(rank) + " of world " +
                                     std::to_string(world) + " (need world >= 1 and 0 <= rank < world)");
        if (vocab_size < 1)
            throw std::runtime_error("DataLoader: vocab size " + std::to_string(vocab_size) +
                                     " (must be >= 1)");
        const size_t tokens_per_step = (size_t)world * B * T;  // all ranks, one batch slot
        for (const std::string& path : data_detail::expand_shard_pattern(pattern)) {
            data_detail::MappedShard shard(path);
            if (shard.num_tokens() < tokens_per_step + 1)
                throw std::runtime_error(path + ": too small: " + std::to_string(shard.num_tokens()) +
                                         " tokens, one batch of world*B*T + 1 = " +
                                         std::to_string(world) + "*" + std::to_string(B) + "*" +
                                         std::to_string(T) + " + 1 needs " +
                                         std::to_string(tokens_per_step + 1));
            size_t nb = (shard.num_tokens() - 1) / tokens_per_step;
            if ((shard.num_tokens() - 1) / T > UINT32_MAX)
                throw std::runtime_error(path + ": too many windows of T tokens in one shard");
            shard.check_vocab(vocab_size);
            paths_.push_back(path);
            shard_tokens_.push_back(shard.num_tokens());
            shard_batches_.push_back(nb);
        }
        if (paths_.size() > UINT32_MAX) throw std::runtime_error(pattern + ": too many shards");
    }

    // Fills inputs and targets, each (B, T); targets are inputs shifted by one token.
    void next_batch(int* inputs, int* targets) {
        const uint32_t shard = shard_at(epoch_, shard_pos_);
        load_shard(shard);
        const size_t first_row = (batch_pos_ * world_ + rank_) * (size_t)B_;
        for (size_t i = 0; i < (size_t)B_; i++) {
            const uint16_t* window = current_.tokens() + window_at(shard, first_row + i) * T_;
            for (size_t t = 0; t < (size_t)T_; t++) {
                inputs[i * T_ + t] = window[t];
                targets[i * T_ + t] = window[t + 1];
            }
        }
        advance(shard);
    }

    // Back to the start of epoch 0.
    void reset() { restore(DataLoaderState{}); }

    DataLoaderState state() const { return DataLoaderState{epoch_, shard_pos_, batch_pos_}; }

    void restore(const DataLoaderState& s) {
        if (s.shard_pos >= paths_.size())
            throw std::runtime_error("DataLoader: cannot restore shard position " +
                                     std::to_string(s.shard_pos) + ": the data has " +
                                     std::to_string(paths_.size()) + " shards");
        const uint32_t shard = shard_at(s.epoch, s.shard_pos);
        if (s.batch_pos >= shard_batches_[shard])
            throw std::runtime_error(paths_[shard] + ": cannot restore batch position " +
                                     std::to_string(s.batch_pos) + ": this shard holds " +
                                     std::to_string(shard_batches_[shard]) + " batches");
        epoch_ = s.epoch;
        shard_pos_ = s.shard_pos;
        batch_pos_ = s.batch_pos;
    }

    size_t num_tokens() const { return std::accumulate(shard_tokens_.begin(), shard_tokens_.end(), (size_t)0); }
    size_t batches_per_epoch() const {
        return std::accumulate(shard_batches_.begin(), shard_batches_.end(), (size_t)0);
    }
    int num_shards() const { return (int)paths_.size(); }
    const std::string& shard_path(int i) const { return paths_.at(i); }

 private:
    // The shard visited at position shard_pos of `epoch`.
    uint32_t shard_at(uint64_t epoch, uint64_t shard_pos) {
        if (!shuffle_) return (uint32_t)shard_pos;
        if (shard_order_.empty() || shard_order_epoch_ != epoch) {
            shard_order_ = data_detail::seeded_permutation((uint32_t)paths_.size(), seed_, epoch, 0);
            shard_order_epoch_ = epoch;
        }
        return shard_order_[shard_pos];
    }

    // The window read as row number `row` of `shard` in the current epoch.
    size_t window_at(uint32_t shard, size_t row) {
        if (!shuffle_) return row;
        if (window_order_.empty() || window_order_epoch_ != epoch_ || window_order_shard_ != shard) {
            const uint32_t num_windows = (uint32_t)((shard_tokens_[shard] - 1) / T_);
            window_order_ = data_detail::seeded_permutation(num_windows, seed_, epoch_, (uint64_t)shard + 1);
            window_order_epoch_ = epoch_;
            window_order_shard_ = shard;
        }
        return window_order_[row];
    }

    void load_shard(uint32_t shard) {
        if (current_shard_ == (int64_t)shard) return;
        data_detail::MappedShard mapped(paths_[shard]);
        if (mapped.num_tokens() != shard_tokens_[shard])
            throw std::runtime_error(paths_[shard] + ": changed since the loader opened it (" +
                                     std::to_string(shard_tokens_[shard]) + " tokens then, " +
                                     std::to_string(mapped.num_tokens()) + " now)");
        current_ = std::move(mapped);
        current_shard_ = shard;
    }

    void advance(uint32_t shard) {
        if (++batch_pos_ < shard_batches_[shard]) return;
        batch_pos_ = 0;
        if (++shard_pos_ < paths_.size()) return;
        shard_pos_ = 0;
        epoch_++;
    }

    int B_, T_, rank_, world_;
    bool shuffle_;
    uint64_t seed_;
    std::vector<std::string> paths_;
    std::vector<size_t> shard_tokens_, shard_batches_;

    uint64_t epoch_ = 0, shard_pos_ = 0, batch_pos_ = 0;  // the next batch to read

    data_detail::MappedShard current_;
    int64_t current_shard_ = -1;
    std::vector<uint32_t> shard_order_, window_order_;
    uint64_t shard_order_epoch_ = 0, window_order_epoch_ = 0;
    uint32_t window_order_shard_ = 0;
};

}  // namespace knngpt
