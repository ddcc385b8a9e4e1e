// tests/test_attention_meters.cpp — the attention meters (tools/attention_meters.h,
// build/attn_meter): k >= T gives error 0 and mass 1 exactly; the errors and masses
// agree with a double-precision top-k attention written here; on a trained tiny model
// the error falls with k and stays under §2.2's bound; assumption A's c of identical
// keys equals its closed form, in the kernel and through a model file; the tool's
// JSON holds every layer and head, bad input stops with one line, every flag is
// documented.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/attention_meters.h"
#include "model/checkpoint.h"
#include "tools/qkv_capture.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"
#include "tests/trainer_test_util.h"

using namespace knngpt;
using json = nlohmann::json;
using knngpt_test::exists;
using knngpt_test::program_path;
using knngpt_test::run_with_threads;
using knngpt_test::RunResult;
using knngpt_test::slurp;

namespace {

using knngpt_test::peaked_params;
using knngpt_test::small_config;

// Every layer's q and k constant over positions: their weights 0, their biases fixed
// (different per layer and channel), so every key is the same and so is every query.
std::vector<float> identical_key_params(const GPTConfig& c) {
    std::vector<float> params = gpt_random_init(c, 9);
    ParameterTensors p = point_parameters(params.data(), c);
    const int C = c.channels;
    for (int l = 0; l < c.num_layers; l++)
        for (int r = 0; r < 2 * C; r++) {  // rows [0, C) make q, [C, 2C) make k
            for (int col = 0; col < C; col++) p.qkvw[((size_t)l * 3 * C + r) * C + col] = 0.0f;
            p.qkvb[(size_t)l * 3 * C + r] = 0.3f * std::sin(1.0f + r + 7.0f * l);
        }
    return params;
}

std::vector<int> byte_tokens(int count, unsigned seed) {
    std::vector<int> t = knngpt_test::random_ints(count, seed, 256);
    return t;
}

MeterSpec all_modes(const std::vector<int>& ks) {
    MeterSpec s;
    s.ks = ks;
    s.modes = {AttnMode::Knn, AttnMode::KnnTail, AttnMode::Gumbel, AttnMode::Kmv};
    s.tail = 4;
    return s;
}

double dot(const float* a, const float* b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

}  // namespace

// With k >= T every list holds every causal key: knn, knn-tail and kmv give the
// reference row bit for bit, and the top-k set holds the whole softmax mass.
TEST(AttentionMeters, KAtLeastTGivesErrorZeroAndMassOne) {
    const GPTConfig c = small_config();
    const int T = c.max_seq_len, C = c.channels, NH = c.num_heads;
    const std::vector<CapturedLayer> layers = gpt_capture_layers(c, peaked_params(c), byte_tokens(T, 3));
    const MeterSpec spec = all_modes({T});
    for (int l = 0; l < c.num_layers; l++) {
        std::vector<HeadMeter> heads = new_head_meters(NH, spec);
        meter_attention_layer(heads, layers[l].qkv.data(), T, C, NH, l, 0, spec);
        for (int h = 0; h < NH; h++) {
            for (int mi : {0, 1, 3}) {  // knn, knn-tail, kmv
                EXPECT_EQ(heads[h].error[mi][0].rows, T);
                EXPECT_EQ(heads[h].error[mi][0].max, 0.0) << "mode " << mi << " layer " << l << " head " << h;
            }
            EXPECT_GT(heads[h].error[2][0].mean(), 0.0);  // gumbel samples even at k = T
            EXPECT_EQ(heads[h].mass[0].min, 1.0);
            EXPECT_EQ(heads[h].mass[0].max, 1.0);
            EXPECT_EQ(heads[h].bound[0].max, 0.0);
        }
    }
}

// The meter's knn error, mass and bound against the same quantities computed here in
// double (scores, top-k by score with ties to the smaller index, softmax over all
// causal keys and over the top k); its reference row against exact attention.
TEST(AttentionMeters, AgreeWithDoublePrecisionTopK) {
    const GPTConfig c = small_config();
    const int T = c.max_seq_len, C = c.channels, NH = c.num_heads, HS = C / NH;
    const std::vector<CapturedLayer> layers = gpt_capture_layers(c, peaked_params(c), byte_tokens(T, 4));
    MeterSpec spec;
    spec.ks = {1, 3, 8};
    const float* qkv = layers[1].qkv.data();
    std::vector<HeadMeter> heads = new_head_meters(NH, spec);
    meter_attention_layer(heads, qkv, T, C, NH, 1, 0, spec);
    for (int h = 0; h < NH; h++) {
        for (size_t ki = 0; ki < spec.ks.size(); ki++) {
            const int k = spec.ks[ki];
            RowStats error, mass, bound;
            double vmax = 0;
            for (int i = 0; i < T; i++) {
                const float* q = qkv + (size_t)i * 3 * C + h * HS;
                vmax = std::max(vmax, std::sqrt(dot(qkv + (size_t)i * 3 * C + 2 * C + h * HS,
                                                    qkv + (size_t)i * 3 * C + 2 * C + h * HS, HS)));
                std::vector<double> s(i + 1);
                for (int j = 0; j <= i; j++) s[j] = dot(q, qkv + (size_t)j * 3 * C + C + h * HS, HS) / std::sqrt((double)HS);
                std::vector<int> order(i + 1);
                std::iota(order.begin(), order.end(), 0);
                std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b]; });
                const double top = s[order[0]];
                std::vector<double> o(HS, 0.0), ok(HS, 0.0);
                double z = 0, zk = 0;
                for (int r = 0; r <= i; r++) {
                    const int j = order[r];
                    const double w = std::exp(s[j] - top);
                    const float* v = qkv + (size_t)j * 3 * C + 2 * C + h * HS;
                    z += w;
                    for (int d = 0; d < HS; d++) o[d] += w * v[d];
                    if (r < k) {
                        zk += w;
                        for (int d = 0; d < HS; d++) ok[d] += w * v[d];
                    }
                }
                double diff = 0, norm = 0;
                for (int d = 0; d < HS; d++) {
                    diff += (ok[d] / zk - o[d] / z) * (ok[d] / zk - o[d] / z);
                    norm += (o[d] / z) * (o[d] / z);
                }
                error.add(std::sqrt(diff / norm));
                mass.add(zk / z);
                bound.add(2 * (1 - zk / z) * vmax / std::sqrt(norm));
            }
            const HeadMeter& m = heads[h];
            EXPECT_NEAR(m.error[0][ki].mean(), error.mean(), 1e-4 * error.mean() + 1e-6) << "head " << h << " k " << k;
            EXPECT_NEAR(m.error[0][ki].max, error.max, 1e-4 * error.max + 1e-6);
            EXPECT_NEAR(m.mass[ki].mean(), mass.mean(), 1e-5);
            EXPECT_NEAR(m.mass[ki].min, mass.min, 1e-5);
            EXPECT_NEAR(m.bound[ki].mean(), bound.mean(), 1e-4 * bound.mean() + 1e-5);
            if (k > 1) {
                EXPECT_LT(m.mass[ki].min, 1.0);  // the test inputs leave mass outside the top k
            }
        }
    }
    // the reference equals exact attention (the kernel the model uses), to fp32 rounding: k = T
    // in this meter is the reference row, so its knn error is 0 and atty is what the model saw
    MeterSpec full;
    full.ks = {T};
    std::vector<HeadMeter> at_t = new_head_meters(NH, full);
    meter_attention_layer(at_t, qkv, T, C, NH, 1, 0, full);
    std::vector<float> exact((size_t)T * C), lse((size_t)NH * T);
    ops::attention_forward(exact.data(), lse.data(), qkv, 1, T, C, NH);
    knngpt_test::expect_close(exact, layers[1].atty, 1e-6, "atty is exact attention");
    std::vector<int> list((size_t)NH * T * T);
    for (int hh = 0; hh < NH; hh++)
        for (int i = 0; i < T; i++)
            for (int t = 0; t < T; t++) list[((size_t)hh * T + i) * T + t] = t <= i ? t : -1;
    std::vector<float> ref((size_t)T * C), ref_lse((size_t)NH * T);
    ops::sparse_attention_forward(ref.data(), ref_lse.data(), qkv, list.data(), nullptr, 1, T, C, NH, T);
    knngpt_test::expect_close(ref, exact, 2e-6, "the key-list softmax over every key is exact attention");
}

// On a model trained for a few steps: the top-k mass grows with k for every head, the
// mean knn error over the heads falls with k, knn-tail's error at the largest k is
// below its error at k = 1, and §2.2's bound holds on average at every k.
TEST(AttentionMeters, ErrorFallsWithKOnATrainedTinyModel) {
    if (!exists(program_path("train_gpt_cpu")) || !exists(program_path("prepare_data")))
        GTEST_SKIP() << program_path("train_gpt_cpu") << " or prepare_data not built (run `make test`)";
    knngpt_test::TempDir tmp;
    ASSERT_EQ(knngpt_test::prepare_text_shards(tmp, 60000).exit_code, 0);
    RunResult train = run_with_threads(program_path("train_gpt_cpu") + " -i " + tmp.file("t_train.bin") + " -j " +
                                           tmp.file("t_val.bin") + " --layers 2 --heads 2 --channels 32 -b 4 -t 32 -x 30" +
                                           " -l 1e-2 -v 0 -m 2 -s 0 -g 4 -o " + tmp.path,
                                       1, tmp);
    ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
    const ModelFile model = read_model_file(tmp.file("model_00000030.bin"));
    const int T = 32, C = 32, NH = 2, windows = 4;
    const std::vector<int> tokens = text_window_tokens(tmp.file("text.txt"), -1, windows * T);
    const std::vector<CapturedLayer> layers = gpt_capture_layers(model.config, model.params, tokens, windows);
    MeterSpec spec;
    spec.ks = {1, 2, 4, 8, 16, 32};
    spec.modes = {AttnMode::Knn, AttnMode::KnnTail};
    spec.tail = 4;
    for (int l = 0; l < model.config.num_layers; l++) {
        std::vector<HeadMeter> heads = new_head_meters(NH, spec);
        for (int w = 0; w < windows; w++)
            meter_attention_layer(heads, layers[l].qkv.data() + (size_t)w * T * 3 * C, T, C, NH, l, w, spec);
        double previous = INFINITY;
        for (size_t ki = 0; ki < spec.ks.size(); ki++) {
            double mean = 0;
            for (int h = 0; h < NH; h++) {
                mean += heads[h].error[0][ki].mean() / NH;
                if (ki > 0) {
                    EXPECT_GE(heads[h].mass[ki].mean(), heads[h].mass[ki - 1].mean() - 1e-6);
                }
                EXPECT_GE(heads[h].bound[ki].mean(), heads[h].error[0][ki].mean()) << "layer " << l << " k " << spec.ks[ki];
            }
            EXPECT_LE(mean, previous) << "layer " << l << " k " << spec.ks[ki];
            previous = mean;
        }
        for (int h = 0; h < NH; h++) {
            EXPECT_LT(heads[h].error[1][4].mean(), heads[h].error[1][0].mean()) << "knn-tail, layer " << l << " head " << h;
            EXPECT_GT(heads[h].error[0][0].mean(), 0.0);
        }
    }
}

// Identical keys and identical queries: every causal entry of the kernel matrix is
// the same value a, so the top n = T of its T (T + 1) / 2 entries hold T a and the
// rest (T (T + 1) / 2 - T) a: c = (T - 1) / 2, on the kernel matrix with either
// radius and on the raw exp(s).
// Identical keys k_j = r e_0 with queries q_i = i delta e_0: row i's raw entries all
// equal rho^i, rho = exp(delta r / sqrt(D)) > 1, so the top T are row T - 1's T
// entries and c_raw = sum_{i=1}^{N} i rho^(i-1) / (T rho^N), N = T - 1, where
// sum_{i=1}^{N} i rho^(i-1) = (1 - (N + 1) rho^N + N rho^(N + 1)) / (1 - rho)^2.
TEST(AttentionMeters, AssumptionAOfIdenticalKeysHasItsClosedForm) {
    const int T = 20, C = 8, NH = 1, HS = 8;
    std::vector<float> qkv((size_t)T * 3 * C);
    for (int i = 0; i < T; i++)
        for (int d = 0; d < HS; d++) {
            qkv[(size_t)i * 3 * C + d] = 0.2f + 0.1f * d;      // q
            qkv[(size_t)i * 3 * C + C + d] = 0.5f - 0.05f * d;  // k
            qkv[(size_t)i * 3 * C + 2 * C + d] = (float)i;      // v (unused)
        }
    const ops::AssumptionA a = ops::measure_assumption_a(qkv.data(), 0, 0, T, C, NH);
    const double uniform = (T - 1) / 2.0;
    EXPECT_NEAR(a.c_kernel, uniform, 1e-12 * uniform);
    EXPECT_NEAR(a.c_causal_radius, uniform, 1e-12 * uniform);
    EXPECT_NEAR(a.c_raw, uniform, 1e-12 * uniform);

    const float r = 1.5f, delta = 0.25f;
    for (int i = 0; i < T; i++)
        for (int d = 0; d < HS; d++) {
            qkv[(size_t)i * 3 * C + d] = d == 0 ? (float)i * delta : 0.0f;
            qkv[(size_t)i * 3 * C + C + d] = d == 0 ? r : 0.0f;
        }
    const double rho = std::exp((double)delta * r / std::sqrt((double)HS));
    const int N = T - 1;
    const double series = (1 - (N + 1) * std::pow(rho, N) + N * std::pow(rho, N + 1)) / ((1 - rho) * (1 - rho));
    const double closed = series / (T * std::pow(rho, N));
    const ops::AssumptionA g = ops::measure_assumption_a(qkv.data(), 0, 0, T, C, NH);
    EXPECT_NEAR(g.c_raw, closed, 1e-10 * closed);
}

// The same through a model whose q and k do not depend on the tokens: every layer and
// head, every T.
TEST(AttentionMeters, AssumptionAOfAModelWithIdenticalKeys) {
    const GPTConfig c = small_config(32);
    const std::vector<float> params = identical_key_params(c);
    for (int T : {8, 16, 32}) {
        const std::vector<CapturedLayer> layers = gpt_capture_layers(c, params, byte_tokens(2 * T, 5), 2);
        for (int l = 0; l < c.num_layers; l++) {
            const std::vector<ops::AssumptionA> a = assumption_a_of_layer(layers[l].qkv.data(), 2, T, c.channels, c.num_heads);
            for (int h = 0; h < c.num_heads; h++) {
                EXPECT_NEAR(a[h].c_kernel, (T - 1) / 2.0, 1e-9 * T) << "T " << T << " layer " << l << " head " << h;
                EXPECT_NEAR(a[h].c_raw, (T - 1) / 2.0, 1e-9 * T);
            }
        }
    }
}

// build/attn_meter end to end on a model file of that kind and on text.
class AttnMeterTool : public ::testing::Test {
  protected:
    knngpt_test::TempDir tmp;
    std::string tool = knngpt_test::build_dir() + "/attn_meter";
    std::string model, text;
    void SetUp() override {
        if (!exists(tool)) GTEST_SKIP() << tool << " not built (run `make test` from the repository root)";
        model = tmp.file("model.bin");
        text = tmp.file("text.txt");
        const GPTConfig c = small_config(32);
        write_model_file(model, c, identical_key_params(c));
        std::ofstream(text) << knngpt_test::make_text(20000);
    }
};

TEST_F(AttnMeterTool, JsonHasEveryLayerAndHeadAndCsvEveryValue) {
    const std::string out = tmp.file("m.json");
    RunResult r = run_with_threads(tool + " -e " + model + " --text " + text + " -t 16 --windows 2 --c-t 8,32 --json " + out, 1, tmp);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("attn_meter: errors, layer 2/2, window 2/2"), std::string::npos) << r.err;
    EXPECT_FALSE(exists(out + ".tmp"));
    std::ifstream in(out);
    const json m = json::parse(in);
    const std::vector<int> ks = {1, 2, 4, 8, 16};  // powers of 2 below T, T, and n^(1/8) = 1, n^(1/4) = 2, n^(1/2) = 4
    EXPECT_EQ(m["k"].get<std::vector<int>>(), ks);
    EXPECT_EQ(m["k_roots"]["n^(1/2)"], 4);
    ASSERT_EQ(m["layers"].size(), 2u);
    for (const json& layer : m["layers"]) {
        ASSERT_EQ(layer["heads"].size(), 2u);
        for (const json& h : layer["heads"]) {
            for (const char* mode : {"knn", "knn-tail", "gumbel", "kmv"}) {
                ASSERT_TRUE(h["error"].contains(mode)) << mode;
                EXPECT_EQ(h["error"][mode]["mean"].size(), ks.size());
                EXPECT_EQ(h["error"][mode]["max"].size(), ks.size());
            }
            EXPECT_EQ(h["error"]["knn"]["max"].back(), 0.0);  // k = T
            EXPECT_EQ(h["topk_mass"]["min"].back(), 1.0);
            EXPECT_EQ(h["kmv"]["absolute"]["heavy_mass"].size(), ks.size());
            // identical keys: c = (T - 1) / 2 at T = 8 and 32; random init: a different number
            ASSERT_EQ(h["c"]["kernel"].size(), 2u);
            EXPECT_NEAR(h["c"]["kernel"][0].get<double>(), 3.5, 1e-8);
            EXPECT_NEAR(h["c"]["kernel"][1].get<double>(), 15.5, 1e-8);
            EXPECT_GT(std::fabs(h["c_random_init"]["kernel"][1].get<double>() - 15.5), 1e-3);
        }
    }
    // one value a line: per head, 4 modes x 2 statistics x 5 k + 3 mass and bound x 5 k + 10 kmv x 5 k,
    // and 3 c x 2 T x 2 models
    const std::string csv = slurp(tmp.file("m.csv"));
    EXPECT_EQ(csv.substr(0, csv.find('\n')), "quantity,model,layer,head,T,mode,k,value");
    EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 4 * (4 * 2 * 5 + 3 * 5 + 10 * 5 + 3 * 2 * 2));
}

TEST_F(AttnMeterTool, BadInputGivesOneClearLine) {
    const std::string base = tool + " -e " + model + " --text " + text + " --json " + tmp.file("bad.json");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {tool + " --text " + text, "no -e MODEL_FILE given"},
        {tool + " -e " + model, "give exactly one of --text FILE and -j VAL_TOKENS"},
        {base + " -j x.bin", "give exactly one of"},
        {base + " -t 64", "-t 64: must be 2..32"},
        {base + " --k 0,4", "--k: every k must be 1..32"},
        {base + " --k 4,x", "--k: expected an integer, got 'x'"},
        {base + " --modes knn,fast", "--modes: unknown mode 'fast'"},
        {base + " --c-t 64", "--c-t: every T must be 1..32"},
        {base + " --random-init 2", "--random-init takes 0 or 1"},
        {base + " --windows 0", "--windows must be >= 1"},
        {base + " --bogus 1", "unknown flag '--bogus'"},
        {base + " --windows", "--windows: missing value"},
        {tool + " -e " + tmp.file("none.bin") + " --text " + text, "cannot open model file"},
        {tool + " -e " + model + " --text " + tmp.file("none.txt"), "cannot open text file"},
        {base + " --windows 1000", "too short"},
    };
    for (const auto& [cmd, expect] : cases) {
        RunResult r = run_with_threads(cmd, 1, tmp);
        EXPECT_EQ(r.exit_code, 1) << cmd;
        EXPECT_NE(r.err.find(expect), std::string::npos) << cmd << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << cmd << ": " << r.err;
    }
    EXPECT_FALSE(exists(tmp.file("bad.json")));
}

TEST_F(AttnMeterTool, EveryFlagIsInHelpAndReadme) {
    RunResult help = run_with_threads(tool + " -h", 1, tmp);
    ASSERT_EQ(help.exit_code, 0);
    std::string readme = slurp("tools/README.md");
    ASSERT_FALSE(readme.empty()) << "tools/README.md not found";
    const size_t section = readme.find("## The attention meters");
    ASSERT_NE(section, std::string::npos) << "tools/README.md has no section on attn_meter";
    readme = readme.substr(section, readme.find("\n## ", section + 1) - section);
    for (const char* flag : {"-e", "--text", "-j", "-t", "--windows", "--k", "--modes", "--attn-tail",
                             "--attn-gumbel-groups", "--attn-gumbel-samples", "--attn-kmv-threshold", "--kmv-alpha",
                             "--attn-kmv-levels",
                             "--attn-seed", "--c-t", "--random-init", "--init-seed", "--json", "--csv", "-h"}) {
        std::regex documented(std::string("(^|[\\s`])") + flag + "[\\s`,]");
        EXPECT_TRUE(std::regex_search(help.out, documented)) << flag << " missing from -h";
        EXPECT_TRUE(std::regex_search(readme, documented)) << flag << " missing from tools/README.md's section";
    }
}
