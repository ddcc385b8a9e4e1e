// tests/test_data.cpp — token shards, the data loader, the tokenizers and the
// prepare_data program.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

using knngpt::DataLoader;
using knngpt::DataLoaderState;
using knngpt::Tokenizer;
using knngpt_test::read_bytes;
using knngpt_test::TempDir;
using knngpt_test::write_bytes;

namespace {

// A shard whose token i is first + i % period.
std::vector<uint16_t> ramp(size_t n, int first = 0, int period = 1000) {
    std::vector<uint16_t> tokens(n);
    for (size_t i = 0; i < n; i++) tokens[i] = (uint16_t)(first + (int)(i % period));
    return tokens;
}

template <class T>
void append_pod(std::string& bytes, const T& value) {
    bytes.append((const char*)&value, sizeof(T));
}

// The llm.c shard header with the given fields, then the tokens.
std::string shard_bytes(int32_t magic, int32_t version, int32_t ntok, const std::vector<uint16_t>& tokens) {
    std::string bytes;
    int32_t header[256] = {};
    header[0] = magic; header[1] = version; header[2] = ntok;
    append_pod(bytes, header);
    bytes.append((const char*)tokens.data(), tokens.size() * sizeof(uint16_t));
    return bytes;
}

// Runs `make` and returns the message of the std::runtime_error it throws
// ("" and a test failure if it throws nothing).
std::string error_of(const std::function<void()>& make) {
    try {
        make();
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected a std::runtime_error";
    return "";
}

struct Batch {
    std::vector<int> inputs, targets;
};

Batch next_batch(DataLoader& loader, int B, int T) {
    Batch batch{std::vector<int>((size_t)B * T), std::vector<int>((size_t)B * T)};
    loader.next_batch(batch.inputs.data(), batch.targets.data());
    return batch;
}

// Expects inputs to be tokens[start .. start + B*T) and targets the same shifted by one.
void expect_batch_at(const Batch& batch, const std::vector<uint16_t>& tokens, size_t start) {
    for (size_t i = 0; i < batch.inputs.size(); i++) {
        ASSERT_EQ(batch.inputs[i], tokens[start + i]) << "input " << i << " of the batch at " << start;
        ASSERT_EQ(batch.targets[i], tokens[start + i + 1]) << "target " << i << " of the batch at " << start;
    }
}

bool file_exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> dir_entries(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace

// ---------------------------------------------------------------- shard format

TEST(TokenShard, WriteThenReadRoundTripsHeaderAndTokens) {
    TempDir dir;
    const std::string path = dir.file("x_train.bin");
    const std::vector<uint16_t> tokens = {0, 1, 255, 256, 65535, 42};
    knngpt::write_token_shard(path, tokens);

    EXPECT_EQ(read_bytes(path), shard_bytes(20240520, 1, 6, tokens));
    EXPECT_EQ(dir_entries(dir.path), std::vector<std::string>{"x_train.bin"}) << "no temporary file left";

    DataLoader loader(path, 1, 5, 0, 1, false, 0, 65536);
    EXPECT_EQ(loader.num_tokens(), 6u);
    Batch batch = next_batch(loader, 1, 5);
    expect_batch_at(batch, tokens, 0);
}

TEST(TokenShard, WriterReplacesAnExistingFileWhole) {
    TempDir dir;
    const std::string path = dir.file("s.bin");
    knngpt::write_token_shard(path, ramp(100));
    knngpt::write_token_shard(path, ramp(10));
    EXPECT_EQ(read_bytes(path), shard_bytes(20240520, 1, 10, ramp(10)));
}

TEST(TokenShard, WriterNamesThePathWhenItCannotWrite) {
    TempDir dir;
    const std::string path = dir.file("no_such_dir/s.bin");
    std::string msg = error_of([&] { knngpt::write_token_shard(path, ramp(10)); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

// ---------------------------------------------------------------- sequential order

TEST(DataLoaderSequential, BatchKStartsAtTokenKTimesBTAndTargetsAreShiftedByOne) {
    TempDir dir;
    const int B = 2, T = 8;
    const std::vector<uint16_t> tokens = ramp(2500);  // token i = i % 1000
    knngpt::write_token_shard(dir.file("s.bin"), tokens);
    DataLoader loader(dir.file("s.bin"), B, T, 0, 1, false, 0, 1000);

    const size_t nb = (2500 - 1) / (B * T);
    ASSERT_EQ(loader.batches_per_epoch(), nb);
    for (size_t k = 0; k < nb; k++) {
        Batch batch = next_batch(loader, B, T);
        expect_batch_at(batch, tokens, k * B * T);
        for (int i = 0; i < B * T; i++) {
            ASSERT_EQ(batch.inputs[i], (int)((k * B * T + i) % 1000));
            ASSERT_EQ(batch.targets[i], (int)((k * B * T + i + 1) % 1000));
        }
    }
    EXPECT_EQ(loader.state().epoch, 1u) << "the last batch of the last shard ends the epoch";
    expect_batch_at(next_batch(loader, B, T), tokens, 0);
}

TEST(DataLoaderSequential, LastBatchMayEndOnTheShardsLastToken) {
    TempDir dir;
    const int B = 3, T = 4;
    const std::vector<uint16_t> tokens = ramp(2 * B * T + 1);  // exactly two batches
    knngpt::write_token_shard(dir.file("s.bin"), tokens);
    DataLoader loader(dir.file("s.bin"), B, T, 0, 1, false, 0, 1000);
    ASSERT_EQ(loader.batches_per_epoch(), 2u);
    next_batch(loader, B, T);
    Batch last = next_batch(loader, B, T);
    EXPECT_EQ(last.targets.back(), tokens.back());
}

TEST(DataLoaderSequential, VisitsShardsInNameOrderThenWrapsToTheNextEpoch) {
    TempDir dir;
    const int B = 2, T = 5;
    // written out of name order; shard s holds tokens 1000*s + (i % 1000), sizes differ
    const std::vector<std::vector<uint16_t>> shards = {ramp(31, 0), ramp(55, 1000), ramp(11, 2000)};
    knngpt::write_token_shard(dir.file("d_002.bin"), shards[2]);
    knngpt::write_token_shard(dir.file("d_000.bin"), shards[0]);
    knngpt::write_token_shard(dir.file("d_001.bin"), shards[1]);
    write_bytes(dir.file("other.bin"), "not matched by the pattern");
    DataLoader loader(dir.file("d_*.bin"), B, T, 0, 1, false, 0, 3000);

    ASSERT_EQ(loader.num_shards(), 3);
    EXPECT_EQ(loader.shard_path(0), dir.file("d_000.bin"));
    EXPECT_EQ(loader.shard_path(2), dir.file("d_002.bin"));
    EXPECT_EQ(loader.num_tokens(), 31u + 55u + 11u);
    const size_t nb[3] = {3, 5, 1};  // (ntok - 1) / (B*T)
    ASSERT_EQ(loader.batches_per_epoch(), 9u);

    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        for (int s = 0; s < 3; s++) {
            for (size_t k = 0; k < nb[s]; k++) {
                DataLoaderState st = loader.state();
                EXPECT_EQ(st.epoch, epoch);
                EXPECT_EQ(st.shard_pos, (uint64_t)s);
                EXPECT_EQ(st.batch_pos, k);
                expect_batch_at(next_batch(loader, B, T), shards[s], k * B * T);
            }
        }
    }
    EXPECT_EQ(loader.state().epoch, 2u);
}

TEST(DataLoaderSequential, ResetGoesBackToTheStartOfEpochZero) {
    TempDir dir;
    const std::vector<uint16_t> tokens = ramp(100);
    knngpt::write_token_shard(dir.file("s.bin"), tokens);
    DataLoader loader(dir.file("s.bin"), 1, 10, 0, 1, false, 0, 1000);
    for (int i = 0; i < 13; i++) next_batch(loader, 1, 10);
    loader.reset();
    DataLoaderState st = loader.state();
    EXPECT_EQ(st.epoch, 0u);
    EXPECT_EQ(st.shard_pos, 0u);
    EXPECT_EQ(st.batch_pos, 0u);
    expect_batch_at(next_batch(loader, 1, 10), tokens, 0);
}

// ---------------------------------------------------------------- ranks

TEST(DataLoaderRanks, RankRAtBatchKStartsAtTwoKPlusRTimesBT) {
    TempDir dir;
    const int B = 2, T = 4, world = 2;
    const std::vector<uint16_t> tokens = ramp(100);
    knngpt::write_token_shard(dir.file("s.bin"), tokens);
    DataLoader rank0(dir.file("s.bin"), B, T, 0, world, false, 0, 1000);
    DataLoader rank1(dir.file("s.bin"), B, T, 1, world, false, 0, 1000);

    const size_t nb = (100 - 1) / (world * B * T);  // 6
    ASSERT_EQ(rank0.batches_per_epoch(), nb);
    ASSERT_EQ(rank1.batches_per_epoch(), nb);
    for (size_t k = 0; k < nb; k++) {
        expect_batch_at(next_batch(rank0, B, T), tokens, (2 * k + 0) * B * T);
        expect_batch_at(next_batch(rank1, B, T), tokens, (2 * k + 1) * B * T);
    }
    EXPECT_EQ(rank0.state().epoch, 1u);
    EXPECT_EQ(rank1.state().epoch, 1u);
}

TEST(DataLoaderRanks, TwoRanksTogetherReadWhatOneRankReadsWithTwiceTheRows) {
    TempDir dir;
    const int B = 2, T = 3;
    knngpt::write_token_shard(dir.file("a.bin"), ramp(50, 0));
    knngpt::write_token_shard(dir.file("b.bin"), ramp(40, 1000));
    for (bool shuffle : {false, true}) {
        DataLoader rank0(dir.file("*.bin"), B, T, 0, 2, shuffle, 7, 2000);
        DataLoader rank1(dir.file("*.bin"), B, T, 1, 2, shuffle, 7, 2000);
        DataLoader single(dir.file("*.bin"), 2 * B, T, 0, 1, shuffle, 7, 2000);
        ASSERT_EQ(single.batches_per_epoch(), rank0.batches_per_epoch());
        for (size_t step = 0; step < 2 * single.batches_per_epoch() + 1; step++) {
            Batch r0 = next_batch(rank0, B, T), r1 = next_batch(rank1, B, T), all = next_batch(single, 2 * B, T);
            std::vector<int> inputs = r0.inputs, targets = r0.targets;
            inputs.insert(inputs.end(), r1.inputs.begin(), r1.inputs.end());
            targets.insert(targets.end(), r1.targets.begin(), r1.targets.end());
            ASSERT_EQ(inputs, all.inputs) << "step " << step << (shuffle ? " shuffled" : "");
            ASSERT_EQ(targets, all.targets) << "step " << step << (shuffle ? " shuffled" : "");
        }
    }
}

// ---------------------------------------------------------------- shuffle

namespace {

// Three shards of distinct tokens (shard s: 1000*s + i, under 1000 tokens each),
// so a row is identified by its first input token. Every shard's windows of
// T + 1 tokens fill whole batches (160/4 = 40, 96/4 = 24, 242/4 = 60 windows
// for B = 2), so an epoch reads every window.
struct ShuffleData {
    TempDir dir;
    std::vector<std::vector<uint16_t>> shards = {ramp(161, 0), ramp(97, 1000), ramp(243, 2000)};
    static constexpr int B = 2, T = 4;
    ShuffleData() {
        for (size_t s = 0; s < shards.size(); s++)
            knngpt::write_token_shard(dir.file("shard_" + std::to_string(s) + ".bin"), shards[s]);
    }
    std::string pattern() const { return dir.file("shard_*.bin"); }
    DataLoader loader(bool shuffle, uint64_t seed) const {
        return DataLoader(pattern(), B, T, 0, 1, shuffle, seed, 3000);
    }
};

// The first input token of each row of each batch of one epoch, checking that
// every row is one window: T + 1 consecutive tokens of one shard, at a window
// boundary (a multiple of T from the shard's start).
std::vector<int> epoch_row_starts(DataLoader& loader, int B, int T) {
    std::vector<int> starts;
    const uint64_t epoch = loader.state().epoch;
    for (size_t i = 0; i < loader.batches_per_epoch(); i++) {
        Batch batch = next_batch(loader, B, T);
        for (int r = 0; r < B; r++) {
            const int first = batch.inputs[r * T];
            EXPECT_EQ(first % 1000 % T, 0) << "row starts inside a window";
            for (int t = 0; t < T; t++) {
                EXPECT_EQ(batch.inputs[r * T + t], first + t);
                EXPECT_EQ(batch.targets[r * T + t], first + t + 1);
            }
            starts.push_back(first);
        }
    }
    EXPECT_EQ(loader.state().epoch, epoch + 1) << "an epoch is batches_per_epoch() batches";
    return starts;
}

}  // namespace

TEST(DataLoaderShuffle, EveryWindowOfAnEpochAppearsExactlyOnce) {
    ShuffleData data;
    DataLoader sequential = data.loader(false, 0);
    std::vector<int> expected = epoch_row_starts(sequential, data.B, data.T);
    EXPECT_EQ(expected.size(), (40u + 24u + 60u));
    std::sort(expected.begin(), expected.end());

    DataLoader shuffled = data.loader(true, 1234);
    for (int epoch = 0; epoch < 3; epoch++) {
        std::vector<int> starts = epoch_row_starts(shuffled, data.B, data.T);
        EXPECT_NE(starts, expected) << "epoch " << epoch << " is not shuffled";
        std::sort(starts.begin(), starts.end());
        EXPECT_EQ(starts, expected) << "epoch " << epoch;
    }
}

TEST(DataLoaderShuffle, RowsOfABatchAreIndependentWindows) {
    ShuffleData data;
    DataLoader shuffled = data.loader(true, 7);
    std::vector<int> starts = epoch_row_starts(shuffled, data.B, data.T);
    int adjacent = 0;
    for (size_t i = 0; i + 1 < starts.size(); i += data.B) adjacent += starts[i + 1] == starts[i] + data.T;
    EXPECT_LT(adjacent, (int)starts.size() / data.B / 2) << "rows of a batch look like consecutive windows";
}

TEST(DataLoaderShuffle, ReadsAllWindowsOfAShardBeforeTheNextShard) {
    ShuffleData data;
    DataLoader shuffled = data.loader(true, 99);
    std::vector<int> starts = epoch_row_starts(shuffled, data.B, data.T);
    std::vector<int> shard_sequence;
    for (int start : starts)
        if (shard_sequence.empty() || shard_sequence.back() != start / 1000) shard_sequence.push_back(start / 1000);
    EXPECT_EQ(shard_sequence.size(), 3u) << "each shard is one contiguous run of batches";
}

TEST(DataLoaderShuffle, SameSeedSameOrderDifferentSeedDifferentOrder) {
    ShuffleData data;
    DataLoader a = data.loader(true, 5), b = data.loader(true, 5), c = data.loader(true, 6);
    std::vector<int> order_a = epoch_row_starts(a, data.B, data.T);
    EXPECT_EQ(order_a, epoch_row_starts(b, data.B, data.T));
    EXPECT_NE(order_a, epoch_row_starts(c, data.B, data.T));
}

TEST(DataLoaderShuffle, EachEpochHasItsOwnOrder) {
    ShuffleData data;
    DataLoader loader = data.loader(true, 5);
    std::vector<int> epoch0 = epoch_row_starts(loader, data.B, data.T);
    std::vector<int> epoch1 = epoch_row_starts(loader, data.B, data.T);
    EXPECT_NE(epoch0, epoch1);
    loader.reset();
    EXPECT_EQ(epoch_row_starts(loader, data.B, data.T), epoch0) << "reset replays epoch 0";
}

// ---------------------------------------------------------------- resume

TEST(DataLoaderResume, RestoredLoaderReadsTheSameNextBatches) {
    ShuffleData data;
    const size_t per_epoch = data.loader(false, 0).batches_per_epoch();
    for (bool shuffle : {false, true}) {
        // stop inside a shard, on a shard boundary, just before and after an epoch boundary
        for (size_t n : {size_t(0), size_t(7), size_t(20), per_epoch - 1, per_epoch, per_epoch + 3}) {
            const size_t m = per_epoch + 5;
            DataLoader original = data.loader(shuffle, 42);
            for (size_t i = 0; i < n; i++) next_batch(original, data.B, data.T);
            const DataLoaderState saved = original.state();

            DataLoader resumed = data.loader(shuffle, 42);
            next_batch(resumed, data.B, data.T);  // a different position and loaded shard before restoring
            resumed.restore(saved);
            for (size_t i = 0; i < m; i++) {
                Batch want = next_batch(original, data.B, data.T), got = next_batch(resumed, data.B, data.T);
                ASSERT_EQ(got.inputs, want.inputs) << "shuffle " << shuffle << ", n " << n << ", batch " << i;
                ASSERT_EQ(got.targets, want.targets) << "shuffle " << shuffle << ", n " << n << ", batch " << i;
            }
        }
    }
}

TEST(DataLoaderResume, RestoreRejectsAPositionOutsideTheData) {
    ShuffleData data;
    DataLoader loader = data.loader(false, 0);
    EXPECT_NE(error_of([&] { loader.restore(DataLoaderState{0, 3, 0}); }).find("3 shards"), std::string::npos);
    std::string msg = error_of([&] { loader.restore(DataLoaderState{0, 1, 12}); });
    EXPECT_NE(msg.find(data.dir.file("shard_1.bin")), std::string::npos) << msg;
}

// ---------------------------------------------------------------- bad input

namespace {

void expect_error_mentions(const std::string& msg, std::initializer_list<std::string> parts) {
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    for (const std::string& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' in: " << msg;
}

std::string loader_error(const std::string& pattern, int B = 2, int T = 4, int rank = 0, int world = 1,
                         int vocab = 1000) {
    return error_of([&] { DataLoader loader(pattern, B, T, rank, world, false, 0, vocab); });
}

}  // namespace

TEST(DataLoaderErrors, NoFileMatchesThePattern) {
    TempDir dir;
    expect_error_mentions(loader_error(dir.file("*_train.bin")), {dir.file("*_train.bin"), "no file matches"});
}

TEST(DataLoaderErrors, MissingFile) {
    TempDir dir;
    expect_error_mentions(loader_error(dir.file("x_train.bin")), {dir.file("x_train.bin"), "cannot open"});
}

TEST(DataLoaderErrors, BadMagic) {
    TempDir dir;
    write_bytes(dir.file("x.bin"), shard_bytes(12345, 1, 20, ramp(20)));
    expect_error_mentions(loader_error(dir.file("x.bin")), {dir.file("x.bin"), "magic", "12345", "20240520"});
}

TEST(DataLoaderErrors, BadVersion) {
    TempDir dir;
    write_bytes(dir.file("x.bin"), shard_bytes(20240520, 7, 20, ramp(20)));
    expect_error_mentions(loader_error(dir.file("x.bin")), {dir.file("x.bin"), "version", "7"});
}

TEST(DataLoaderErrors, TruncatedTokens) {
    TempDir dir;
    write_bytes(dir.file("x_val.bin"), shard_bytes(20240520, 1, 1000, ramp(512)));
    expect_error_mentions(loader_error(dir.file("x_val.bin")),
                          {dir.file("x_val.bin"), "truncated", "1000 tokens", "512"});
}

TEST(DataLoaderErrors, TruncatedHeader) {
    TempDir dir;
    write_bytes(dir.file("x.bin"), shard_bytes(20240520, 1, 10, ramp(10)).substr(0, 100));
    expect_error_mentions(loader_error(dir.file("x.bin")), {dir.file("x.bin"), "truncated"});
}

TEST(DataLoaderErrors, OneBadShardAmongGoodOnesIsNamed) {
    TempDir dir;
    knngpt::write_token_shard(dir.file("s_0.bin"), ramp(100));
    write_bytes(dir.file("s_1.bin"), shard_bytes(20240520, 1, 100, ramp(99)));
    expect_error_mentions(loader_error(dir.file("s_*.bin")), {dir.file("s_1.bin"), "truncated"});
}

TEST(DataLoaderErrors, ShardTooSmallForOneBatch) {
    TempDir dir;
    knngpt::write_token_shard(dir.file("x.bin"), ramp(16));  // world*B*T + 1 = 2*2*4 + 1 = 17
    expect_error_mentions(loader_error(dir.file("x.bin"), 2, 4, 0, 2), {dir.file("x.bin"), "too small", "17"});
    DataLoader fits(dir.file("x.bin"), 2, 4, 0, 1, false, 0, 1000);  // world 1 needs 9
    EXPECT_EQ(fits.batches_per_epoch(), 1u);
}

TEST(DataLoaderErrors, TokenBeyondTheModelsVocab) {
    TempDir dir;
    std::vector<uint16_t> tokens = ramp(100, 0, 50);
    tokens[77] = 300;
    knngpt::write_token_shard(dir.file("x.bin"), tokens);
    expect_error_mentions(loader_error(dir.file("x.bin"), 2, 4, 0, 1, 256),
                          {dir.file("x.bin"), "vocab", "300", "256", "position 77"});
}

TEST(DataLoaderErrors, BadShapeOrRank) {
    TempDir dir;
    knngpt::write_token_shard(dir.file("x.bin"), ramp(100));
    for (auto bad : {std::vector<int>{0, 4, 0, 1}, {2, 0, 0, 1}, {2, 4, 0, 0}, {2, 4, 2, 2}, {2, 4, -1, 2}}) {
        std::string msg = loader_error(dir.file("x.bin"), bad[0], bad[1], bad[2], bad[3]);
        expect_error_mentions(msg, {"DataLoader: "});
        EXPECT_TRUE(msg.find("B=") != std::string::npos || msg.find("rank") != std::string::npos) << msg;
    }
}

// ---------------------------------------------------------------- tokenizer

TEST(Tokenizer, ByteLevelRoundTripsEveryByte) {
    Tokenizer tok = Tokenizer::byte_level();
    EXPECT_EQ(tok.vocab_size(), 256);
    EXPECT_EQ(tok.eot_token(), -1);
    EXPECT_TRUE(tok.is_byte_level());

    std::string text;
    for (int b = 0; b < 256; b++) text.push_back((char)b);
    text += "Hello, world!\n";
    std::vector<uint16_t> tokens = tok.encode_bytes(text);
    ASSERT_EQ(tokens.size(), text.size());
    std::string decoded;
    for (size_t i = 0; i < tokens.size(); i++) {
        EXPECT_EQ(tokens[i], (unsigned char)text[i]);
        decoded += tok.decode(tokens[i]);
    }
    EXPECT_EQ(decoded, text);
}

TEST(Tokenizer, DecodeRejectsTokensOutsideTheVocab) {
    Tokenizer tok = Tokenizer::byte_level();
    expect_error_mentions(error_of([&] { tok.decode(256); }), {"256"});
    expect_error_mentions(error_of([&] { tok.decode(-1); }), {"-1"});
}

TEST(Tokenizer, DecodePrintableEscapesControlBytesOnly) {
    Tokenizer tok = Tokenizer::byte_level();
    EXPECT_EQ(tok.decode_printable('a'), "a");
    EXPECT_EQ(tok.decode_printable('\n'), "\n");
    EXPECT_EQ(tok.decode_printable('\t'), "\t");
    EXPECT_EQ(tok.decode_printable(7), "\\x07");
    EXPECT_EQ(tok.decode_printable(0), "\\x00");
    EXPECT_EQ(tok.decode_printable(0x7f), "\\x7f");
    EXPECT_EQ(tok.decode_printable(0xc3), std::string(1, (char)0xc3)) << "UTF-8 bytes pass through";
}

namespace {

// An llm.c tokenizer file written by hand: header, then (length, bytes) per token.
std::string tokenizer_bytes(uint32_t magic, uint32_t version, const std::vector<std::string>& pieces,
                            uint32_t eot) {
    uint32_t header[256] = {};
    header[0] = magic; header[1] = version; header[2] = (uint32_t)pieces.size(); header[3] = eot;
    std::string bytes;
    append_pod(bytes, header);
    for (const std::string& piece : pieces) {
        bytes.push_back((char)(uint8_t)piece.size());
        bytes += piece;
    }
    return bytes;
}

const std::vector<std::string> SMALL_VOCAB = {"a", "bc", " the", std::string("\x00\xff", 2), "<|endoftext|>"};

}  // namespace

TEST(Tokenizer, ParsesAnLlmcVersion2File) {
    TempDir dir;
    write_bytes(dir.file("tok.bin"), tokenizer_bytes(20240328, 2, SMALL_VOCAB, 4));
    Tokenizer tok = Tokenizer::from_llmc_file(dir.file("tok.bin"));
    EXPECT_EQ(tok.vocab_size(), 5);
    EXPECT_EQ(tok.eot_token(), 4);
    EXPECT_FALSE(tok.is_byte_level());
    for (int t = 0; t < 5; t++) EXPECT_EQ(tok.decode(t), SMALL_VOCAB[t]);
    EXPECT_EQ(tok.decode_printable(2), " the");
    expect_error_mentions(error_of([&] { tok.decode(5); }), {"5"});
    expect_error_mentions(error_of([&] { tok.encode_bytes("abc"); }), {"byte-level"});
}

TEST(Tokenizer, Version1FilesHaveGpt2sEndOfText) {
    TempDir dir;
    std::vector<std::string> pieces(50257, "x");
    write_bytes(dir.file("gpt2.bin"), tokenizer_bytes(20240328, 1, pieces, 0));
    Tokenizer tok = Tokenizer::from_llmc_file(dir.file("gpt2.bin"));
    EXPECT_EQ(tok.vocab_size(), 50257);
    EXPECT_EQ(tok.eot_token(), 50256);
}

TEST(Tokenizer, LlmcFileErrorsNameTheFileAndTheProblem) {
    TempDir dir;
    const std::string path = dir.file("tok.bin");
    expect_error_mentions(error_of([&] { Tokenizer::from_llmc_file(path); }), {path, "cannot open"});

    write_bytes(path, tokenizer_bytes(20240520, 2, SMALL_VOCAB, 4));
    expect_error_mentions(error_of([&] { Tokenizer::from_llmc_file(path); }), {path, "magic", "20240520"});

    write_bytes(path, tokenizer_bytes(20240328, 3, SMALL_VOCAB, 4));
    expect_error_mentions(error_of([&] { Tokenizer::from_llmc_file(path); }), {path, "version", "3"});

    const std::string whole = tokenizer_bytes(20240328, 2, SMALL_VOCAB, 4);
    write_bytes(path, whole.substr(0, whole.size() - 3));  // cut inside the last token
    expect_error_mentions(error_of([&] { Tokenizer::from_llmc_file(path); }), {path, "truncated"});

    write_bytes(path, whole.substr(0, 1024 + 2));  // cut after the first token
    expect_error_mentions(error_of([&] { Tokenizer::from_llmc_file(path); }), {path, "truncated"});

    write_bytes(path, whole.substr(0, 512));  // cut inside the header
    expect_error_mentions(error_of([&] { Tokenizer::from_llmc_file(path); }), {path, "truncated"});

    write_bytes(path, tokenizer_bytes(20240328, 2, SMALL_VOCAB, 5));
    expect_error_mentions(error_of([&] { Tokenizer::from_llmc_file(path); }), {path, "end-of-text"});

    // a header claiming more tokens than the file has bytes is refused before
    // room for them is reserved (found by tests/fuzz/fuzz_tokenizer)
    std::string claims_more = whole;
    const uint32_t vocab = 65536;
    std::memcpy(&claims_more[8], &vocab, sizeof(vocab));
    write_bytes(path, claims_more);
    expect_error_mentions(error_of([&] { Tokenizer::from_llmc_file(path); }), {path, "truncated", "65536 tokens", "bytes after the header"});
}

// ---------------------------------------------------------------- prepare_data

namespace {

// built by `make prepare_data` into the repository root, where the tests run ($KNNGPT_BIN_DIR: elsewhere)
const std::string PREPARE_DATA_PATH = knngpt_test::program_path("prepare_data");
const char* const PREPARE_DATA = PREPARE_DATA_PATH.c_str();

// Runs prepare_data with `args`, stdout and stderr into `log`; returns its exit status.
int run_prepare_data(const std::string& args, const std::string& log) {
    std::string cmd = std::string(PREPARE_DATA) + " " + args + " > '" + log + "' 2>&1";
    int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<uint16_t> shard_tokens(const std::string& path) {
    std::string bytes = read_bytes(path);
    EXPECT_GE(bytes.size(), 1024u);
    int32_t header[3];
    std::memcpy(header, bytes.data(), sizeof(header));
    EXPECT_EQ(header[0], 20240520);
    EXPECT_EQ(header[1], 1);
    EXPECT_EQ((size_t)header[2] * 2 + 1024, bytes.size());
    std::vector<uint16_t> tokens((bytes.size() - 1024) / 2);
    std::memcpy(tokens.data(), bytes.data() + 1024, tokens.size() * 2);
    return tokens;
}

}  // namespace

TEST(PrepareData, SplitsATextFileIntoTrainAndValShards) {
    if (::access(PREPARE_DATA, X_OK) != 0) GTEST_SKIP() << PREPARE_DATA << " not found: run `make prepare_data` first";
    TempDir dir;
    std::string text;
    for (int line = 0; line < 40; line++) text += "Line " + std::to_string(line) + ": caf\xc3\xa9 \t bytes\n";
    write_bytes(dir.file("tiny.txt"), text);

    ASSERT_EQ(run_prepare_data("--input " + dir.file("tiny.txt") + " --out-dir " + dir.file("out") +
                                   " --val-fraction 0.25",
                               dir.file("log")),
              0)
        << read_bytes(dir.file("log"));
    std::vector<uint16_t> train = shard_tokens(dir.file("out/tiny_train.bin"));
    std::vector<uint16_t> val = shard_tokens(dir.file("out/tiny_val.bin"));
    EXPECT_EQ(train.size() + val.size(), text.size());
    EXPECT_NEAR((double)val.size(), 0.25 * text.size(), 1.0);
    for (size_t i = 0; i < text.size(); i++) {
        uint16_t token = i < train.size() ? train[i] : val[i - train.size()];
        ASSERT_EQ(token, (unsigned char)text[i]) << "byte " << i;
    }
    std::string log = read_bytes(dir.file("log"));
    EXPECT_NE(log.find(std::to_string(train.size())), std::string::npos) << log;
    EXPECT_NE(log.find(std::to_string(val.size())), std::string::npos) << log;

    // the shards load as data for a byte-level model
    DataLoader loader(dir.file("out/tiny_*.bin"), 2, 8, 0, 1, false, 0, 256);
    EXPECT_EQ(loader.num_tokens(), text.size());
}

TEST(PrepareData, NameFlagChoosesTheShardNames) {
    if (::access(PREPARE_DATA, X_OK) != 0) GTEST_SKIP() << PREPARE_DATA << " not found: run `make prepare_data` first";
    TempDir dir;
    write_bytes(dir.file("in.txt"), std::string(200, 'z'));
    ASSERT_EQ(run_prepare_data("--input " + dir.file("in.txt") + " --out-dir " + dir.path + " --name kjv",
                               dir.file("log")),
              0);
    EXPECT_EQ(shard_tokens(dir.file("kjv_train.bin")).size(), 180u);
    EXPECT_EQ(shard_tokens(dir.file("kjv_val.bin")).size(), 20u);
}

TEST(PrepareData, BadInputExitsWithStatusOneAndWritesNothing) {
    if (::access(PREPARE_DATA, X_OK) != 0) GTEST_SKIP() << PREPARE_DATA << " not found: run `make prepare_data` first";
    TempDir dir;
    write_bytes(dir.file("in.txt"), std::string(200, 'z'));
    write_bytes(dir.file("empty.txt"), "");
    write_bytes(dir.file("tiny.txt"), "abc");
    const std::string out = dir.file("out");
    const std::string good = "--input " + dir.file("in.txt") + " --out-dir " + out;
    const std::vector<std::string> bad_args = {
        good + " --bogus 1",
        good + " --val-fraction 1.5",
        good + " --val-fraction 0",
        good + " --val-fraction abc",
        good + " --val-fraction",
        "--out-dir " + out,
        "--input " + dir.file("missing.txt") + " --out-dir " + out,
        "--input " + dir.file("empty.txt") + " --out-dir " + out,
        "--input " + dir.file("tiny.txt") + " --out-dir " + out,  // val part under 2 tokens
    };
    for (const std::string& args : bad_args) {
        EXPECT_EQ(run_prepare_data(args, dir.file("log")), 1) << args;
        std::string log = read_bytes(dir.file("log"));
        EXPECT_EQ(log.rfind("prepare_data: ", 0), 0u) << args << " -> " << log;
        EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "one line: " << log;
        EXPECT_FALSE(file_exists(out)) << args << " wrote " << out;
    }
}

TEST(PrepareData, HelpPrintsUsage) {
    if (::access(PREPARE_DATA, X_OK) != 0) GTEST_SKIP() << PREPARE_DATA << " not found: run `make prepare_data` first";
    TempDir dir;
    EXPECT_EQ(run_prepare_data("--help", dir.file("log")), 0);
    EXPECT_NE(read_bytes(dir.file("log")).find("--val-fraction"), std::string::npos);
}
