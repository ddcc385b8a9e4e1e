// tests/fuzz/fuzz_state_file.cpp — libFuzzer target: the training-state file
// (model/checkpoint.h's read_state_file, what -y 1 reads). The input is the
// file; the model it is read for has the parameter count the header itself
// claims (fields 40..41), so only the file's size stands between a claim and
// an allocation. A file that loads holds m and v of that count, bit for bit.
#include "model/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"

using namespace knngpt;
using namespace knngpt_fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    uint64_t claimed = 29;  // a 1-layer model of width 1 when there is no header
    if (size >= HEADER_INTS * 4) std::memcpy(&claimed, data + 40 * 4, sizeof(claimed));
    return fuzz_one_file(data, size, [&](const std::string& path, AllocationWatch& watch) {
        TrainState s = read_state_file(path, (size_t)claimed);
        watch.check();
        const size_t n = s.m.size();
        if (n != claimed || s.v.size() != n || size != HEADER_INTS * 4 + 8 * n) fail("moments and file size disagree");
        if ((n && std::memcmp(s.m.data(), data + HEADER_INTS * 4, 4 * n) != 0) ||
            (n && std::memcmp(s.v.data(), data + HEADER_INTS * 4 + 4 * n, 4 * n) != 0))
            fail("moments differ from the file");
        // what the trainer then does with the settings: name them
        (void)attn_description(s.attn);
    });
}
