// data/bpe.cpp — GPT-2's byte-level BPE (data/bpe.h says what it computes).
// Compiled once (build/bpe.o) and linked into the programs that encode text,
// so that PCRE2 and the JSON parser stay out of the other translation units.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bpe.h"

#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace knngpt {

namespace {

constexpr uint32_t NO_RANK = UINT32_MAX;

// ---- the byte-to-unicode map (data/bpe.h)

// code point standing for each byte
struct ByteMap {
    uint32_t code_point[256];
    int byte_of[324];  // inverse, -1 where no byte stands (code points 0..323)
    ByteMap() {
        std::fill(std::begin(byte_of), std::end(byte_of), -1);
        int extra = 0;
        for (int b = 0; b < 256; b++) {
            const bool itself = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            code_point[b] = itself ? (uint32_t)b : (uint32_t)(256 + extra++);
            byte_of[code_point[b]] = b;
        }
    }
};
const ByteMap& byte_map() {
    static const ByteMap map;
    return map;
}

// ---- UTF-8

// The length of the character at s[i] when it is valid UTF-8 (1..4), else 0
// and `bad` = the length of its maximal invalid subpart (1..3): the longest
// prefix of a well-formed sequence that starts at s[i], at least one byte.
inline int utf8_length(const unsigned char* s, size_t n, size_t i, int& bad) {
    const unsigned char b = s[i];
    if (b < 0x80) return 1;
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        bad = 1;
        return 0;
    }
    for (int k = 1; k < len; k++) {
        const unsigned char c = i + k < n ? s[i + k] : 0;
        const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
        if (!ok) {
            bad = k;
            return 0;
        }
    }
    return len;
}

bool valid_utf8(std::string_view text) {
    const unsigned char* s = (const unsigned char*)text.data();
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {  // a word of ASCII at a time
            uint64_t w;
            std::memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        int bad = 0;
        const int len = utf8_length(s, n, i, bad);
        if (len == 0) return false;
        i += len;
    }
    return true;
}

// Code points of a UTF-8 string (the vocabulary files'); false if invalid.
bool utf8_code_points(const std::string& s, std::vector<uint32_t>& out) {
    out.clear();
    const unsigned char* p = (const unsigned char*)s.data();
    size_t i = 0;
    while (i < s.size()) {
        int bad = 0;
        const int len = utf8_length(p, s.size(), i, bad);
        if (len == 0) return false;
        uint32_t cp = len == 1 ? p[i] : (uint32_t)(p[i] & (0x7F >> len));
        for (int k = 1; k < len; k++) cp = (cp << 6) | (p[i + k] & 0x3F);
        out.push_back(cp);
        i += len;
    }
    return true;
}

// The bytes a vocabulary string stands for, or false if a character is no byte's stand-in.
bool unmap_bytes(const std::string& s, std::string& bytes) {
    static thread_local std::vector<uint32_t> cps;
    if (!utf8_code_points(s, cps)) return false;
    bytes.clear();
    for (uint32_t cp : cps) {
        if (cp >= 324 || byte_map().byte_of[cp] < 0) return false;
        bytes.push_back((char)byte_map().byte_of[cp]);
    }
    return true;
}

std::string read_whole_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw std::runtime_error(path + ": read error");
    return text;
}

// ---- hashing

inline uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

inline uint64_t hash_bytes(const char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xc4ceb9fe1a85ec53ull);
    while (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h = mix64(h ^ w);
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    return mix64(h ^ w);
}

// The merges: (left id, right id) -> (rank, merged id), open addressing.
class PairTable {
 public:
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < 2 * n) cap *= 2;
        slots_.assign(cap, Slot{});
        mask_ = cap - 1;
    }
    // false if the pair is there already
    bool insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
        const uint64_t key = key_of(a, b);
        for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
            if (slots_[i].rank == NO_RANK) {
                slots_[i] = Slot{key, rank, merged};
                return true;
            }
            if (slots_[i].key == key) return false;
        }
    }
    // the rank of merging a and b (NO_RANK if they do not merge), and the merged id
    inline uint32_t find(uint32_t a, uint32_t b, uint32_t* merged) const {
        const uint64_t key = key_of(a, b);
        for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.rank == NO_RANK) return NO_RANK;
            if (s.key == key) {
                *merged = s.merged;
                return s.rank;
            }
        }
    }

 private:
    struct Slot {
        uint64_t key = 0;
        uint32_t rank = NO_RANK, merged = 0;
    };
    static uint64_t key_of(uint32_t a, uint32_t b) { return ((uint64_t)a << 32) | b; }
    std::vector<Slot> slots_;
    size_t mask_ = 0;
};

// The pattern of data/bpe.h step 2, \s spelled out as JavaScript's white space.
std::string gpt2_pattern() {
    const std::string s = "\\t-\\r\\p{Zs}\\x{2028}\\x{2029}\\x{FEFF}";  // inside a class
    return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + s + "\\p{L}\\p{N}]+|[" + s + "]+(?![^" + s +
           "])|[" + s + "]+";
}

}  // namespace

// ---- the vocabulary

struct Gpt2Bpe::Impl {
    std::vector<std::string> token_bytes;  // by id
    uint32_t byte_token[256];              // the id of each single byte
    PairTable merges;
    int eot = -1;
    pcre2_code* pattern = nullptr;

    ~Impl() {
        if (pattern) pcre2_code_free(pattern);
    }
};

Gpt2Bpe::Gpt2Bpe(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Bpe::Gpt2Bpe(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe& Gpt2Bpe::operator=(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe::~Gpt2Bpe() = default;

Gpt2Bpe Gpt2Bpe::load(const std::string& dir) {
    auto impl = std::make_unique<Impl>();
    const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";

    // encoder.json: token string -> id
    const std::string enc_path = base + "encoder.json";
    const std::string enc_text = read_whole_file(enc_path);
    nlohmann::json enc;
    try {
        enc = nlohmann::json::parse(enc_text);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(enc_path + ": not valid JSON: " + e.what());
    }
    if (!enc.is_object() || enc.size() != (size_t)GPT2_VOCAB_SIZE)
        throw std::runtime_error(enc_path + ": expected a JSON object of " + std::to_string(GPT2_VOCAB_SIZE) +
                                 " tokens (GPT-2's encoder.json), found " +
                                 (enc.is_object() ? std::to_string(enc.size()) + " entries" : "no object"));
    impl->token_bytes.assign(GPT2_VOCAB_SIZE, std::string());
    std::vector<bool> seen(GPT2_VOCAB_SIZE, false);
    std::unordered_map<std::string, uint32_t> id_of;  // token bytes -> id
    id_of.reserve(2 * GPT2_VOCAB_SIZE);
    std::string bytes;
    for (auto it = enc.begin(); it != enc.end(); ++it) {
        const std::string& key = it.key();
        if (!it.value().is_number_integer())
            throw std::runtime_error(enc_path + ": the id of \"" + key + "\" is not an integer");
        const long id = it.value().get<long>();
        if (id < 0 || id >= GPT2_VOCAB_SIZE)
            throw std::runtime_error(enc_path + ": id " + std::to_string(id) + " of \"" + key +
                                     "\" is outside 0.." + std::to_string(GPT2_VOCAB_SIZE - 1));
        if (seen[id]) throw std::runtime_error(enc_path + ": id " + std::to_string(id) + " appears twice");
        seen[id] = true;
        if (key == GPT2_EOT_TEXT) {
            impl->eot = (int)id;
            impl->token_bytes[id] = key;
            continue;
        }
        if (!unmap_bytes(key, bytes))
            throw std::runtime_error(enc_path + ": token " + std::to_string(id) +
                                     " is not spelled in the byte-to-unicode map of GPT-2's files");
        impl->token_bytes[id] = bytes;
        if (!id_of.emplace(bytes, (uint32_t)id).second)
            throw std::runtime_error(enc_path + ": two tokens spell the same bytes (id " + std::to_string(id) + ")");
    }
    if (impl->eot != GPT2_VOCAB_SIZE - 1)
        throw std::runtime_error(enc_path + ": no \"<|endoftext|>\" token of id " +
                                 std::to_string(GPT2_VOCAB_SIZE - 1));
    for (int b = 0; b < 256; b++) {
        auto it = id_of.find(std::string(1, (char)b));
        if (it == id_of.end())
            throw std::runtime_error(enc_path + ": no token for the single byte " + std::to_string(b));
        impl->byte_token[b] = it->second;
    }

    // vocab.bpe: the merges in rank order
    const std::string bpe_path = base + "vocab.bpe";
    const std::string bpe_text = read_whole_file(bpe_path);
    if (bpe_text.compare(0, 9, "#version:") != 0)
        throw std::runtime_error(bpe_path + ": does not start with \"#version:\" (GPT-2's vocab.bpe)");
    impl->merges.reserve(GPT2_VOCAB_SIZE);
    size_t pos = bpe_text.find('\n');
    uint32_t rank = 0;
    std::string left, right;
    for (size_t line_no = 2; pos != std::string::npos && pos + 1 < bpe_text.size(); line_no++) {
        const size_t begin = pos + 1;
        size_t end = bpe_text.find('\n', begin);
        pos = end;
        if (end == std::string::npos) end = bpe_text.size();
        std::string line = bpe_text.substr(begin, end - begin);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        const std::string where = bpe_path + ": line " + std::to_string(line_no) + ": ";
        const size_t space = line.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 >= line.size() ||
            line.find(' ', space + 1) != std::string::npos)
            throw std::runtime_error(where + "expected two tokens separated by one space");
        if (!unmap_bytes(line.substr(0, space), left) || !unmap_bytes(line.substr(space + 1), right))
            throw std::runtime_error(where + "not spelled in the byte-to-unicode map of GPT-2's files");
        auto a = id_of.find(left), b = id_of.find(right), ab = id_of.find(left + right);
        if (a == id_of.end() || b == id_of.end() || ab == id_of.end())
            throw std::runtime_error(where + "merges tokens that encoder.json does not hold");
        if (!impl->merges.insert(a->second, b->second, rank, ab->second))
            throw std::runtime_error(where + "the same merge appears twice");
        rank++;
    }
    if (rank == 0) throw std::runtime_error(bpe_path + ": no merges");

    // the pattern, compiled once, anchored: each match starts where the last ended
    int err = 0;
    PCRE2_SIZE err_at = 0;
    const std::string pat = gpt2_pattern();
    impl->pattern = pcre2_compile((PCRE2_SPTR)pat.c_str(), pat.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err,
                                  &err_at, nullptr);
    if (!impl->pattern) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        throw std::runtime_error(std::string("GPT-2's pattern does not compile in PCRE2: ") + (const char*)msg);
    }
    if (pcre2_jit_compile(impl->pattern, PCRE2_JIT_COMPLETE) != 0)
        throw std::runtime_error("PCRE2 cannot JIT-compile GPT-2's pattern (PCRE2 built without JIT?)");
    return Gpt2Bpe(std::move(impl));
}

int Gpt2Bpe::vocab_size() const { return (int)impl_->token_bytes.size(); }
int Gpt2Bpe::eot_token() const { return impl_->eot; }

const std::string& Gpt2Bpe::token_bytes(int id) const {
    if (id < 0 || id >= vocab_size())
        throw std::runtime_error("GPT-2 BPE: token " + std::to_string(id) + " is outside the vocab of " +
                                 std::to_string(vocab_size()));
    return impl_->token_bytes[id];
}

const std::vector<std::string>& Gpt2Bpe::all_token_bytes() const { return impl_->token_bytes; }

std::vector<uint16_t> Gpt2Bpe::encode(std::string_view text) const {
    std::vector<uint16_t> out;
    BpeEncoder(*this).encode(text, out, true);
    return out;
}

std::vector<uint16_t> Gpt2Bpe::encode_ordinary(std::string_view text) const {
    std::vector<uint16_t> out;
    BpeEncoder(*this).encode(text, out, false);
    return out;
}

std::string Gpt2Bpe::decode(const std::vector<uint16_t>& ids) const {
    std::string text;
    for (uint16_t id : ids) text += token_bytes(id);
    return text;
}

// Is p a cut (data/bpe.h, safe_cuts)? 0 < p < text.size().
static bool is_safe_cut(std::string_view text, size_t p) {
    const auto printable = [](char c) { return c > 0x20 && c < 0x7F; };  // ASCII, not space
    const auto alnum = [](char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); };
    const char before = text[p - 1], after = text[p];
    if (before == '\n') return p >= 2 && printable(text[p - 2]) && printable(after);
    return alnum(before) && (after == '.' || after == ',' || after == ';' || after == ':' || after == '!' || after == '?');
}

std::vector<size_t> Gpt2Bpe::safe_cuts(std::string_view text, size_t chunk_bytes) {
    std::vector<size_t> cuts;
    if (chunk_bytes == 0) chunk_bytes = 1;
    for (size_t target = chunk_bytes; target < text.size();) {
        size_t p = target;
        while (p < text.size() && !is_safe_cut(text, p)) p++;
        if (p >= text.size()) break;
        cuts.push_back(p);
        target = (p / chunk_bytes + 1) * chunk_bytes;
    }
    return cuts;
}

std::vector<uint16_t> Gpt2Bpe::encode_parallel(std::string_view text, int threads) const {
    if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
    if (threads == 1) return encode(text);
    // parts of a 16th of a thread's share, at least 64 KiB
    const size_t chunk = std::max<size_t>(64 << 10, text.size() / ((size_t)threads * 16) + 1);
    std::vector<size_t> bounds = safe_cuts(text, chunk);
    bounds.insert(bounds.begin(), 0);
    bounds.push_back(text.size());
    const size_t parts = bounds.size() - 1;
    std::vector<std::vector<uint16_t>> ids(parts);
    std::atomic<size_t> next{0};
    auto work = [&]() {
        BpeEncoder encoder(*this);
        // Encoded into this thread's vector, then copied: appending to ids[i]
        // itself would write its end pointer at every token, on a cache line
        // that ids[i + 1], filled by another thread, shares.
        std::vector<uint16_t> part;
        for (size_t i; (i = next.fetch_add(1)) < parts;) {
            part.clear();
            encoder.encode(text.substr(bounds[i], bounds[i + 1] - bounds[i]), part, true);
            ids[i].assign(part.begin(), part.end());
        }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < std::min<int>(threads, (int)parts); t++) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    std::vector<uint16_t> out;
    size_t total = 0;
    for (const auto& v : ids) total += v.size();
    out.reserve(total);
    for (const auto& v : ids) out.insert(out.end(), v.begin(), v.end());
    return out;
}

// ---- one thread's encoder

namespace {

// Recently encoded pieces: bytes -> ids, open addressing over two arenas.
// Cleared when full (the text's common words come back at once).
class PieceCache {
 public:
    static constexpr size_t MAX_ENTRIES = 1 << 19, MAX_KEY = 128;

    PieceCache() { clear(1 << 14); }

    // the ids of the piece, or nullptr; *len = how many
    const uint16_t* find(const char* p, size_t n, uint64_t h, size_t* len) const {
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.key_len == 0) return nullptr;
            if (s.hash == h && s.key_len == n && std::memcmp(keys_.data() + s.key_off, p, n) == 0) {
                *len = s.val_len;
                return vals_.data() + s.val_off;
            }
        }
    }

    void insert(const char* p, size_t n, uint64_t h, const uint16_t* ids, size_t len) {
        if (n > MAX_KEY || n == 0) return;
        if (count_ >= MAX_ENTRIES) clear(slots_.size());
        else if (2 * (count_ + 1) > slots_.size()) grow();
        Slot s{h, (uint32_t)keys_.size(), (uint32_t)n, (uint32_t)vals_.size(), (uint32_t)len};
        keys_.append(p, n);
        vals_.insert(vals_.end(), ids, ids + len);
        place(s);
        count_++;
    }

 private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t key_off = 0, key_len = 0, val_off = 0, val_len = 0;
    };
    void clear(size_t cap) {
        slots_.assign(cap, Slot{});
        mask_ = cap - 1;
        keys_.clear();
        vals_.clear();
        count_ = 0;
    }
    void place(const Slot& s) {
        size_t i = s.hash & mask_;
        while (slots_[i].key_len != 0) i = (i + 1) & mask_;
        slots_[i] = s;
    }
    void grow() {
        std::vector<Slot> old;
        old.swap(slots_);
        slots_.assign(old.size() * 2, Slot{});
        mask_ = slots_.size() - 1;
        for (const Slot& s : old)
            if (s.key_len != 0) place(s);
    }
    std::vector<Slot> slots_;
    size_t mask_ = 0, count_ = 0;
    std::string keys_;
    std::vector<uint16_t> vals_;
};

}  // namespace

struct BpeEncoder::State {
    const Gpt2Bpe::Impl* bpe;
    pcre2_match_data* match = nullptr;
    pcre2_match_context* context = nullptr;
    pcre2_jit_stack* jit_stack = nullptr;
    PieceCache cache;
    std::vector<uint32_t> ids, ranks;  // the merge loop's symbols and pair ranks
    std::string sanitized;             // invalid UTF-8: the text with U+FFFD for each maximal subpart
    std::vector<std::pair<size_t, size_t>> breaks;  // (sanitized offset, original offset) after each U+FFFD

    ~State() {
        if (match) pcre2_match_data_free(match);
        if (context) pcre2_match_context_free(context);
        if (jit_stack) pcre2_jit_stack_free(jit_stack);
    }

    // Calls piece(begin, end) for each piece of `text` (no special tokens), in order.
    template <class F>
    void for_each_piece(std::string_view text, F&& piece) {
        if (valid_utf8(text)) {
            match_pieces(text, [&](size_t b, size_t e) { piece(b, e); });
            return;
        }
        // the pieces of the text as the references decode it, each invalid
        // subpart one U+FFFD, mapped back to the original bytes
        sanitized.clear();
        breaks.assign(1, {0, 0});
        const unsigned char* s = (const unsigned char*)text.data();
        for (size_t i = 0; i < text.size();) {
            int bad = 0;
            const int len = utf8_length(s, text.size(), i, bad);
            if (len > 0) {
                sanitized.append(text.data() + i, len);
                i += len;
            } else {
                sanitized.append("\xEF\xBF\xBD");
                i += bad;
                breaks.emplace_back(sanitized.size(), i);
            }
        }
        const auto original = [&](size_t p) {  // pieces never end inside a U+FFFD
            auto it = std::upper_bound(breaks.begin(), breaks.end(), std::make_pair(p, SIZE_MAX)) - 1;
            return it->second + (p - it->first);
        };
        match_pieces(sanitized, [&](size_t b, size_t e) { piece(original(b), original(e)); });
    }

    // The pattern's matches over valid UTF-8 `text`.
    template <class F>
    void match_pieces(std::string_view text, F&& piece) {
        const PCRE2_SPTR subject = (PCRE2_SPTR)text.data();
        size_t pos = 0;
        while (pos < text.size()) {
            const int rc = pcre2_jit_match(bpe->pattern, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match, context);
            if (rc < 0) throw std::runtime_error("GPT-2 BPE: the pattern matched nothing at byte " + std::to_string(pos));
            const PCRE2_SIZE end = pcre2_get_ovector_pointer(match)[1];
            if (end <= pos) throw std::runtime_error("GPT-2 BPE: the pattern matched nothing at byte " + std::to_string(pos));
            piece(pos, end);
            pos = end;
        }
    }

    // Appends the ids of one piece.
    void encode_piece(const char* p, size_t n, std::vector<uint16_t>& out) {
        if (n == 1) {
            out.push_back((uint16_t)bpe->byte_token[(unsigned char)p[0]]);
            return;
        }
        const uint64_t h = hash_bytes(p, n);
        size_t len = 0;
        if (const uint16_t* hit = cache.find(p, n, h, &len)) {
            out.insert(out.end(), hit, hit + len);
            return;
        }
        ids.resize(n);
        for (size_t i = 0; i < n; i++) ids[i] = bpe->byte_token[(unsigned char)p[i]];
        if (n <= 64) merge_short();
        else merge_long();
        const size_t first = out.size();
        for (uint32_t id : ids) out.push_back((uint16_t)id);
        cache.insert(p, n, h, out.data() + first, ids.size());
    }

    // The merges on `ids`: the lowest-ranked adjacent pair, leftmost first, until none is a merge.
    // Short pieces: a scan for the minimum each time.
    void merge_short() {
        uint32_t merged = 0;
        ranks.resize(ids.size() - 1);
        for (size_t i = 0; i + 1 < ids.size(); i++) ranks[i] = bpe->merges.find(ids[i], ids[i + 1], &merged);
        while (!ranks.empty()) {
            size_t best = 0;
            for (size_t i = 1; i < ranks.size(); i++)
                if (ranks[i] < ranks[best]) best = i;
            if (ranks[best] == NO_RANK) break;
            bpe->merges.find(ids[best], ids[best + 1], &merged);
            ids[best] = merged;
            ids.erase(ids.begin() + best + 1);
            ranks.erase(ranks.begin() + best);
            if (best > 0) ranks[best - 1] = bpe->merges.find(ids[best - 1], ids[best], &merged);
            if (best < ranks.size()) ranks[best] = bpe->merges.find(ids[best], ids[best + 1], &merged);
        }
    }

    // Long pieces (runs of one character, long numbers): the same merges in
    // O(n log n), a linked list of symbols and a heap of candidate pairs keyed
    // (rank, position of the left symbol); an entry whose symbols changed is
    // stale and skipped.
    void merge_long() {
        const size_t n = ids.size();
        std::vector<int> prev(n), next(n);
        for (size_t i = 0; i < n; i++) prev[i] = (int)i - 1, next[i] = i + 1 < n ? (int)i + 1 : -1;
        struct Pair {
            uint32_t rank;
            int left;
            uint32_t a, b;
            bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
        };
        std::priority_queue<Pair, std::vector<Pair>, std::greater<Pair>> heap;
        uint32_t merged = 0;
        const auto push = [&](int l) {
            if (l < 0 || next[l] < 0) return;
            const uint32_t r = bpe->merges.find(ids[l], ids[next[l]], &merged);
            if (r != NO_RANK) heap.push(Pair{r, l, ids[l], ids[next[l]]});
        };
        for (size_t i = 0; i + 1 < n; i++) push((int)i);
        constexpr uint32_t GONE = UINT32_MAX;
        while (!heap.empty()) {
            const Pair top = heap.top();
            heap.pop();
            const int l = top.left, r = next[l];
            if (ids[l] != top.a || r < 0 || ids[r] != top.b) continue;  // stale
            bpe->merges.find(top.a, top.b, &merged);
            ids[l] = merged;
            ids[r] = GONE;
            next[l] = next[r];
            if (next[r] >= 0) prev[next[r]] = l;
            push(prev[l]);
            push(l);
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (ids[i] != GONE) ids[k++] = ids[i];
        ids.resize(k);
    }
};

BpeEncoder::BpeEncoder(const Gpt2Bpe& bpe) : state_(std::make_unique<State>()) {
    state_->bpe = bpe.impl_.get();
    state_->match = pcre2_match_data_create_from_pattern(state_->bpe->pattern, nullptr);
    state_->context = pcre2_match_context_create(nullptr);
    // room for the lookahead's backtracking over long runs of white space
    state_->jit_stack = pcre2_jit_stack_create(64 << 10, 8 << 20, nullptr);
    if (!state_->match || !state_->context || !state_->jit_stack) throw std::bad_alloc();
    pcre2_jit_stack_assign(state_->context, nullptr, state_->jit_stack);
}
BpeEncoder::BpeEncoder(BpeEncoder&&) noexcept = default;
BpeEncoder::~BpeEncoder() = default;

void BpeEncoder::encode(std::string_view text, std::vector<uint16_t>& out, bool allow_special) {
    State& s = *state_;
    const auto ordinary = [&](std::string_view part) {
        s.for_each_piece(part, [&](size_t b, size_t e) { s.encode_piece(part.data() + b, e - b, out); });
    };
    if (!allow_special) {
        ordinary(text);
        return;
    }
    const std::string_view eot(GPT2_EOT_TEXT);
    size_t start = 0;
    for (size_t at; (at = text.find(eot, start)) != std::string_view::npos; start = at + eot.size()) {
        ordinary(text.substr(start, at - start));
        out.push_back((uint16_t)s.bpe->eot);
    }
    ordinary(text.substr(start));
}

void BpeEncoder::encode_piece(std::string_view piece, std::vector<uint16_t>& out) {
    if (!piece.empty()) state_->encode_piece(piece.data(), piece.size(), out);
}

std::vector<std::pair<size_t, size_t>> BpeEncoder::pieces(std::string_view text) {
    std::vector<std::pair<size_t, size_t>> out;
    state_->for_each_piece(text, [&](size_t b, size_t e) { out.emplace_back(b, e); });
    return out;
}

}  // namespace knngpt
