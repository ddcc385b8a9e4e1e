// tests/fuzz/fuzz_tokenizer.cpp — libFuzzer target: an llm.c tokenizer file
// (data/tokenizer.h's Tokenizer::from_llmc_file, what --tokenizer reads). The
// input is the file. A file that loads has its header's vocab, an end-of-text
// token inside it (or none), and every token decodes, printable or not.
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace knngpt;
using namespace knngpt_fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return fuzz_one_file(data, size, [&](const std::string& path, AllocationWatch& watch) {
        Tokenizer tok = Tokenizer::from_llmc_file(path);
        watch.check();
        uint32_t vocab;
        std::memcpy(&vocab, data + 8, 4);
        if ((uint32_t)tok.vocab_size() != vocab) fail("vocab size differs from the header's");
        if (tok.eot_token() < -1 || tok.eot_token() >= tok.vocab_size()) fail("end-of-text token outside the vocab");
        size_t bytes = 0;
        for (int t = 0; t < tok.vocab_size(); t++) {
            bytes += tok.decode(t).size();
            if (tok.decode_printable(t).empty() && !tok.decode(t).empty()) fail("a piece that prints as nothing");
        }
        if (TOKENIZER_HEADER_INTS * 4 + tok.vocab_size() + bytes != size) fail("pieces and file size disagree");
        try {
            tok.decode(tok.vocab_size());
            fail("a token past the vocab decoded");
        } catch (const std::runtime_error& e) {
            check_error_line(e);
        }
    });
}
