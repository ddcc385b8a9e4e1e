// tests/fuzz/fuzz_token_shard.cpp — libFuzzer target: one llm.c token shard
// (data/dataloader.h), read through the DataLoader as the trainer's -i and -j
// read it. Input: 4 bytes of loader settings (B = 1 + b0 % 4, T = 1 + b1 % 16,
// vocab = b2 + 1, or 65536 when b2 is 0; b3: shuffle in bit 0, the seed in the
// rest), then the shard file. A shard that loads yields, for one epoch and
// one batch more, batches of tokens below the vocab whose targets are the
// inputs shifted by one; in file order, exactly the file's tokens.
#include "data/dataloader.h"
#include "tests/fuzz/fuzz_util.h"

using namespace knngpt;
using namespace knngpt_fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    ByteReader in(data, size);
    const int B = 1 + in.u8() % 4, T = 1 + in.u8() % 16;
    const uint8_t vocab_byte = in.u8(), order = in.u8();
    const int vocab = vocab_byte == 0 ? 65536 : vocab_byte + 1;
    const bool shuffle = order & 1;
    auto [shard, shard_bytes] = in.bytes(in.remaining());
    MemFile file(shard, shard_bytes);
    AllocationWatch watch(size);
    try {
        DataLoader loader(file.path, B, T, 0, 1, shuffle, order >> 1, vocab);
        watch.check();
        const size_t ntok = loader.num_tokens();
        if (shard_bytes != SHARD_HEADER_BYTES + 2 * ntok) fail("token count and file size disagree");
        const uint16_t* tokens = reinterpret_cast<const uint16_t*>(shard + SHARD_HEADER_BYTES);
        std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
        const size_t batches = loader.batches_per_epoch();
        for (size_t k = 0; k <= batches; k++) {
            loader.next_batch(inputs.data(), targets.data());
            for (int i = 0; i < B; i++)
                for (int t = 0; t < T; t++) {
                    const size_t at = (size_t)i * T + t;
                    if (inputs[at] >= vocab || targets[at] >= vocab) fail("a token at or past the vocab");
                    if (t + 1 < T && targets[at] != inputs[at + 1]) fail("targets are not the inputs shifted by one");
                    if (!shuffle) {
                        uint16_t expected;
                        std::memcpy(&expected, &tokens[((k % batches) * B + i) * T + t], 2);
                        if (inputs[at] != expected) fail("a batch that is not the file's tokens in order");
                    }
                }
        }
    } catch (const std::runtime_error& e) {
        check_error_line(e);
    }
    watch.check();
    return 0;
}
