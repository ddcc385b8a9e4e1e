// tests/model_test_util.h — small models for the tests that capture a model's own
// q, k, v (test_qkv_capture, test_attention_meters).
#pragma once
#include <vector>

#include "model/gpt.h"

namespace knngpt_test {

// 2 layers, 2 heads of size 8, byte-level vocabulary, context maxT.
inline knngpt::GPTConfig small_config(int maxT = 24) {
    knngpt::GPTConfig c;
    c.max_seq_len = maxT;
    c.vocab_size = 256;
    c.padded_vocab_size = knngpt::padded_vocab(256);
    c.num_layers = 2;
    c.num_heads = 2;
    c.channels = 16;
    return c;
}

// GPT-2's init with the qkv weights scaled up, so that attention rows are far from uniform
inline std::vector<float> peaked_params(const knngpt::GPTConfig& c) {
    std::vector<float> params = knngpt::gpt_random_init(c, 5);
    knngpt::ParameterTensors p = knngpt::point_parameters(params.data(), c);
    for (size_t i = 0; i < (size_t)c.num_layers * 3 * c.channels * c.channels; i++) p.qkvw[i] *= 40.0f;
    return params;
}

}  // namespace knngpt_test
