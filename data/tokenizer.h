// data/tokenizer.h — token ids <-> bytes.
//
// Two kinds:
// - byte level: vocab 256, token t is the byte t, no end-of-text token
//   (eot_token() == -1). Encodes any file, so it is what the prepare tool
//   uses and what the quick start trains on.
// - an llm.c tokenizer file (e.g. GPT-2's BPE vocabulary, for decoding
//   samples of models trained on llm.c's shards). Format: a header of 256
//   little-endian uint32
//     [0] = 20240328 (TOKENIZER_MAGIC), [1] = version (1 or 2),
//     [2] = vocab size, [3] = end-of-text token id (version 2 only; version 1
//     files are GPT-2's and their end-of-text is 50256),
//   then for each token one uint8 length followed by that many bytes.
//   Decoding only: BPE merges are not in the file (data/bpe.h encodes).
//   write_llmc_tokenizer() writes version 2.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace knngpt {

constexpr uint32_t TOKENIZER_MAGIC = 20240328;
constexpr int TOKENIZER_HEADER_INTS = 256;
constexpr int GPT2_EOT_TOKEN = 50256;

class Tokenizer {
 public:
    // Vocab 256; token t <-> byte t; no end-of-text token.
    static Tokenizer byte_level() {
        Tokenizer tok;
        tok.source_ = "byte-level tokenizer";
        tok.byte_level_ = true;
        tok.eot_ = -1;
        tok.pieces_.resize(256);
        for (int t = 0; t < 256; t++) tok.pieces_[t] = std::string(1, (char)(unsigned char)t);
        return tok;
    }

    // The tokens' bytes in id order (e.g. Gpt2Bpe::all_token_bytes()); eot -1 for none.
    // `source` names the vocabulary in error messages.
    static Tokenizer from_pieces(std::vector<std::string> pieces, int eot, std::string source) {
        if (pieces.empty() || pieces.size() > 65536 || eot >= (int)pieces.size())
            throw std::runtime_error(source + ": a vocab of " + std::to_string(pieces.size()) +
                                     " tokens, end-of-text " + std::to_string(eot) + ", is not a tokenizer");
        Tokenizer tok;
        tok.source_ = std::move(source);
        tok.pieces_ = std::move(pieces);
        tok.eot_ = eot;
        return tok;
    }

    // Reads an llm.c tokenizer file (see the opening comment).
    static Tokenizer from_llmc_file(const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
        const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (in.bad()) throw std::runtime_error(path + ": read error");

        const size_t header_bytes = TOKENIZER_HEADER_INTS * sizeof(uint32_t);
        if (bytes.size() < header_bytes)
            throw std::runtime_error(path + ": truncated: file holds " + std::to_string(bytes.size()) +
                                     " bytes, less than the " + std::to_string(header_bytes) +
                                     "-byte header of an llm.c tokenizer file");
        uint32_t header[TOKENIZER_HEADER_INTS];
        std::memcpy(header, bytes.data(), header_bytes);
        if (header[0] != TOKENIZER_MAGIC)
            throw std::runtime_error(path + ": bad magic " + std::to_string(header[0]) + " (expected " +
                                     std::to_string(TOKENIZER_MAGIC) + ", an llm.c tokenizer file)");
        const uint32_t version = header[1];
        if (version != 1 && version != 2)
            throw std::runtime_error(path + ": bad version " + std::to_string(version) +
                                     " (expected 1 or 2)");
        const uint32_t vocab = header[2];
        if (vocab < 1 || vocab > 65536)
            throw std::runtime_error(path + ": bad vocab size " + std::to_string(vocab) +
                                     " (expected 1 to 65536, tokens are uint16 in shards)");

        Tokenizer tok;
        tok.source_ = path;
        if (version == 2) {
            if (header[3] >= vocab)
                throw std::runtime_error(path + ": end-of-text token " + std::to_string(header[3]) +
                                         " is outside the vocab of " + std::to_string(vocab));
            tok.eot_ = (int)header[3];
        } else {
            // version 1 is GPT-2's file; a smaller vocab cannot hold its end-of-text token
            tok.eot_ = (int)vocab > GPT2_EOT_TOKEN ? GPT2_EOT_TOKEN : -1;
        }

        // every token takes at least its length byte: a vocab the file cannot hold is refused before it is reserved
        if (bytes.size() - header_bytes < vocab)
            throw std::runtime_error(path + ": truncated: header says " + std::to_string(vocab) + " tokens, the file holds " +
                                     std::to_string(bytes.size() - header_bytes) + " bytes after the header");
        tok.pieces_.reserve(vocab);
        size_t pos = header_bytes;
        for (uint32_t t = 0; t < vocab; t++) {
            if (pos >= bytes.size())
                throw std::runtime_error(path + ": truncated: header says " + std::to_string(vocab) +
                                         " tokens, file ends before token " + std::to_string(t));
            const size_t len = (unsigned char)bytes[pos++];
            if (pos + len > bytes.size())
                throw std::runtime_error(path + ": truncated: header says " + std::to_string(vocab) +
                                         " tokens, file ends inside token " + std::to_string(t));
            tok.pieces_.emplace_back(bytes, pos, len);
            pos += len;
        }
        if (pos != bytes.size())
            throw std::runtime_error(path + ": " + std::to_string(bytes.size() - pos) +
                                     " unexpected bytes after the last of " + std::to_string(vocab) +
                                     " tokens");
        return tok;
    }

    int vocab_size() const { return (int)pieces_.size(); }
    const std::vector<std::string>& pieces() const { return pieces_; }
    int eot_token() const { return eot_; }
    bool is_byte_level() const { return byte_level_; }

    // The bytes of `token`; throws if it is outside the vocab.
    std::string decode(int token) const {
        if (token < 0 || token >= vocab_size())
            throw std::runtime_error(source_ + ": token " + std::to_string(token) +
                                     " is outside the vocab of " + std::to_string(vocab_size()));
        return pieces_[token];
    }

    // decode(token), except that a token that is a single control byte (other
    // than '\n' and '\t') is shown as an escape such as "\x07", so sampled
    // text prints legibly. Bytes >= 0x80 stay as they are: consecutive tokens
    // form UTF-8 characters.
    std::string decode_printable(int token) const {
        std::string piece = decode(token);
        if (piece.size() != 1) return piece;
        const unsigned char c = (unsigned char)piece[0];
        if (c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7f)) return piece;
        char escaped[8];
        std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
        return escaped;
    }

    // One token per byte of `text`; byte-level tokenizer only.
    std::vector<uint16_t> encode_bytes(const std::string& text) const {
        if (!byte_level_)
            throw std::runtime_error(source_ + ": encode_bytes needs the byte-level tokenizer");
        std::vector<uint16_t> tokens(text.size());
        for (size_t i = 0; i < text.size(); i++) tokens[i] = (unsigned char)text[i];
        return tokens;
    }

 private:
    Tokenizer() = default;

    std::string source_;               // the file it came from, for error messages
    std::vector<std::string> pieces_;  // the bytes of each token
    int eot_ = -1;
    bool byte_level_ = false;
};

// Writes `tok` as an llm.c tokenizer file, version 2 (with its end-of-text
// token; version 2 needs one), to "<path>.tmp" and then renamed into place.
// Throws on a token longer than 255 bytes or an I/O error.
inline void write_llmc_tokenizer(const std::string& path, const Tokenizer& tok) {
    if (tok.eot_token() < 0)
        throw std::runtime_error(path + ": an llm.c tokenizer file (version 2) needs an end-of-text token");
    uint32_t header[TOKENIZER_HEADER_INTS] = {};
    header[0] = TOKENIZER_MAGIC;
    header[1] = 2;
    header[2] = (uint32_t)tok.vocab_size();
    header[3] = (uint32_t)tok.eot_token();
    std::string bytes((const char*)header, sizeof(header));
    for (int t = 0; t < tok.vocab_size(); t++) {
        const std::string& piece = tok.pieces()[t];
        if (piece.size() > 255)
            throw std::runtime_error(path + ": token " + std::to_string(t) + " is longer than 255 bytes");
        bytes.push_back((char)(unsigned char)piece.size());
        bytes += piece;
    }
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary);
        if (!out) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
        out.write(bytes.data(), (std::streamsize)bytes.size());
        out.close();
        if (!out) {
            std::remove(tmp.c_str());
            throw std::runtime_error(path + ": write failed");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        std::remove(tmp.c_str());
        throw std::runtime_error(path + ": cannot rename " + tmp + " into place: " + std::strerror(e));
    }
}

}  // namespace knngpt
