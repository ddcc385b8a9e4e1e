// tests/fuzz/fuzz_dataloader.cpp — libFuzzer target: the DataLoader over a
// glob of token shards (data/dataloader.h), with a resumed position as a
// training-state file would carry it. Input, front to back: the number of
// shards (1 + b % 4), B (1 + b % 4), T (1 + b % 8), world (1 + b % 3), rank
// (b % (world + 1), so also one past the last), shuffle (b & 1), seed (b),
// vocab (b + 1, or 65536 when b is 0), the position to restore (epoch, shard,
// batch: a byte each), the batches to read (b % 64); then each shard as a
// little-endian uint32 length and that many bytes. Every batch holds tokens
// below the vocab, targets are the inputs shifted by one, and a loader
// restored to a saved position reads the batch it would have read.
#include <filesystem>

#include "data/dataloader.h"
#include "tests/fuzz/fuzz_util.h"

using namespace knngpt;
using namespace knngpt_fuzz;

static void check_batch(const std::vector<int>& inputs, const std::vector<int>& targets, int T, int vocab) {
    for (size_t at = 0; at < inputs.size(); at++) {
        if (inputs[at] >= vocab || targets[at] >= vocab) fail("a token at or past the vocab");
        if ((at + 1) % T != 0 && targets[at] != inputs[at + 1]) fail("targets are not the inputs shifted by one");
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    ByteReader in(data, size);
    const int shards = 1 + in.u8() % 4, B = 1 + in.u8() % 4, T = 1 + in.u8() % 8, world = 1 + in.u8() % 3;
    const int rank = in.u8() % (world + 1);
    const bool shuffle = in.u8() & 1;
    const uint64_t seed = in.u8();
    const uint8_t vocab_byte = in.u8();
    const int vocab = vocab_byte == 0 ? 65536 : vocab_byte + 1;
    DataLoaderState position;
    position.epoch = in.u8(), position.shard_pos = in.u8(), position.batch_pos = in.u8();
    const int reads = in.u8() % 64;

    const std::string dir = scratch_dir();
    for (const auto& entry : std::filesystem::directory_iterator(dir)) std::filesystem::remove(entry.path());
    for (int s = 0; s < shards; s++) {
        auto [bytes, n] = in.bytes(in.u32());
        write_file(dir + "/shard_" + std::to_string(s) + ".bin", bytes, n);
    }
    AllocationWatch watch(size);
    try {
        DataLoader loader(dir + "/shard_*.bin", B, T, rank, world, shuffle, seed, vocab);
        watch.check();
        std::vector<int> inputs((size_t)B * T), targets((size_t)B * T), again((size_t)B * T), again_targets((size_t)B * T);
        try {
            loader.restore(position);
        } catch (const std::runtime_error& e) {
            check_error_line(e);  // a position the data does not have: refused, the loader stays where it was
        }
        for (int k = 0; k < reads; k++) {
            const DataLoaderState saved = loader.state();
            loader.next_batch(inputs.data(), targets.data());
            check_batch(inputs, targets, T, vocab);
            const DataLoaderState after = loader.state();
            loader.restore(saved);
            loader.next_batch(again.data(), again_targets.data());
            if (again != inputs || again_targets != targets) fail("a restored loader read another batch");
            const DataLoaderState after_again = loader.state();
            if (after.epoch != after_again.epoch || after.shard_pos != after_again.shard_pos ||
                after.batch_pos != after_again.batch_pos)
                fail("a restored loader moved to another position");
        }
    } catch (const std::runtime_error& e) {
        check_error_line(e);
    }
    watch.check();
    return 0;
}
