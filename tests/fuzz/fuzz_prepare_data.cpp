// tests/fuzz/fuzz_prepare_data.cpp — libFuzzer target: the text prepare_data
// turns into token shards (data/prepare_data.cpp, its run(), byte level). The
// input is the text file. Text that prepares gives two shards whose tokens,
// read back through the shard reader, are the text's bytes: the first 1 - F
// of them in NAME_train.bin, the rest in NAME_val.bin; other text is refused
// with one line.
#include <cstdio>

#define main prepare_data_main
#include "data/prepare_data.cpp"
#undef main
#include "tests/fuzz/fuzz_util.h"

using namespace knngpt_fuzz;

// the tokens of a shard, as the trainer's loader maps them
static std::string shard_text(const std::string& path) {
    knngpt::data_detail::MappedShard shard(path);
    std::string text(shard.num_tokens(), '\0');
    for (size_t i = 0; i < text.size(); i++) {
        if (shard.tokens()[i] > 255) fail(path + ": a byte-level token past 255");
        text[i] = (char)shard.tokens()[i];
    }
    return text;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    if (!std::freopen("/dev/null", "w", stdout)) fail("cannot silence stdout");  // two lines a run
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string dir = scratch_dir(), input = dir + "/input.txt";
    write_file(input, data, size);
    std::remove((dir + "/text_train.bin").c_str());
    std::remove((dir + "/text_val.bin").c_str());
    std::string args[] = {"prepare_data", "--input", input, "--out-dir", dir, "--name", "text"};
    char* argv[] = {args[0].data(), args[1].data(), args[2].data(), args[3].data(), args[4].data(), args[5].data(),
                    args[6].data(), nullptr};
    AllocationWatch watch(size);
    try {
        run(7, argv);
        watch.check();
        const std::string train = shard_text(dir + "/text_train.bin"), val = shard_text(dir + "/text_val.bin");
        if (train + val != std::string((const char*)data, size)) fail("the shards do not hold the text");
        if (val.size() != (size_t)std::llround(size * 0.1)) fail("the validation shard is not the last tenth");
    } catch (const std::runtime_error& e) {
        check_error_line(e);
    }
    watch.check();
    return 0;
}
