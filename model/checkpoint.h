// model/checkpoint.h — llm.c's model file (read versions 3 and 5, write 3)
// and knngpt's training-state file (optimizer state, step, RNG, data position).
//
// Model file (llm.c "gpt2_124M.bin" format), little endian:
//   header  256 int32: [0] 20240326 magic, [1] version (3 = fp32, 5 = bf16),
//           [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp, rest 0, except (knngpt's
//           files) [248] 0x4d55534b ("KSUM" as bytes: checksums follow),
//           [249] 1 (XXH64, model/checksum.h), [250..251] u64 checksum of the
//           parameter bytes as stored. llm.c reads [0..7] only, so it reads our
//           files as its own; a file without [248] (llm.c's) loads unchecked.
//   then every parameter in llm.c order (model/gpt.h), fp32 or bf16.
//
// Training-state file, little endian:
//   header  256 int32: [0] 20240527 magic, [1] 1 version, [2] world size,
//           [3] rank, [4] 0 (fp32 parameters, no master copy), [5] shuffle,
//           [6] 1 if the AdamW moments follow, [10] step (optimizer steps done),
//           [11] rows of a micro-batch over all processes (world·B; 0 = not recorded),
//           [20..21] u64 RNG state, [30..31] u64 data epoch,
//           [32..33] u64 data shard position, [34..35] u64 data batch position,
//           [40..41] u64 parameter count,
//           [50..59] the attention settings (mode, k, tail, index, grad,
//           grad samples, grad source, signed dV, gumbel groups, gumbel
//           samples), [60..61] u64 attention seed, [62] kmv threshold
//           (0 absolute, 1 relative; 0 in files from before it existed),
//           [63] kmv width levels, [64] kmv alpha as fp32 bits (0 in files from
//           before them: read as 1 level and alpha 1/3),
//           [70] 0x4d55534b ("KSUM": checksums follow; 0 in files from before them),
//           [71] 1 (XXH64), [72..73] u64 the parameter checksum of the model file
//           it belongs to (the model header's [250..251]), [74..75] u64 checksum of
//           this whole file, computed with [74..75] zero
//   then AdamW m and v, each parameter-count fp32: the whole vectors, also when
//   the run sharded them over its processes (ZeRO-1), so any world size resumes.
//
// Every file is written to "<path>.tmp", flushed to the disk (fsync), renamed
// into place and its directory synced, so a crash never leaves a half-written
// file under the real name, and a renamed file survives a power loss.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/checksum.h"
#include "model/gpt.h"

namespace knngpt {

constexpr int MODEL_MAGIC = 20240326;
constexpr int STATE_MAGIC = 20240527;
constexpr int STATE_VERSION = 1;
constexpr int HEADER_INTS = 256;
// the checksum slots (see the top of the file)
constexpr int CHECKSUM_MARK = 0x4d55534b;  // "KSUM" as little-endian bytes
constexpr int CHECKSUM_XXH64 = 1;
constexpr int MODEL_CHECKSUM_SLOT = 248;  // [248] mark, [249] kind, [250..251] parameter checksum
constexpr int STATE_CHECKSUM_SLOT = 70;   // [70] mark, [71] kind, [72..73] model's, [74..75] own

inline std::string hex64(uint64_t x) {
    char buf[20];
    snprintf(buf, sizeof(buf), "%016llx", (unsigned long long)x);
    return buf;
}

// ---------------------------------------------------------------------------
// Small file helpers: one-line errors naming the file.

struct FileCloser {
    FILE* f;
    ~FileCloser() { if (f) fclose(f); }
};

inline long file_size_of(FILE* f) {
    long here = ftell(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, here, SEEK_SET);
    return size;
}

inline void read_exact(FILE* f, void* dst, size_t bytes, const std::string& path, const char* what) {
    if (fread(dst, 1, bytes, f) != bytes)
        throw std::runtime_error(path + ": truncated while reading " + what);
}

// Writes `body` to path.tmp, flushes it to the disk, renames it to path and
// syncs the directory. A failure (disk full, a file-size limit) removes the
// temporary file and throws one line naming path and the system's reason;
// whatever stood under path before is untouched.
template <class WriteBody>
void write_atomically(const std::string& path, WriteBody body) {
    std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) throw std::runtime_error(path + ": cannot open for writing (" + std::strerror(errno) + ")");
    int error = 0;  // the first failure's errno
    auto check = [&](bool ok) { if (!ok && !error) error = errno ? errno : EIO; };
    errno = 0;
    check(body(f));
    check(fflush(f) == 0);
    check(fsync(fileno(f)) == 0);
    check(fclose(f) == 0);
    if (error) {
        std::remove(tmp.c_str());
        throw std::runtime_error(path + ": write failed (" + std::strerror(error) + "); nothing written under this name");
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        error = errno;
        std::remove(tmp.c_str());
        throw std::runtime_error(path + ": cannot rename the temporary file into place (" + std::strerror(error) + ")");
    }
    // the rename itself reaches the disk with the directory (some filesystems cannot sync one: EINVAL)
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (d >= 0) {
        const bool synced = fsync(d) == 0 || errno == EINVAL;
        error = errno;
        close(d);
        if (!synced) throw std::runtime_error(dir + ": cannot sync the directory (" + std::strerror(error) + ")");
    }
}

inline void put_u64(int* header, int at, uint64_t x) { std::memcpy(header + at, &x, sizeof(x)); }
inline uint64_t get_u64(const int* header, int at) {
    uint64_t x;
    std::memcpy(&x, header + at, sizeof(x));
    return x;
}

// bf16 -> fp32 is exact: the bf16 bits are the upper half of the fp32 bits.
inline float bf16_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    return x;
}

// ---------------------------------------------------------------------------
// Model files

struct ModelFile {
    GPTConfig config;
    int version = 0;
    std::vector<float> params;  // llm.c order, fp32 (bf16 files are widened)
    bool has_checksum = false;  // the header records one (knngpt's files; llm.c's do not)
    uint64_t checksum = 0;      // the parameter checksum it records
};

// The message of a checksum that does not match (one line, naming the file).
inline std::string checksum_mismatch(const std::string& path, const char* what, uint64_t found, uint64_t recorded) {
    return path + ": checksum mismatch: " + what + " hash to " + hex64(found) + ", the header records " +
           hex64(recorded) + " (a damaged file; --verify-checksum 0 loads it anyway)";
}

// Reads a version 3 (fp32) or 5 (bf16) llm.c model file; throws one line
// naming the file and the problem (missing, bad magic, version, bad shape,
// truncated or trailing bytes, and with `verify` a parameter checksum that
// does not match the header's, where it has one).
inline ModelFile read_model_file(const std::string& path, bool verify = true) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error(path + ": cannot open model file (" + std::strerror(errno) + ")");
    FileCloser closer{f};
    int header[HEADER_INTS];
    read_exact(f, header, sizeof(header), path, "the header");
    if (header[0] != MODEL_MAGIC)
        throw std::runtime_error(path + ": bad magic " + std::to_string(header[0]) + " (expected " +
                                 std::to_string(MODEL_MAGIC) + ", an llm.c model file)");
    if (header[1] != 3 && header[1] != 5)
        throw std::runtime_error(path + ": unsupported version " + std::to_string(header[1]) +
                                 " (expected 3 = fp32 or 5 = bf16)");
    ModelFile m;
    m.version = header[1];
    m.config.max_seq_len = header[2];
    m.config.vocab_size = header[3];
    m.config.num_layers = header[4];
    m.config.num_heads = header[5];
    m.config.channels = header[6];
    m.config.padded_vocab_size = header[7];
    validate_config(m.config, path);
    size_t n = count_parameters(m.config);
    size_t elem = m.version == 3 ? 4 : 2;
    long expected = (long)(sizeof(header) + n * elem);
    long actual = file_size_of(f);
    if (actual < expected)
        throw std::runtime_error(path + ": truncated: the header's shape needs " + std::to_string(expected) +
                                 " bytes, the file holds " + std::to_string(actual));
    if (actual > expected)
        throw std::runtime_error(path + ": " + std::to_string(actual - expected) +
                                 " unexpected bytes after the parameters (shape mismatch?)");
    m.has_checksum = header[MODEL_CHECKSUM_SLOT] == CHECKSUM_MARK;
    if (m.has_checksum && header[MODEL_CHECKSUM_SLOT + 1] != CHECKSUM_XXH64)
        throw std::runtime_error(path + ": unknown checksum kind " + std::to_string(header[MODEL_CHECKSUM_SLOT + 1]) +
                                 " in header slot " + std::to_string(MODEL_CHECKSUM_SLOT + 1));
    m.checksum = get_u64(header, MODEL_CHECKSUM_SLOT + 2);
    m.params.resize(n);
    uint64_t found = 0;
    if (m.version == 3) {
        read_exact(f, m.params.data(), n * 4, path, "the parameters");
        if (m.has_checksum && verify) found = xxh64(m.params.data(), n * 4);
    } else {
        std::vector<uint16_t> raw(n);
        read_exact(f, raw.data(), n * 2, path, "the parameters");
        if (m.has_checksum && verify) found = xxh64(raw.data(), n * 2);
        for (size_t i = 0; i < n; i++) m.params[i] = bf16_to_float(raw[i]);
    }
    if (m.has_checksum && verify && found != m.checksum)
        throw std::runtime_error(checksum_mismatch(path, "the parameters", found, m.checksum));
    return m;
}

// Writes a version 3 model file with its parameter checksum; returns the checksum.
inline uint64_t write_model_file(const std::string& path, const GPTConfig& c, const std::vector<float>& params) {
    if (params.size() != count_parameters(c)) throw std::runtime_error(path + ": parameter count does not match the config");
    int header[HEADER_INTS] = {0};
    header[0] = MODEL_MAGIC;
    header[1] = 3;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    const uint64_t checksum = xxh64(params.data(), params.size() * sizeof(float));
    header[MODEL_CHECKSUM_SLOT] = CHECKSUM_MARK;
    header[MODEL_CHECKSUM_SLOT + 1] = CHECKSUM_XXH64;
    put_u64(header, MODEL_CHECKSUM_SLOT + 2, checksum);
    write_atomically(path, [&](FILE* f) {
        return fwrite(header, sizeof(header), 1, f) == 1 &&
               fwrite(params.data(), sizeof(float), params.size(), f) == params.size();
    });
    return checksum;
}

// ---------------------------------------------------------------------------
// Training-state files

struct TrainState {
    int step = 0;                 // optimizer steps completed
    int world = 1, rank = 0;
    int global_rows = 0;          // world·B of the run that wrote it (0: not recorded)
    bool shuffle = false;
    uint64_t rng_state = 0;       // the trainer's sampling RNG
    uint64_t data_epoch = 0, data_shard_pos = 0, data_batch_pos = 0;
    AttnConfig attn;              // the attention the run trained with
    std::string attn_note;        // read: why attn differs from what the file names (a retired index), else empty
    std::vector<float> m, v;      // AdamW moments, parameter count each
    bool has_checksum = false;    // read: the file carries checksums (written: always)
    uint64_t model_checksum = 0;  // the parameter checksum of the model file it belongs to
};

// The state file's own checksum: the header with its slots [74..75] zero, then m and v.
inline uint64_t state_checksum(const int* header, const std::vector<float>& m, const std::vector<float>& v) {
    int h[HEADER_INTS];
    std::memcpy(h, header, sizeof(h));
    put_u64(h, STATE_CHECKSUM_SLOT + 4, 0);
    Xxh64 sum;
    sum.update(h, sizeof(h));
    sum.update(m.data(), m.size() * sizeof(float));
    sum.update(v.data(), v.size() * sizeof(float));
    return sum.digest();
}

inline void write_state_file(const std::string& path, const TrainState& s) {
    if (s.m.size() != s.v.size()) throw std::runtime_error(path + ": AdamW m and v differ in size");
    int header[HEADER_INTS] = {0};
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = s.world;
    header[3] = s.rank;
    header[4] = 0;
    header[5] = s.shuffle ? 1 : 0;
    header[6] = 1;
    header[10] = s.step;
    header[11] = s.global_rows;
    put_u64(header, 20, s.rng_state);
    put_u64(header, 30, s.data_epoch);
    put_u64(header, 32, s.data_shard_pos);
    put_u64(header, 34, s.data_batch_pos);
    put_u64(header, 40, s.m.size());
    const AttnConfig& a = s.attn;
    const int attn_fields[10] = {(int)a.mode, a.k, a.tail, (int)a.index, (int)a.grad, a.grad_samples,
                                 (int)a.grad_source, a.grad_signed_dv ? 1 : 0, a.gumbel_groups, a.gumbel_samples};
    std::memcpy(header + 50, attn_fields, sizeof(attn_fields));
    put_u64(header, 60, a.seed);
    header[62] = (int)a.kmv_threshold;
    header[63] = a.kmv_levels;
    std::memcpy(header + 64, &a.kmv_alpha, sizeof(float));
    header[65] = a.window;
    header[66] = a.sinks;
    header[STATE_CHECKSUM_SLOT] = CHECKSUM_MARK;
    header[STATE_CHECKSUM_SLOT + 1] = CHECKSUM_XXH64;
    put_u64(header, STATE_CHECKSUM_SLOT + 2, s.model_checksum);
    put_u64(header, STATE_CHECKSUM_SLOT + 4, state_checksum(header, s.m, s.v));
    write_atomically(path, [&](FILE* f) {
        return fwrite(header, sizeof(header), 1, f) == 1 &&
               fwrite(s.m.data(), sizeof(float), s.m.size(), f) == s.m.size() &&
               fwrite(s.v.data(), sizeof(float), s.v.size(), f) == s.v.size();
    });
}

// Reads a state file written for a model of `num_parameters` parameters; with
// `verify` its own checksum must match, where it has one.
inline TrainState read_state_file(const std::string& path, size_t num_parameters, bool verify = true) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error(path + ": cannot open state file (" + std::strerror(errno) + ")");
    FileCloser closer{f};
    int header[HEADER_INTS];
    read_exact(f, header, sizeof(header), path, "the header");
    if (header[0] != STATE_MAGIC)
        throw std::runtime_error(path + ": bad magic " + std::to_string(header[0]) + " (expected " +
                                 std::to_string(STATE_MAGIC) + ", a training-state file)");
    if (header[1] != STATE_VERSION)
        throw std::runtime_error(path + ": unsupported state version " + std::to_string(header[1]));
    // sizes first (they bound what is read), then the checksum over everything,
    // then the fields: a damaged header is named as such, not as a bad field
    uint64_t n = get_u64(header, 40);
    if (n != num_parameters)
        throw std::runtime_error(path + ": holds optimizer state for " + std::to_string(n) + " parameters, the model has " +
                                 std::to_string(num_parameters));
    // the file's size bounds n before 2·n·4 is formed, so a huge n cannot wrap to a small size
    const long actual = file_size_of(f);
    if (actual < (long)sizeof(header) || n > (uint64_t)(actual - (long)sizeof(header)) / (2 * sizeof(float)))
        throw std::runtime_error(path + ": truncated: " + std::to_string(n) + " parameters' moments need more than the " +
                                 std::to_string(actual) + " bytes the file holds");
    long expected = (long)(sizeof(header) + 2 * n * sizeof(float));
    if (actual != expected)
        throw std::runtime_error(path + ": truncated or oversized: expected " + std::to_string(expected) + " bytes, found " +
                                 std::to_string(actual));
    TrainState s;
    s.m.resize(n);
    s.v.resize(n);
    read_exact(f, s.m.data(), n * sizeof(float), path, "AdamW m");
    read_exact(f, s.v.data(), n * sizeof(float), path, "AdamW v");
    s.has_checksum = header[STATE_CHECKSUM_SLOT] == CHECKSUM_MARK;
    if (s.has_checksum && header[STATE_CHECKSUM_SLOT + 1] != CHECKSUM_XXH64)
        throw std::runtime_error(path + ": unknown checksum kind " + std::to_string(header[STATE_CHECKSUM_SLOT + 1]) +
                                 " in header slot " + std::to_string(STATE_CHECKSUM_SLOT + 1));
    s.model_checksum = get_u64(header, STATE_CHECKSUM_SLOT + 2);
    if (s.has_checksum && verify) {
        const uint64_t recorded = get_u64(header, STATE_CHECKSUM_SLOT + 4), found = state_checksum(header, s.m, s.v);
        if (found != recorded) throw std::runtime_error(checksum_mismatch(path, "the header and AdamW state", found, recorded));
    }
    s.world = header[2];
    s.rank = header[3];
    s.shuffle = header[5] != 0;
    s.step = header[10];
    s.global_rows = header[11];
    s.rng_state = get_u64(header, 20);
    s.data_epoch = get_u64(header, 30);
    s.data_shard_pos = get_u64(header, 32);
    s.data_batch_pos = get_u64(header, 34);
    AttnConfig& a = s.attn;
    a.mode = (AttnMode)header[50];
    a.k = header[51];
    a.tail = header[52];
    // the index by its id (model/attention_registry.h); a retired one loads as its replacement
    const TopkIndexInfo* index = find_topk_index(header[53]);
    if (const RetiredTopkIndex* retired = index ? nullptr : find_retired_topk_index(header[53])) {
        index = &topk_index_info(retired->replacement);
        s.attn_note = path + " trained with the top-k index " + retired->name + ", since retired: read as " +
                      index->name + " (" + retired->why + ")";
    }
    if (index) a.index = index->id;
    a.grad = (AttnGrad)header[54];
    a.grad_samples = header[55];
    a.grad_source = (AttnGradSource)header[56];
    a.grad_signed_dv = header[57] != 0;
    a.gumbel_groups = header[58];
    a.gumbel_samples = header[59];
    a.seed = get_u64(header, 60);
    a.kmv_threshold = (KmvThreshold)header[62];
    a.kmv_levels = header[63] == 0 ? 1 : header[63];  // 0 in files written before the field
    if (header[64] != 0) std::memcpy(&a.kmv_alpha, header + 64, sizeof(float));  // else [P2]'s 1/3
    a.window = header[65];  // 0 in files written before the field
    a.sinks = header[66];
    if (!find_attn_mode(header[50]) || !index || !find_row(kAttnGrads, header[54]) || a.window < 0 || a.sinks < 0 ||
        header[56] < 0 ||
        header[56] > (int)AttnGradSource::LazyGumbel || header[62] < 0 || header[62] > (int)KmvThreshold::Relative ||
        !kmv_width_levels_ok(a.kmv_levels) || !kmv_alpha_ok(a.kmv_alpha))
        throw std::runtime_error(path + ": unknown attention settings in the header (fields 50..66)");
    return s;
}

// The checkpoint of `step` in a run directory (model/checkpoint_dir.h names):
// the state of that step is removed first (so no older state stands beside a
// new model), then the model file and then the state are written, the state
// recording the model's checksum. A failed write removes the new model file
// too, so the step is either complete or absent, and throws one line.
inline void write_checkpoint(const std::string& model_path, const std::string& state_path, const GPTConfig& c,
                             const std::vector<float>& params, TrainState& s) {
    std::remove(state_path.c_str());
    s.model_checksum = write_model_file(model_path, c, params);
    try {
        write_state_file(state_path, s);
    } catch (...) {
        std::remove(model_path.c_str());
        throw;
    }
}

// Moves the optimizer state between a model and a TrainState, which always
// holds the whole m and v (parameter count each), in one process or many: a
// sharded model (ZeRO-1) gathers its ranks' shards here, a collective every
// rank calls, and takes its own shard back from whole vectors, so a state file
// resumes with any world size.
inline void gpt_get_optimizer_state(const GPT& model, TrainState& s) {
    const size_t n = model.num_parameters;
    s.m.resize(n);
    s.v.resize(n);
    if (!gpt_is_sharded(model)) {
        ops::copy_to_host(s.m.data(), model.m_memory, n * sizeof(float));
        ops::copy_to_host(s.v.data(), model.v_memory, n * sizeof(float));
        return;
    }
    Comm* comm = model.parallel.comm;
    const size_t S = model.shard_size;
    float* whole = ops::device_alloc<float>(model.padded_parameters);
    for (auto [moment, host] : {std::pair{model.m_memory, &s.m}, std::pair{model.v_memory, &s.v}}) {
        ops::copy_device_to_device(whole + (size_t)comm->rank() * S, moment, S * sizeof(float));
        comm->all_gather(whole, S);
        ops::copy_to_host(host->data(), whole, n * sizeof(float));
    }
    ops::device_free(whole);
}
inline void gpt_set_optimizer_state(GPT& model, const TrainState& s) {
    const size_t begin = model.shard_begin, count = model.shard_end - model.shard_begin;
    ops::device_zero(model.m_memory, model.shard_size * sizeof(float));
    ops::device_zero(model.v_memory, model.shard_size * sizeof(float));
    ops::copy_to_device(model.m_memory, s.m.data() + begin, count * sizeof(float));
    ops::copy_to_device(model.v_memory, s.v.data() + begin, count * sizeof(float));
}

}  // namespace knngpt
