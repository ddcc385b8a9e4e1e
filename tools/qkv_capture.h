// tools/qkv_capture.h — the q, k, v that a model's attention layers see on real text,
// for benchmarks of the attention kernels on trained-model inputs.
//
//   text_window_tokens  T + 1 byte-level tokens (vocab 256, token = byte, as prepare_data
//                       writes them) of a text file, from a byte offset
//   gpt_capture_layers  one forward of the model over B rows of T tokens (default B = 1)
//                       with exact attention; for every layer l, its qkv (B, T, 3C) as
//                       the attention call received it and its output atty (B, T, C)
// Layer l's qkv is the (B, T, 3C) layout of kernels/cpu/attention.h: q at channels
// [0, C), k at [C, 2C), v at [2C, 3C), head h at h * HS, HS = C / NH. The forward runs
// exact attention whatever the model was trained with (a model file does not record it),
// so layer 0's q, k, v are the trained model's own and later layers' are those of the
// trained weights under exact attention.
#pragma once
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/gpt.h"

namespace knngpt {

// Tokens [offset, offset + count) of `path` read byte-level; offset < 0 means the start
// of the file's last tenth (what prepare_data's default split keeps for validation).
// Throws one line naming the file when it is missing or too short.
inline std::vector<int> text_window_tokens(const std::string& path, long offset, int count) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error(path + ": cannot open text file (" + std::strerror(errno) + ")");
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    if (offset < 0) offset = size - size / 10;
    if (offset + count > size) {
        fclose(f);
        throw std::runtime_error(path + ": " + std::to_string(size) + " bytes, too short for " + std::to_string(count) +
                                 " tokens from byte " + std::to_string(offset));
    }
    std::vector<unsigned char> bytes(count);
    fseek(f, offset, SEEK_SET);
    const size_t got = fread(bytes.data(), 1, count, f);
    fclose(f);
    if (got != (size_t)count) throw std::runtime_error(path + ": read error");
    return std::vector<int>(bytes.begin(), bytes.end());
}

struct CapturedLayer {
    std::vector<float> qkv;   // (B, T, 3C)
    std::vector<float> atty;  // (B, T, C): the model's attention output on qkv
};

// One exact-attention forward of `params` (llm.c order) over tokens (B, T), B rows of
// T = tokens.size() / B <= maxT; every layer's attention input and output, copied out
// of the activations.
inline std::vector<CapturedLayer> gpt_capture_layers(const GPTConfig& config, const std::vector<float>& params,
                                                     const std::vector<int>& tokens, int B = 1) {
    if (B < 1 || tokens.size() % (size_t)B != 0 || tokens.empty())
        throw std::invalid_argument("gpt_capture_layers: tokens must hold B >= 1 rows of T >= 1");
    const int T = (int)(tokens.size() / B), C = config.channels, NH = config.num_heads;
    GPT model;
    gpt_build(model, config, params, B, T);
    gpt_forward(model, tokens.data(), nullptr, B, T, evaluation_draw_step(0));
    std::vector<CapturedLayer> layers(config.num_layers);
    for (int l = 0; l < config.num_layers; l++) {
        // with B rows allocated, layer l's slots start with row 0 and hold B * T rows
        const LayerActivations la = layer_activations(model.acts, l, (size_t)B * T, C, NH);
        layers[l].qkv.resize((size_t)B * T * 3 * C);
        layers[l].atty.resize((size_t)B * T * C);
        ops::copy_to_host(layers[l].qkv.data(), la.qkv, layers[l].qkv.size() * sizeof(float));
        ops::copy_to_host(layers[l].atty.data(), la.atty, layers[l].atty.size() * sizeof(float));
    }
    return layers;
}

}  // namespace knngpt
