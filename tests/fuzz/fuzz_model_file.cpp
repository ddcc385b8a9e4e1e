// tests/fuzz/fuzz_model_file.cpp — libFuzzer target: llm.c model files,
// versions 3 (fp32) and 5 (bf16), as read_model_file (model/checkpoint.h)
// reads them for -e and -y. The input is the file. A file that loads has a
// valid shape and exactly its shape's parameters, bit for bit what the file
// holds (bf16 widened); any other file is one line of error.
#include "model/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"

using namespace knngpt;
using namespace knngpt_fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return fuzz_one_file(data, size, [&](const std::string& path, AllocationWatch& watch) {
        ModelFile m = read_model_file(path);
        watch.check();
        validate_config(m.config, "fuzz");
        const size_t n = count_parameters(m.config);
        const size_t elem = m.version == 3 ? 4 : 2;
        if (m.params.size() != n || size != HEADER_INTS * 4 + n * elem) fail("parameter count and file size disagree");
        const uint8_t* body = data + HEADER_INTS * 4;
        for (size_t i = 0; i < n; i++) {
            float expected;
            if (m.version == 3) {
                std::memcpy(&expected, body + 4 * i, 4);
            } else {
                uint16_t raw;
                std::memcpy(&raw, body + 2 * i, 2);
                expected = bf16_to_float(raw);
            }
            if (std::memcmp(&expected, &m.params[i], 4) != 0) fail("parameter " + std::to_string(i) + " differs from the file");
        }
    });
}
