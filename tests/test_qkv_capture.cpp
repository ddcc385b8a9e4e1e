// tests/test_qkv_capture.cpp — the q, k, v that tools/qkv_capture.h copies out of a
// model are what its attention layers see: layer 0's against the model's math
// recomputed here in double (embedding, layernorm, qkv matmul), every layer's against
// its own attention output through a double-precision causal softmax written here.
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>

#include "tools/qkv_capture.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

using namespace knngpt;

namespace {

using knngpt_test::peaked_params;
using knngpt_test::small_config;

// causal softmax attention of one (1, T, 3C) qkv, in double: (1, T, C)
std::vector<double> causal_attention_double(const std::vector<float>& qkv, int T, int C, int NH) {
    const int HS = C / NH;
    std::vector<double> out((size_t)T * C, 0.0), w(T);
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < T; i++) {
            const float* q = &qkv[(size_t)i * 3 * C + h * HS];
            double m = -INFINITY, z = 0.0;
            for (int j = 0; j <= i; j++) {
                const float* k = &qkv[(size_t)j * 3 * C + C + h * HS];
                double s = 0.0;
                for (int d = 0; d < HS; d++) s += (double)q[d] * k[d];
                w[j] = s / std::sqrt((double)HS);
                m = std::max(m, w[j]);
            }
            for (int j = 0; j <= i; j++) z += (w[j] = std::exp(w[j] - m));
            for (int j = 0; j <= i; j++)
                for (int d = 0; d < HS; d++)
                    out[(size_t)i * C + h * HS + d] += w[j] / z * qkv[(size_t)j * 3 * C + 2 * C + h * HS + d];
        }
    return out;
}

}  // namespace

TEST(QkvCapture, LayerZeroIsTheEmbeddingsThroughLayernormAndTheQkvMatmul) {
    const GPTConfig c = small_config();
    const std::vector<float> params = peaked_params(c);
    const ParameterTensors p = point_parameters(const_cast<float*>(params.data()), c);
    const std::vector<int> tokens = knngpt_test::random_ints(c.max_seq_len, 3, c.vocab_size);
    const std::vector<CapturedLayer> layers = gpt_capture_layers(c, params, tokens);
    ASSERT_EQ(layers.size(), (size_t)c.num_layers);
    const int T = c.max_seq_len, C = c.channels;
    std::vector<double> want((size_t)T * 3 * C), x(C);
    for (int t = 0; t < T; t++) {
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < C; i++) mean += x[i] = (double)p.wte[(size_t)tokens[t] * C + i] + p.wpe[(size_t)t * C + i];
        mean /= C;
        for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
        const double rstd = 1.0 / std::sqrt(var / C + 1e-5);
        for (int i = 0; i < C; i++) x[i] = (x[i] - mean) * rstd * p.ln1w[i] + p.ln1b[i];
        for (int o = 0; o < 3 * C; o++) {
            double s = p.qkvb[o];
            for (int i = 0; i < C; i++) s += (double)p.qkvw[(size_t)o * C + i] * x[i];
            want[(size_t)t * 3 * C + o] = s;
        }
    }
    EXPECT_LE(knngpt_test::max_rel_error(layers[0].qkv.data(), want.data(), want.size()), 1e-5);
}

TEST(QkvCapture, ExactAttentionOnEveryCapturedLayerGivesTheModelsOutput) {
    const GPTConfig c = small_config();
    const std::vector<float> params = peaked_params(c);
    const std::vector<int> tokens = knngpt_test::random_ints(c.max_seq_len, 4, c.vocab_size);
    const std::vector<CapturedLayer> layers = gpt_capture_layers(c, params, tokens);
    for (int l = 0; l < c.num_layers; l++) {
        const std::vector<double> want = causal_attention_double(layers[l].qkv, c.max_seq_len, c.channels, c.num_heads);
        EXPECT_LE(knngpt_test::max_rel_error(layers[l].atty.data(), want.data(), want.size()), 1e-5) << "layer " << l;
        // the layers differ (a capture that repeated one layer would pass the line above)
        if (l > 0) {
            EXPECT_GT(knngpt_test::max_abs_diff(layers[l].qkv, layers[0].qkv), 1e-3);
        }
    }
    // and the rows are peaked, so a wrong key or value offset could not hide in a uniform average
    double largest = 0.0;
    const std::vector<float>& qkv = layers[0].qkv;
    const int T = c.max_seq_len, C = c.channels, HS = C / c.num_heads;
    for (int j = 0; j < T; j++) {
        double s = 0.0;
        for (int d = 0; d < HS; d++) s += (double)qkv[(size_t)(T - 1) * 3 * C + d] * qkv[(size_t)j * 3 * C + C + d];
        largest = std::max(largest, std::fabs(s) / std::sqrt((double)HS));
    }
    EXPECT_GT(largest, 2.0);
}

TEST(QkvCapture, TextWindowIsTheBytesAtTheOffsetAndDefaultsToTheLastTenth) {
    knngpt_test::TempDir dir;
    const std::string path = dir.file("text.txt");
    std::string text;
    for (int i = 0; i < 1000; i++) text += (char)('a' + i % 26);
    std::ofstream(path, std::ios::binary) << text;
    const std::vector<int> window = text_window_tokens(path, 30, 5);
    EXPECT_EQ(window, (std::vector<int>{'e', 'f', 'g', 'h', 'i'}));
    EXPECT_EQ(text_window_tokens(path, -1, 1)[0], (int)(unsigned char)text[900]);
    try {
        text_window_tokens(path, 990, 20);
        FAIL() << "a window past the end was read";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
}
