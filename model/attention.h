// model/attention.h — AttnConfig and the dispatch over attention modes.
//
// The trainer's --attn flag fills AttnConfig; the model calls
// attention_forward / attention_backward below, which pick the backend op for
// the configured mode. This build implements the exact mode:
//   out_i = sum_{j <= i} softmax_j(q_i·k_j / sqrt(HS)) v_j    per (b, h)
// with qkv (B, T, 3C), out (B, T, C) and the row logsumexp (B, NH, T) saved
// for the backward pass.
#pragma once
#include <stdexcept>
#include <string>

#include "model/backend.h"

namespace knngpt {

enum class AttnMode { Exact };

struct AttnConfig {
    AttnMode mode = AttnMode::Exact;
};

inline const char* attn_mode_name(AttnMode m) {
    switch (m) {
        case AttnMode::Exact: return "exact";
    }
    return "?";
}

// Parses --attn; throws one line listing the known modes.
inline AttnMode parse_attn_mode(const std::string& name) {
    if (name == "exact") return AttnMode::Exact;
    throw std::runtime_error("--attn: unknown attention mode '" + name + "' (known: exact)");
}

inline void attention_forward(const AttnConfig& cfg, float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    switch (cfg.mode) {
        case AttnMode::Exact: ops::attention_forward(out, lse, qkv, B, T, C, NH); return;
    }
}

inline void attention_backward(const AttnConfig& cfg, float* dqkv, const float* dout, const float* qkv, const float* out,
                               const float* lse, int B, int T, int C, int NH) {
    switch (cfg.mode) {
        case AttnMode::Exact: ops::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH); return;
    }
}

}  // namespace knngpt
