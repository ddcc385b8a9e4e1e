// tests/test_model.cpp — the whole model against PyTorch, and the checkpoint
// formats. The expected tensors come from tests/reference/gpt2_reference.py
// (an independent PyTorch GPT-2 in float64), which `make test` runs into
// build/reference/ when python3-torch is installed.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "model/checkpoint.h"
#include "model/gpt.h"
#include "tests/test_util.h"

using namespace knngpt;
using knngpt_test::max_rel_error;

namespace {

// One record of expected.bin: name, dtype (0 f32, 1 i32, 2 f64), dims, data widened to double.
struct Record {
    std::vector<int> dims;
    std::vector<double> data;
};

std::map<std::string, Record> read_records(const std::string& path) {
    std::map<std::string, Record> out;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return out;
    int32_t len;
    while (fread(&len, 4, 1, f) == 1) {
        std::string name(len, '\0');
        int32_t dtype, ndim;
        EXPECT_EQ(fread(&name[0], 1, len, f), (size_t)len);
        EXPECT_EQ(fread(&dtype, 4, 1, f), 1u);
        EXPECT_EQ(fread(&ndim, 4, 1, f), 1u);
        Record r;
        r.dims.resize(ndim);
        size_t n = 1;
        for (int i = 0; i < ndim; i++) {
            EXPECT_EQ(fread(&r.dims[i], 4, 1, f), 1u);
            n *= r.dims[i];
        }
        r.data.resize(n);
        for (size_t i = 0; i < n; i++) {
            if (dtype == 0) { float x; EXPECT_EQ(fread(&x, 4, 1, f), 1u); r.data[i] = x; }
            else if (dtype == 1) { int32_t x; EXPECT_EQ(fread(&x, 4, 1, f), 1u); r.data[i] = x; }
            else { double x; EXPECT_EQ(fread(&x, 8, 1, f), 1u); r.data[i] = x; }
        }
        out[name] = std::move(r);
    }
    fclose(f);
    return out;
}

std::string reference_dir() { return knngpt_test::build_dir() + "/reference"; }

#define REQUIRE_REFERENCE(records)                                                                     \
    if ((records).empty())                                                                              \
    GTEST_SKIP() << "no PyTorch reference in " << reference_dir()                                       \
                 << " (install python3-torch and run `make reference`)"

std::vector<int> as_ints(const Record& r) { return std::vector<int>(r.data.begin(), r.data.end()); }

class ModelVsPyTorch : public ::testing::Test {
  protected:
    std::map<std::string, Record> expected;
    int V = 0, Vp = 0, B = 0, T = 0;
    void SetUp() override {
        expected = read_records(reference_dir() + "/expected.bin");
        if (expected.empty()) return;
        const auto& c = expected.at("config").data;  // {V, Vp, maxT, L, NH, C, B, T}
        V = (int)c[0], Vp = (int)c[1], B = (int)c[6], T = (int)c[7];
    }
    void build(GPT& model, const std::string& file) {
        ModelFile mf = read_model_file(reference_dir() + "/" + file);
        gpt_build(model, mf.config, mf.params, B, T);
    }
};

}  // namespace

// Relative tolerances: fp32 has a 24-bit mantissa (6e-8); the tiny model's
// sums run over at most 4C = 128 terms per layer, through 2 layers, so
// accumulated rounding stays well below 1e-5 of each tensor's largest entry.
constexpr double FP32_TOL = 1e-5;

TEST_F(ModelVsPyTorch, LogitsAndLossMatch) {
    REQUIRE_REFERENCE(expected);
    GPT model;
    build(model, "model.bin");
    auto inputs = as_ints(expected.at("inputs")), targets = as_ints(expected.at("targets"));
    gpt_forward(model, inputs.data(), targets.data(), B, T, 0);
    // compare the first V of each Vp logits
    std::vector<float> logits((size_t)B * T * V);
    std::vector<float> row(Vp);
    for (int bt = 0; bt < B * T; bt++) {
        gpt_logits_at(model, bt / T, bt % T, row.data());
        std::copy(row.begin(), row.begin() + V, logits.begin() + (size_t)bt * V);
    }
    EXPECT_LT(max_rel_error(logits.data(), expected.at("logits").data.data(), logits.size()), FP32_TOL);
    EXPECT_NEAR(model.mean_loss, expected.at("loss").data[0], FP32_TOL * expected.at("loss").data[0]);
}

TEST_F(ModelVsPyTorch, EveryParameterGradientMatches) {
    REQUIRE_REFERENCE(expected);
    GPT model;
    build(model, "model.bin");
    auto inputs = as_ints(expected.at("inputs")), targets = as_ints(expected.at("targets"));
    gpt_zero_grad(model);
    gpt_forward(model, inputs.data(), targets.data(), B, T, 0);
    gpt_backward(model, 1.0f / (B * T));
    std::vector<float> grads(model.num_parameters);
    ops::copy_to_host(grads.data(), model.grads_memory, grads.size() * sizeof(float));
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const Record& r = expected.at(std::string("grad_") + PARAMETER_NAMES[i]);
        ASSERT_EQ(r.data.size(), model.param_sizes[i]) << PARAMETER_NAMES[i];
        double err = max_rel_error(grads.data() + offset, r.data.data(), r.data.size());
        EXPECT_LT(err, FP32_TOL) << "gradient of " << PARAMETER_NAMES[i];
        offset += model.param_sizes[i];
    }
    // the padded rows of wte never receive gradient
    for (size_t i = (size_t)V * model.config.channels; i < (size_t)Vp * model.config.channels; i++)
        ASSERT_EQ(grads[i], 0.0f);
}

TEST_F(ModelVsPyTorch, TenAdamWStepsMatchLossesNormsAndParameters) {
    REQUIRE_REFERENCE(expected);
    GPT model;
    build(model, "model.bin");
    auto inputs = as_ints(expected.at("inputs")), targets = as_ints(expected.at("targets"));
    AdamWConfig opt;
    opt.beta1 = 0.9f, opt.beta2 = 0.95f, opt.eps = 1e-8f, opt.weight_decay = 0.1f, opt.grad_clip = 1.0f;
    const auto& losses = expected.at("adamw_losses").data;
    const auto& norms = expected.at("adamw_grad_norms").data;
    for (int step = 0; step < 10; step++) {
        gpt_zero_grad(model);
        gpt_forward(model, inputs.data(), targets.data(), B, T, 0);
        gpt_backward(model, 1.0f / (B * T));
        float norm = gpt_update(model, 1e-2f, opt, step + 1);
        EXPECT_NEAR(model.mean_loss, losses[step], FP32_TOL * losses[step]) << "step " << step;
        EXPECT_NEAR(norm, norms[step], FP32_TOL * norms[step]) << "step " << step;
    }
    // Final parameters. The key bias is left out: its exact gradient is zero
    // (adding a constant to every score of a softmax row changes nothing), so
    // both implementations only see rounding noise there, which Adam
    // normalises into steps of size ~lr with arbitrary sign. Everything else
    // must agree norm-wise. (PyTorch clips with 1 / (norm + 1e-6), we with
    // 1 / norm: a 1e-6 relative difference, well inside the tolerance.)
    std::vector<float> params = gpt_host_parameters(model);
    const auto& final_params = expected.at("adamw_final_params").data;
    ASSERT_EQ(params.size(), final_params.size());
    const size_t C = model.config.channels, qkvb_offset = model.params.qkvb - model.params_memory;
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < params.size(); i++) {
        bool key_bias = i >= qkvb_offset && i < qkvb_offset + model.param_sizes[5] && (i - qkvb_offset) % (3 * C) / C == 1;
        if (key_bias) continue;
        diff2 += (params[i] - final_params[i]) * (params[i] - final_params[i]);
        ref2 += final_params[i] * final_params[i];
    }
    EXPECT_LT(std::sqrt(diff2 / ref2), 5e-5);
    const auto& key_bias_grad = expected.at("grad_qkvb").data;
    for (int l = 0; l < model.config.num_layers; l++)
        for (size_t c = 0; c < C; c++) ASSERT_NEAR(key_bias_grad[l * 3 * C + C + c], 0.0, 1e-12);
}

TEST_F(ModelVsPyTorch, Bf16CheckpointReadsAsRoundedParameters) {
    REQUIRE_REFERENCE(expected);
    ModelFile mf = read_model_file(reference_dir() + "/model_bf16.bin");
    EXPECT_EQ(mf.version, 5);
    const auto& want = expected.at("params_bf16").data;
    ASSERT_EQ(mf.params.size(), want.size());
    for (size_t i = 0; i < want.size(); i++) ASSERT_EQ(mf.params[i], (float)want[i]) << "parameter " << i;
}

// ---------------------------------------------------------------------------
// Checkpoint files (no reference needed)

namespace {
GPTConfig tiny_config() {
    GPTConfig c;
    c.max_seq_len = 8, c.vocab_size = 30, c.padded_vocab_size = 32, c.num_layers = 2, c.num_heads = 2, c.channels = 8;
    return c;
}
}  // namespace

TEST(Checkpoint, ModelFileRoundTripIsExact) {
    knngpt_test::TempDir dir;
    GPTConfig c = tiny_config();
    std::vector<float> params = gpt_random_init(c, 7);
    write_model_file(dir.file("m.bin"), c, params);
    ModelFile back = read_model_file(dir.file("m.bin"));
    EXPECT_EQ(back.version, 3);
    EXPECT_EQ(back.config.num_layers, 2);
    EXPECT_EQ(back.config.padded_vocab_size, 32);
    EXPECT_EQ(back.params, params);
    EXPECT_FALSE(std::ifstream(dir.file("m.bin.tmp")).good()) << "temporary file left behind";
}

TEST(Checkpoint, StateFileRoundTripIsExact) {
    knngpt_test::TempDir dir;
    TrainState s;
    s.step = 42, s.shuffle = true, s.rng_state = 0x123456789abcdefull;
    s.data_epoch = 3, s.data_shard_pos = 1, s.data_batch_pos = 17;
    s.m = {1.f, 2.f, 3.f}, s.v = {4.f, 5.f, 6.f};
    write_state_file(dir.file("s.bin"), s);
    TrainState back = read_state_file(dir.file("s.bin"), 3);
    EXPECT_EQ(back.step, 42);
    EXPECT_TRUE(back.shuffle);
    EXPECT_EQ(back.rng_state, s.rng_state);
    EXPECT_EQ(back.data_epoch, 3u);
    EXPECT_EQ(back.data_shard_pos, 1u);
    EXPECT_EQ(back.data_batch_pos, 17u);
    EXPECT_EQ(back.m, s.m);
    EXPECT_EQ(back.v, s.v);
    EXPECT_THROW(read_state_file(dir.file("s.bin"), 4), std::runtime_error);  // parameter count mismatch
    EXPECT_EQ(back.attn.kmv_levels, 1);
    EXPECT_EQ(back.attn.kmv_alpha, 1.0f / 3);
    // kmv's settings travel with the state (a resume compares their description with
    // its own and says so when they differ)
    s.attn.mode = AttnMode::Kmv, s.attn.tail = 4, s.attn.kmv_threshold = KmvThreshold::Relative;
    s.attn.kmv_levels = 4, s.attn.kmv_alpha = 0.75f;
    write_state_file(dir.file("kmv.bin"), s);
    back = read_state_file(dir.file("kmv.bin"), 3);
    EXPECT_EQ(back.attn.kmv_threshold, KmvThreshold::Relative);
    EXPECT_EQ(back.attn.kmv_levels, 4);
    EXPECT_EQ(back.attn.kmv_alpha, 0.75f);
    EXPECT_EQ(attn_description(back.attn), attn_description(s.attn));
    // files from before the width levels and alpha fields hold 0 in slots 63 and 64,
    // which read as the defaults (the checksum then no longer matches: read unverified)
    {
        std::fstream f(dir.file("kmv.bin"), std::ios::in | std::ios::out | std::ios::binary);
        const int zero[2] = {0, 0};
        f.seekp(63 * sizeof(int));
        f.write(reinterpret_cast<const char*>(zero), sizeof(zero));
    }
    back = read_state_file(dir.file("kmv.bin"), 3, false);
    EXPECT_EQ(back.attn.kmv_levels, 1);
    EXPECT_EQ(back.attn.kmv_alpha, 1.0f / 3);
    EXPECT_EQ(back.attn.kmv_threshold, KmvThreshold::Relative);
}

TEST(Checkpoint, RandomInitFollowsGpt2Scheme) {
    GPTConfig c = tiny_config();
    c.channels = 64, c.num_heads = 4, c.vocab_size = 100, c.padded_vocab_size = 128, c.max_seq_len = 64;
    std::vector<float> params = gpt_random_init(c, 1);
    ParameterTensors p = point_parameters(params.data(), c);
    auto stddev = [](const float* x, size_t n) {
        double s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++) s += x[i], s2 += (double)x[i] * x[i];
        return std::sqrt(s2 / n - (s / n) * (s / n));
    };
    size_t C = c.channels, L = c.num_layers;
    EXPECT_NEAR(stddev(p.qkvw, L * 3 * C * C), 0.02, 0.001);
    EXPECT_NEAR(stddev(p.fcprojw, L * 4 * C * C), 0.02 / std::sqrt(2.0 * L), 0.001);
    for (size_t i = (size_t)c.vocab_size * C; i < (size_t)c.padded_vocab_size * C; i++) ASSERT_EQ(p.wte[i], 0.0f);
    for (size_t i = 0; i < L * C; i++) {
        ASSERT_EQ(p.ln1w[i], 1.0f);
        ASSERT_EQ(p.ln1b[i], 0.0f);
    }
    EXPECT_EQ(gpt_random_init(c, 1), params);  // the seed fixes the model
    EXPECT_NE(gpt_random_init(c, 2), params);
}

namespace {
// Writes raw bytes to a file.
void write_bytes(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}
std::vector<char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
// The message read_model_file throws for a file, or "" if it reads fine.
std::string model_file_error(const std::string& path) {
    try {
        read_model_file(path);
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    return "";
}
}  // namespace

TEST(Checkpoint, BadModelFilesGiveOneLineNamingTheProblem) {
    knngpt_test::TempDir dir;
    GPTConfig c = tiny_config();
    write_model_file(dir.file("good.bin"), c, gpt_random_init(c, 7));
    std::vector<char> good = read_bytes(dir.file("good.bin"));

    EXPECT_NE(model_file_error(dir.file("missing.bin")).find("missing.bin: cannot open"), std::string::npos);

    std::vector<char> bad_magic = good;
    bad_magic[0] ^= 1;
    write_bytes(dir.file("magic.bin"), bad_magic);
    EXPECT_NE(model_file_error(dir.file("magic.bin")).find("bad magic"), std::string::npos);

    std::vector<char> bad_version = good;
    bad_version[4] = 4;
    write_bytes(dir.file("version.bin"), bad_version);
    EXPECT_NE(model_file_error(dir.file("version.bin")).find("unsupported version 4"), std::string::npos);

    std::vector<char> truncated(good.begin(), good.end() - 10);
    write_bytes(dir.file("truncated.bin"), truncated);
    EXPECT_NE(model_file_error(dir.file("truncated.bin")).find("truncated"), std::string::npos);

    std::vector<char> header_only(good.begin(), good.begin() + 100);
    write_bytes(dir.file("short.bin"), header_only);
    EXPECT_NE(model_file_error(dir.file("short.bin")).find("truncated"), std::string::npos);

    std::vector<char> trailing = good;
    trailing.push_back(0);
    write_bytes(dir.file("trailing.bin"), trailing);
    EXPECT_NE(model_file_error(dir.file("trailing.bin")).find("unexpected bytes"), std::string::npos);

    std::vector<char> bad_shape = good;
    int heads = 3;  // 8 channels are not a multiple of 3 heads
    std::memcpy(&bad_shape[5 * 4], &heads, 4);
    write_bytes(dir.file("shape.bin"), bad_shape);
    EXPECT_NE(model_file_error(dir.file("shape.bin")).find("multiple of heads"), std::string::npos);

    for (const char* name : {"magic.bin", "version.bin", "truncated.bin", "trailing.bin", "shape.bin"})
        EXPECT_EQ(model_file_error(dir.file(name)).find('\n'), std::string::npos) << name;
}

// Found by tests/fuzz: sizes computed from a shape or a header in 64 bits
// must not wrap around to a small number that a small file then matches.
TEST(Checkpoint, ShapesWhoseParameterCountWouldWrapAreRefused) {
    GPTConfig c;
    c.max_seq_len = 1, c.vocab_size = 1, c.padded_vocab_size = 1, c.num_layers = 4, c.num_heads = 1, c.channels = 1 << 30;
    // the 16·L·C² of the weight matrices is 2^64: the count wraps to its linear terms
    EXPECT_LT(count_parameters(c), (size_t)1 << 40);
    EXPECT_THROW(validate_config(c, "shape"), std::runtime_error);
    knngpt_test::TempDir dir;
    int header[HEADER_INTS] = {MODEL_MAGIC, 3, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels,
                               c.padded_vocab_size};
    std::vector<char> bytes((const char*)header, (const char*)header + sizeof(header));
    write_bytes(dir.file("wrap.bin"), bytes);
    EXPECT_NE(model_file_error(dir.file("wrap.bin")).find("2^56"), std::string::npos);
}

TEST(Checkpoint, StateFileWhoseMomentSizeWouldWrapIsRefused) {
    knngpt_test::TempDir dir;
    TrainState s;
    s.m = {1.f, 2.f, 3.f}, s.v = {4.f, 5.f, 6.f};
    write_state_file(dir.file("s.bin"), s);
    std::vector<char> bytes = read_bytes(dir.file("s.bin"));
    const uint64_t claimed = ((uint64_t)1 << 62) + 3;  // 2 · 4 bytes · claimed wraps to the 24 bytes the file holds
    std::memcpy(&bytes[40 * 4], &claimed, sizeof(claimed));
    write_bytes(dir.file("s.bin"), bytes);
    try {
        read_state_file(dir.file("s.bin"), claimed);
        FAIL() << "a state file claiming 2^62 + 3 parameters in 24 bytes was read";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
}

TEST(Model, ForwardRejectsTooLongSequencesAndBadTokens) {
    GPTConfig c = tiny_config();
    GPT model;
    EXPECT_THROW(gpt_build(model, c, gpt_random_init(c, 1), 2, 9), std::runtime_error);  // T > maxT
    gpt_build(model, c, gpt_random_init(c, 1), 2, 8);
    std::vector<int> tokens(16, 1);
    tokens[3] = 30;  // == V
    EXPECT_THROW(gpt_forward(model, tokens.data(), nullptr, 2, 8, 0), std::runtime_error);
}

// The model refuses attention settings that break a rule of attn_config_problem,
// whoever builds them (the trainer words the same rules as flag errors).
TEST(Model, SetAttentionRefusesInvalidConfigurations) {
    GPTConfig c = tiny_config();
    GPT model;
    gpt_build(model, c, gpt_random_init(c, 1), 2, 8);
    AttnConfig gumbel;
    gumbel.mode = AttnMode::Gumbel;  // no exact gradient
    AttnConfig lazy_on_lsh;
    lazy_on_lsh.mode = AttnMode::Knn;
    lazy_on_lsh.grad = AttnGrad::Sampled;  // lazy Gumbel samples from the knn lists
    lazy_on_lsh.index = ops::TopkIndex::Lsh;
    AttnConfig lazy_on_heavy = lazy_on_lsh;
    lazy_on_heavy.index = ops::TopkIndex::Heavy;
    AttnConfig lazy_on_ivf = lazy_on_lsh;
    lazy_on_ivf.index = ops::TopkIndex::Ivf;
    AttnConfig ignored_tail;
    ignored_tail.mode = AttnMode::Knn;
    ignored_tail.tail = 3;
    AttnConfig kmv_without_light;
    kmv_without_light.mode = AttnMode::Kmv;
    for (const AttnConfig& bad :
         {gumbel, lazy_on_lsh, lazy_on_heavy, lazy_on_ivf, ignored_tail, kmv_without_light}) {
        EXPECT_NE(attn_config_problem(bad), AttnProblem::None) << attn_description(bad);
        EXPECT_THROW(gpt_set_attention(model, bad), std::invalid_argument) << attn_description(bad);
    }
    AttnConfig good = gumbel;
    good.grad = AttnGrad::Sampled;
    EXPECT_EQ(attn_config_problem(good), AttnProblem::None);
    EXPECT_NO_THROW(gpt_set_attention(model, good));
}

TEST(Model, CausalityLaterTokensDoNotChangeEarlierLogits) {
    GPTConfig c = tiny_config();
    GPT model;
    gpt_build(model, c, gpt_random_init(c, 3), 1, 8);
    std::vector<int> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = {1, 2, 3, 4, 9, 9, 9, 9};
    std::vector<float> la(c.padded_vocab_size), lb(c.padded_vocab_size);
    for (int t = 0; t < 4; t++) {
        gpt_forward(model, a.data(), nullptr, 1, 8, 0);
        gpt_logits_at(model, 0, t, la.data());
        gpt_forward(model, b.data(), nullptr, 1, 8, 0);
        gpt_logits_at(model, 0, t, lb.data());
        EXPECT_EQ(la, lb) << "position " << t;
    }
}

TEST(Model, GradientAccumulationEqualsOneBigBatch) {
    // two micro-batches of 2 sequences with dloss 1/(2·B·T) == one batch of 4 with 1/(4·T)
    GPTConfig c = tiny_config();
    std::vector<float> init = gpt_random_init(c, 5);
    std::vector<int> in(4 * 8), tg(4 * 8);
    for (size_t i = 0; i < in.size(); i++) in[i] = (int)(i * 7 % 30), tg[i] = (int)(i * 11 % 30);
    GPT big, small;
    gpt_build(big, c, init, 4, 8);
    gpt_build(small, c, init, 2, 8);
    gpt_zero_grad(big);
    gpt_forward(big, in.data(), tg.data(), 4, 8, 0);
    gpt_backward(big, 1.0f / 32);
    gpt_zero_grad(small);
    for (int micro = 0; micro < 2; micro++) {
        gpt_forward(small, in.data() + micro * 16, tg.data() + micro * 16, 2, 8, 0);
        gpt_backward(small, 1.0f / 32);
    }
    std::vector<float> gb(big.num_parameters), gs(small.num_parameters);
    ops::copy_to_host(gb.data(), big.grads_memory, gb.size() * sizeof(float));
    ops::copy_to_host(gs.data(), small.grads_memory, gs.size() * sizeof(float));
    EXPECT_LT(max_rel_error(gs.data(), gb.data(), gb.size()), 1e-5);
}

// The stochastic modes too, when each micro-batch's forward names the global rows
// it holds (draw_batch0 = micro B, kernels/common/draws.h): the two micro-batches
// draw the samples the big batch draws for the same sequences. Drawing both at rows
// 0.. (draw_batch0 0) instead gives other samples, far outside the tolerance.
TEST(Model, GradientAccumulationAtGlobalRowsDrawsTheSamplesOfOneBigBatch) {
    GPTConfig c = tiny_config();
    std::vector<float> init = gpt_random_init(c, 5);
    std::vector<int> in(4 * 8), tg(4 * 8);
    for (size_t i = 0; i < in.size(); i++) in[i] = (int)(i * 7 % 30), tg[i] = (int)(i * 11 % 30);
    AttnConfig tail, sampled, gumbel, kmv;
    tail.mode = AttnMode::KnnTail, tail.k = 2, tail.tail = 2;
    sampled.grad = AttnGrad::Sampled, sampled.grad_samples = 2, sampled.grad_signed_dv = true;
    gumbel.mode = AttnMode::Gumbel, gumbel.k = 3, gumbel.grad = AttnGrad::Sampled, gumbel.grad_samples = 2;
    kmv.mode = AttnMode::Kmv, kmv.k = 2, kmv.tail = 2;
    for (AttnConfig attn : {tail, sampled, gumbel, kmv}) {
        attn.seed = 17;
        const uint32_t step = training_draw_step(3);
        GPT big, small;
        big.attn = small.attn = attn;
        gpt_build(big, c, init, 4, 8);
        gpt_build(small, c, init, 2, 8);
        gpt_zero_grad(big);
        gpt_forward(big, in.data(), tg.data(), 4, 8, step);
        gpt_backward(big, 1.0f / 32);
        std::vector<float> gb(big.num_parameters), gs(small.num_parameters);
        ops::copy_to_host(gb.data(), big.grads_memory, gb.size() * sizeof(float));
        for (bool global_rows : {true, false}) {
            gpt_zero_grad(small);
            for (int micro = 0; micro < 2; micro++) {
                const int batch0 = global_rows ? (int)draw_batch0(micro, 1, 0, 2) : 0;
                gpt_forward(small, in.data() + micro * 16, tg.data() + micro * 16, 2, 8, step, 0.0f, batch0);
                gpt_backward(small, 1.0f / 32);
            }
            ops::copy_to_host(gs.data(), small.grads_memory, gs.size() * sizeof(float));
            const double error = max_rel_error(gs.data(), gb.data(), gb.size());
            if (global_rows) EXPECT_LT(error, 1e-5) << attn_description(attn);
            else EXPECT_GT(error, 1e-3) << attn_description(attn) << " (the micro-batches drawn at rows 0..)";
        }
    }
}

TEST(Model, FusedClassifierGivesTheSameLossAndGradients) {
    // the training step's fused forward (losses and dlogits in one pass) against forward + backward
    GPTConfig c = tiny_config();  // V = 30 padded to Vp = 32
    std::vector<float> init = gpt_random_init(c, 9);
    std::vector<int> in(2 * 8), tg(2 * 8);
    for (size_t i = 0; i < in.size(); i++) in[i] = (int)(i * 5 % 30), tg[i] = (int)((i * 13 + 29) % 30);
    const float dloss = 1.0f / (2 * 16);  // as with two accumulation steps
    GPT plain, fused;
    gpt_build(plain, c, init, 2, 8);
    gpt_build(fused, c, init, 2, 8);
    gpt_zero_grad(plain);
    gpt_forward(plain, in.data(), tg.data(), 2, 8, 0);
    gpt_backward(plain, dloss);
    gpt_zero_grad(fused);
    gpt_forward(fused, in.data(), tg.data(), 2, 8, 0, dloss);
    EXPECT_TRUE(fused.dlogits_ready);
    gpt_backward(fused, dloss);
    EXPECT_EQ(fused.mean_loss, plain.mean_loss);
    EXPECT_EQ(fused.host_losses, plain.host_losses);
    std::vector<float> gp(plain.num_parameters), gf(fused.num_parameters);
    ops::copy_to_host(gp.data(), plain.grads_memory, gp.size() * sizeof(float));
    ops::copy_to_host(gf.data(), fused.grads_memory, gf.size() * sizeof(float));
    EXPECT_LT(max_rel_error(gf.data(), gp.data(), gp.size()), 1e-6);

    // the logits buffer holds dlogits after a fused forward
    std::vector<float> logits(c.padded_vocab_size);
    EXPECT_THROW(gpt_logits_at(fused, 0, 0, logits.data()), std::runtime_error);

    // the backward must get the dloss the forward fused
    gpt_forward(fused, in.data(), tg.data(), 2, 8, 0, dloss);
    EXPECT_THROW(gpt_backward(fused, 2.0f * dloss), std::runtime_error);

    // a later plain forward resets it: logits readable, any dloss accepted
    gpt_forward(fused, in.data(), tg.data(), 2, 8, 0);
    EXPECT_FALSE(fused.dlogits_ready);
    EXPECT_NO_THROW(gpt_logits_at(fused, 0, 0, logits.data()));
    EXPECT_NO_THROW(gpt_backward(fused, 2.0f * dloss));
}
