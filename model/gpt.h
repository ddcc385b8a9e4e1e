// model/gpt.h — GPT-2, written once: configuration, parameter and activation
// layout, forward, backward and the AdamW update. Every op is called through
// `ops::` (model/backend.h), so the same code drives the CPU and CUDA kernels.
//
// The model is GPT-2 exactly as llm.c defines it:
//   x = wte[token] + wpe[position]                                 (B, T, C)
//   for each of the L blocks:
//     x = x + attproj( attention( qkv( layernorm1(x) ) ) )       pre-LN, causal, NH heads
//     x = x + fcproj( gelu_tanh( fc( layernorm2(x) ) ) )          MLP of width 4C
//   logits = layernorm_f(x) @ wteᵀ                                (B, T, Vp), the head is tied to wte
//   loss   = mean over (b, t) of cross-entropy over the first V logits
// The vocabulary is padded from V to Vp (a multiple of 128 for GPT-2); the
// padded rows of wte exist only for alignment and never enter softmax or loss.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/draws.h"
#include "kernels/common/rng.h"
#include "model/attention.h"
#include "model/backend.h"
#include "model/comm.h"

namespace knngpt {

struct GPTConfig {
    int max_seq_len = 0;        // maxT: longest context, rows of wpe
    int vocab_size = 0;         // V
    int padded_vocab_size = 0;  // Vp >= V
    int num_layers = 0;         // L
    int num_heads = 0;          // NH
    int channels = 0;           // C
};

// Checks a configuration; throws one line naming the bad field.
inline void validate_config(const GPTConfig& c, const std::string& source) {
    auto fail = [&](const std::string& what) { throw std::runtime_error(source + ": " + what); };
    if (c.max_seq_len < 1) fail("max sequence length must be >= 1, got " + std::to_string(c.max_seq_len));
    if (c.vocab_size < 1) fail("vocab size must be >= 1, got " + std::to_string(c.vocab_size));
    if (c.padded_vocab_size < c.vocab_size)
        fail("padded vocab " + std::to_string(c.padded_vocab_size) + " is smaller than vocab " + std::to_string(c.vocab_size));
    if (c.num_layers < 1) fail("number of layers must be >= 1, got " + std::to_string(c.num_layers));
    if (c.num_heads < 1) fail("number of heads must be >= 1, got " + std::to_string(c.num_heads));
    if (c.channels < 1 || c.channels % c.num_heads != 0)
        fail("channels (" + std::to_string(c.channels) + ") must be a positive multiple of heads (" + std::to_string(c.num_heads) + ")");
    // The largest of the 16 parameter tensors is L·4C·C, Vp·C or maxT·C; at most
    // 2^56 elements each keeps every parameter count and its byte size (16 tensors,
    // 4 bytes) below 2^62, so no size computed from the shape wraps around.
    const double C = c.channels, largest_tensor = std::max({4.0 * c.num_layers * C * C, (double)c.padded_vocab_size * C,
                                                            (double)c.max_seq_len * C});
    if (largest_tensor > 0x1p56)
        fail("the shape (L " + std::to_string(c.num_layers) + ", C " + std::to_string(c.channels) + ", Vp " +
             std::to_string(c.padded_vocab_size) + ", maxT " + std::to_string(c.max_seq_len) +
             ") has a tensor of more than 2^56 parameters");
}

// Vp: the vocabulary rounded up to a multiple of 128 (50257 -> 50304, 256 -> 256).
inline int padded_vocab(int vocab_size) { return ((vocab_size + 127) / 128) * 128; }

// ----------------------------------------------------------------------------
// Parameters: 16 tensors in one contiguous buffer, in llm.c's checkpoint order.

constexpr int NUM_PARAMETER_TENSORS = 16;

struct ParameterTensors {
    float* wte;       // (Vp, C)
    float* wpe;       // (maxT, C)
    float* ln1w;      // (L, C)
    float* ln1b;      // (L, C)
    float* qkvw;      // (L, 3C, C)
    float* qkvb;      // (L, 3C)
    float* attprojw;  // (L, C, C)
    float* attprojb;  // (L, C)
    float* ln2w;      // (L, C)
    float* ln2b;      // (L, C)
    float* fcw;       // (L, 4C, C)
    float* fcb;       // (L, 4C)
    float* fcprojw;   // (L, C, 4C)
    float* fcprojb;   // (L, C)
    float* lnfw;      // (C)
    float* lnfb;      // (C)
};

inline const char* const PARAMETER_NAMES[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

// Weight decay applies to the 2-D weight matrices and the embeddings only.
inline const bool PARAMETER_IS_DECAYED[NUM_PARAMETER_TENSORS] = {
    true, true, false, false, true, false, true, false,
    false, false, true, false, true, false, false, false};

inline std::array<size_t, NUM_PARAMETER_TENSORS> parameter_sizes(const GPTConfig& c) {
    size_t Vp = c.padded_vocab_size, C = c.channels, maxT = c.max_seq_len, L = c.num_layers;
    return {Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
            L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
}

inline size_t count_parameters(const GPTConfig& c) {
    size_t n = 0;
    for (size_t s : parameter_sizes(c)) n += s;
    return n;
}

// Points the 16 tensors into one buffer of count_parameters(c) floats.
inline ParameterTensors point_parameters(float* memory, const GPTConfig& c) {
    ParameterTensors p;
    float** slots[NUM_PARAMETER_TENSORS] = {&p.wte, &p.wpe, &p.ln1w, &p.ln1b, &p.qkvw, &p.qkvb,
                                            &p.attprojw, &p.attprojb, &p.ln2w, &p.ln2b, &p.fcw, &p.fcb,
                                            &p.fcprojw, &p.fcprojb, &p.lnfw, &p.lnfb};
    auto sizes = parameter_sizes(c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        *slots[i] = memory;
        memory += sizes[i];
    }
    return p;
}

// GPT-2 initialisation on the host, in llm.c order: weights and embeddings
// normal(0, 0.02), the two residual projections (attproj, fcproj) scaled by
// 1/sqrt(2L), biases 0, layernorm weights 1 and biases 0. The padded rows of
// wte are 0. Every value is drawn from `rng` in a fixed order, so a seed fixes
// the model.
inline std::vector<float> gpt_random_init(const GPTConfig& c, uint64_t seed) {
    std::vector<float> params(count_parameters(c), 0.0f);
    ParameterTensors p = point_parameters(params.data(), c);
    Rng rng(seed);
    const float std_dev = 0.02f, residual_std = 0.02f / std::sqrt(2.0f * c.num_layers);
    auto fill_normal = [&](float* x, size_t n, float s) {
        for (size_t i = 0; i < n; i++) x[i] = (float)(rng.normal() * s);
    };
    auto fill = [](float* x, size_t n, float v) { for (size_t i = 0; i < n; i++) x[i] = v; };
    size_t C = c.channels, L = c.num_layers;
    fill_normal(p.wte, (size_t)c.vocab_size * C, std_dev);  // padding rows stay 0
    fill_normal(p.wpe, (size_t)c.max_seq_len * C, std_dev);
    fill(p.ln1w, L * C, 1.0f);
    fill_normal(p.qkvw, L * 3 * C * C, std_dev);
    fill_normal(p.attprojw, L * C * C, residual_std);
    fill(p.ln2w, L * C, 1.0f);
    fill_normal(p.fcw, L * 4 * C * C, std_dev);
    fill_normal(p.fcprojw, L * C * 4 * C, residual_std);
    fill(p.lnfw, C, 1.0f);
    return params;
}

// Model FLOPs per trained token (forward + backward) at sequence length T, as
// llm.c and PaLM count them for MFU: 6 per parameter, plus the attention
// scores and weighted sums, 6·L·C·T (12·L·C·T halved by the causal mask).
// Exact attention's count; the approximate modes are measured against it too.
inline double gpt_flops_per_token(const GPTConfig& c, int T) {
    return 6.0 * (double)count_parameters(c) + 6.0 * c.num_layers * c.channels * (double)T;
}

// ----------------------------------------------------------------------------
// Activations for a batch of (B, T), all in one buffer. Per-layer tensors hold
// L copies. Everything the backward pass reads is kept here.

constexpr int NUM_ACTIVATION_TENSORS = 21;

struct ActivationTensors {
    float* encoded;    // (B, T, C)
    float* ln1;        // (L, B, T, C)
    float* ln1_mean;   // (L, B, T)
    float* ln1_rstd;   // (L, B, T)
    float* qkv;        // (L, B, T, 3C)
    float* atty;       // (L, B, T, C)   attention output, heads side by side
    float* att_lse;    // (L, B, NH, T)  row logsumexp saved for the backward
    float* attproj;    // (L, B, T, C)
    float* residual2;  // (L, B, T, C)
    float* ln2;        // (L, B, T, C)
    float* ln2_mean;   // (L, B, T)
    float* ln2_rstd;   // (L, B, T)
    float* fch;        // (L, B, T, 4C)
    float* fch_gelu;   // (L, B, T, 4C)
    float* fcproj;     // (L, B, T, C)
    float* residual3;  // (L, B, T, C)
    float* lnf;        // (B, T, C)
    float* lnf_mean;   // (B, T)
    float* lnf_rstd;   // (B, T)
    ops::Logit* logits;  // (B, T, Vp)   overwritten by dlogits in the backward (or the fused forward);
                         //               ops::Logit: fp32, bf16 in the CUDA bf16 build
    float* losses;     // (B, T)
};

inline std::array<size_t, NUM_ACTIVATION_TENSORS> activation_sizes(const GPTConfig& c, int B, int T) {
    size_t BT = (size_t)B * T, C = c.channels, L = c.num_layers, NH = c.num_heads, Vp = c.padded_vocab_size;
    return {BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C, L * NH * BT, L * BT * C,
            L * BT * C, L * BT * C, L * BT, L * BT, L * BT * 4 * C, L * BT * 4 * C, L * BT * C, L * BT * C,
            BT * C, BT, BT, (BT * Vp * sizeof(ops::Logit) + sizeof(float) - 1) / sizeof(float), BT};
}

inline ActivationTensors point_activations(float* memory, const std::array<size_t, NUM_ACTIVATION_TENSORS>& sizes) {
    ActivationTensors a;
    float* logits = nullptr;  // the logits' slot, then typed
    float** slots[NUM_ACTIVATION_TENSORS] = {
        &a.encoded, &a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.atty, &a.att_lse, &a.attproj,
        &a.residual2, &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.fch, &a.fch_gelu, &a.fcproj, &a.residual3,
        &a.lnf, &a.lnf_mean, &a.lnf_rstd, &logits, &a.losses};
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) {
        *slots[i] = memory;
        memory += sizes[i];
    }
    a.logits = reinterpret_cast<ops::Logit*>(logits);
    return a;
}

// The activations that are matmul inputs (ln1, atty, ln2, fch_gelu, lnf), each
// whole: a backend whose matmuls read bf16 keeps a bf16 copy of each
// (ops::register_activation_copy), written by the op that writes it.
inline std::array<std::pair<const float*, size_t>, 5> matmul_input_activations(const ActivationTensors& a,
                                                                               const GPTConfig& c, int B, int T) {
    const size_t BT = (size_t)B * T, C = c.channels, L = c.num_layers;
    return {{{a.ln1, L * BT * C}, {a.atty, L * BT * C}, {a.ln2, L * BT * C}, {a.fch_gelu, L * BT * 4 * C},
             {a.lnf, BT * C}}};
}

// The gradients of the activations. The backward pass needs one buffer per
// distinct tensor it writes; shapes as in ActivationTensors.
struct ActivationGrads {
    float* residual;   // (B, T, C)      gradient flowing along the residual stream
    float* ln;         // (B, T, C)      gradient of a layernorm output (ln1, ln2 or lnf)
    float* qkv;        // (B, T, 3C)
    float* atty;       // (B, T, C)
    float* fch;        // (B, T, 4C)
    float* fch_gelu;   // (B, T, 4C)
};
constexpr int NUM_ACTIVATION_GRADS = 6;

// The activations of block l (pointers into ActivationTensors). Per-layer
// slots are sized for the allocated batch (BTa = allocated B·T), so the layout
// does not depend on the batch of the current forward.
struct LayerActivations {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att_lse, *attproj, *residual2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3;
};

inline LayerActivations layer_activations(const ActivationTensors& a, int l, size_t BTa, size_t C, size_t NH) {
    return {a.ln1 + l * BTa * C,       a.ln1_mean + l * BTa,     a.ln1_rstd + l * BTa,
            a.qkv + l * BTa * 3 * C,   a.atty + l * BTa * C,     a.att_lse + l * BTa * NH,
            a.attproj + l * BTa * C,   a.residual2 + l * BTa * C, a.ln2 + l * BTa * C,
            a.ln2_mean + l * BTa,      a.ln2_rstd + l * BTa,     a.fch + l * BTa * 4 * C,
            a.fch_gelu + l * BTa * 4 * C, a.fcproj + l * BTa * C, a.residual3 + l * BTa * C};
}

// ----------------------------------------------------------------------------
// Data parallelism (model/comm.h). Every rank holds the whole model and trains
// its own rows of the batch; gpt_update turns the ranks' gradients into the
// whole batch's (each rank's dloss carries the 1/world of the global mean, so
// the reduction is a sum) and keeps the parameters equal on every rank:
//   ZeRO-0  gradients all-reduced; every rank updates every parameter
//   ZeRO-1  the parameter vector is cut into world shards of S = ceil(n / world)
//           (the buffers padded with zeros to world·S); gradients reduce-scattered,
//           rank r keeps the AdamW moments of shard r only and updates it, then the
//           parameters are all-gathered (and the bf16 copy follows)
// The gradient norm, and so clipping, is the whole gradient's on every rank.
// Under ZeRO-0 the backward of an optimizer step's last micro-batch starts the
// sum of each block's gradients as soon as the block is done (its 12 slices, in
// one group), so on a GPU it overlaps the backward of the blocks below; the
// embeddings and the final layernorm follow in gpt_update, which then waits.
struct DataParallel {
    Comm* comm = nullptr;  // nullptr: one process
    int zero_stage = 0;    // 0 or 1
};

// ----------------------------------------------------------------------------
// The model: parameters, gradients, optimizer state, activations.

struct GPT {
    GPTConfig config;
    AttnConfig attn;
    std::array<size_t, NUM_PARAMETER_TENSORS> param_sizes{};
    size_t num_parameters = 0;
    float* params_memory = nullptr;  // device
    float* grads_memory = nullptr;   // device
    float* m_memory = nullptr;       // AdamW first moment (device), of this rank's shard under ZeRO-1
    float* v_memory = nullptr;       // AdamW second moment (device), likewise
    DataParallel parallel;
    size_t padded_parameters = 0;    // length of the parameter and gradient buffers (>= num_parameters)
    size_t shard_size = 0;           // ZeRO-1: parameters per rank (S); otherwise num_parameters
    size_t shard_begin = 0, shard_end = 0;  // the parameters this rank updates, [begin, end)
    bool blocks_reduced = false;     // the last backward started the sums of the blocks' gradients
    ParameterTensors params{}, grads{};

    int B = 0, T = 0;  // the largest batch the activations are allocated for
    float* acts_memory = nullptr;
    float* grad_acts_memory = nullptr;
    size_t num_grad_acts = 0;
    ActivationTensors acts{};
    ActivationGrads grad_acts{};
    // attention modes that select keys keep their lists per layer: (L, B, NH, T, K)
    int* attn_idx_memory = nullptr;
    float* attn_logw_memory = nullptr;
    int attn_list_capacity = 0;       // K the lists are allocated for
    int* attn_topk_scratch = nullptr;  // (B, NH, T, k)
    int attn_topk_capacity = 0;       // k the scratch is allocated for
    // the stratified backward's scratch: its lists (B, NH, T, K') and the estimates of the
    // full attention's output (B, T, C) and log normaliser (B, NH, T)
    int* attn_grad_idx = nullptr;
    float* attn_grad_logw = nullptr;
    int attn_grad_list_capacity = 0;  // K' the lists are allocated for
    float* attn_grad_out = nullptr;
    float* attn_grad_lse = nullptr;
    int* inputs = nullptr;   // (B, T) device
    int* targets = nullptr;  // (B, T) device
    int cur_B = 0, cur_T = 0;       // shape of the last forward
    uint32_t draw_step = 0;         // Philox step of the last forward's attention draws
    int draw_batch0 = 0;            // and the global batch row of its row 0 (kernels/common/draws.h)
    bool have_targets = false;      // did the last forward compute the loss?
    float mean_loss = -1.0f;        // mean loss of the last forward with targets
    // A fused forward (gpt_forward with fused_dloss > 0) writes dlogits over the
    // logits; the classifier backward is then done, for this dloss only.
    bool dlogits_ready = false;
    float fused_dloss = 0.0f;
    std::vector<float> host_losses; // (B, T) per-token losses of the last forward
    // Test hook (the trainer's --inject-nan): when >= 0, the next forward writes a
    // NaN into element 0 of this layer's attention output, a fault to be caught.
    int poison_layer = -1;

    GPT() = default;
    GPT(const GPT&) = delete;
    GPT& operator=(const GPT&) = delete;
    ~GPT() {
        ops::unregister_parameters(params_memory);
        if (acts_memory)
            for (const auto& range : matmul_input_activations(acts, config, B, T)) ops::unregister_activation_copy(range.first);
        for (void* p : {(void*)params_memory, (void*)grads_memory, (void*)m_memory, (void*)v_memory,
                        (void*)acts_memory, (void*)grad_acts_memory, (void*)inputs, (void*)targets,
                        (void*)attn_idx_memory, (void*)attn_logw_memory, (void*)attn_topk_scratch,
                        (void*)attn_grad_idx, (void*)attn_grad_logw, (void*)attn_grad_out, (void*)attn_grad_lse})
            if (p) ops::device_free(p);
    }
};

// Sets the attention configuration, growing the per-layer key lists and the
// top-k scratch when the mode needs more than is allocated. A configuration that
// breaks a rule of attn_config_problem is refused (the trainer has already said
// which of its flags did, train/attention_flags.h).
inline void gpt_set_attention(GPT& model, const AttnConfig& attn) {
    const AttnProblem problem = attn_config_problem(attn);
    if (problem != AttnProblem::None)
        throw std::invalid_argument(std::string("gpt_set_attention: attention '") + attn_description(attn) +
                                    "' is invalid: " + attn_problem_text(problem));
    const size_t rows = (size_t)model.B * model.config.num_heads * model.T;  // (B, NH, T) per layer
    const int K = attn.list_size();
    if (K > model.attn_list_capacity) {
        if (model.attn_idx_memory) ops::device_free(model.attn_idx_memory);
        if (model.attn_logw_memory) ops::device_free(model.attn_logw_memory);
        size_t n = (size_t)model.config.num_layers * rows * K;
        model.attn_idx_memory = ops::device_alloc<int>(n);
        model.attn_logw_memory = ops::device_alloc<float>(n);
        model.attn_list_capacity = K;
    }
    if (attn.mode != AttnMode::Exact || attn.grad == AttnGrad::Sampled) {
        if (attn.k > model.attn_topk_capacity) {
            if (model.attn_topk_scratch) ops::device_free(model.attn_topk_scratch);
            model.attn_topk_scratch = ops::device_alloc<int>(rows * attn.k);
            model.attn_topk_capacity = attn.k;
        }
    }
    if (attn.grad == AttnGrad::Stratified) {
        const int grad_K = attn.head_size() + attn.grad_samples;
        if (grad_K > model.attn_grad_list_capacity) {
            if (model.attn_grad_idx) ops::device_free(model.attn_grad_idx);
            if (model.attn_grad_logw) ops::device_free(model.attn_grad_logw);
            model.attn_grad_idx = ops::device_alloc<int>(rows * grad_K);
            model.attn_grad_logw = ops::device_alloc<float>(rows * grad_K);
            model.attn_grad_list_capacity = grad_K;
        }
        if (!model.attn_grad_out) {
            model.attn_grad_out = ops::device_alloc<float>((size_t)model.B * model.T * model.config.channels);
            model.attn_grad_lse = ops::device_alloc<float>(rows);
        }
    }
    model.attn = attn;
}

// Layer l's slice of the key lists (strided by the allocated batch).
inline AttnLayerState attn_layer_state(const GPT& model, int l) {
    AttnLayerState st;
    st.K = model.attn.list_size();
    if (st.K == 0) return st;
    size_t per_layer = (size_t)model.B * model.config.num_heads * model.T * model.attn_list_capacity;
    st.idx = model.attn_idx_memory + l * per_layer;
    st.logw = model.attn_logw_memory + l * per_layer;
    return st;
}

// Layer l's attention call at the step of the last forward.
inline AttnLayerCall attn_layer_call(const GPT& model, int l) {
    return AttnLayerCall{model.attn, model.draw_step, model.draw_batch0, l, attn_layer_state(model, l),
                         AttnScratch{model.attn_topk_scratch, model.attn_grad_idx, model.attn_grad_logw,
                                     model.attn_grad_out, model.attn_grad_lse}};
}

// Builds the model from host parameters (llm.c order) and allocates
// activations for batches up to (B, T); `parallel` names the ranks it trains with.
inline void gpt_build(GPT& model, const GPTConfig& config, const std::vector<float>& host_params, int B, int T,
                      const DataParallel& parallel = {}) {
    validate_config(config, "model config");
    if (T > config.max_seq_len)
        throw std::runtime_error("sequence length T = " + std::to_string(T) + " exceeds the model's max context " +
                                 std::to_string(config.max_seq_len));
    if (B < 1 || T < 1) throw std::runtime_error("batch size and sequence length must be >= 1");
    model.config = config;
    model.param_sizes = parameter_sizes(config);
    model.num_parameters = count_parameters(config);
    if (host_params.size() != model.num_parameters)
        throw std::runtime_error("parameter count mismatch: got " + std::to_string(host_params.size()) + ", the config needs " +
                                 std::to_string(model.num_parameters));
    if (parallel.zero_stage != 0 && parallel.zero_stage != 1)
        throw std::runtime_error("ZeRO stage " + std::to_string(parallel.zero_stage) + " (0 or 1)");
    size_t n = model.num_parameters;
    model.parallel = parallel;
    const int world = parallel.comm ? parallel.comm->world() : 1, rank = parallel.comm ? parallel.comm->rank() : 0;
    const bool sharded = parallel.zero_stage == 1 && parallel.comm && parallel.comm->carries_collectives();
    model.shard_size = sharded ? (n + world - 1) / world : n;
    model.padded_parameters = sharded ? model.shard_size * world : n;
    model.shard_begin = sharded ? std::min(n, (size_t)rank * model.shard_size) : 0;
    model.shard_end = sharded ? std::min(n, model.shard_begin + model.shard_size) : n;
    const size_t n_pad = model.padded_parameters, n_moments = model.shard_size;
    model.params_memory = ops::device_alloc<float>(n_pad);
    model.grads_memory = ops::device_alloc<float>(n_pad);
    model.m_memory = ops::device_alloc<float>(n_moments);
    model.v_memory = ops::device_alloc<float>(n_moments);
    ops::device_zero(model.params_memory, n_pad * sizeof(float));  // the padding stays 0
    ops::copy_to_device(model.params_memory, host_params.data(), n * sizeof(float));
    // from here on the parameters change only through ops::adamw_update, which
    // keeps whatever the backend derives from them (bf16 copy) up to date
    ops::register_parameters(model.params_memory, n);
    ops::device_zero(model.grads_memory, n_pad * sizeof(float));
    ops::device_zero(model.m_memory, n_moments * sizeof(float));
    ops::device_zero(model.v_memory, n_moments * sizeof(float));
    model.params = point_parameters(model.params_memory, config);
    model.grads = point_parameters(model.grads_memory, config);

    model.B = B;
    model.T = T;
    auto sizes = activation_sizes(config, B, T);
    size_t num_acts = 0;
    for (size_t s : sizes) num_acts += s;
    model.acts_memory = ops::device_alloc<float>(num_acts);
    model.acts = point_activations(model.acts_memory, sizes);
    // from here on the matmul inputs are written only by ops that keep the
    // backend's copies of them up to date (or followed by refresh_activation_copy)
    for (const auto& range : matmul_input_activations(model.acts, config, B, T))
        ops::register_activation_copy(range.first, range.second);
    size_t BT = (size_t)B * T, C = config.channels;
    size_t grad_sizes[NUM_ACTIVATION_GRADS] = {BT * C, BT * C, BT * 3 * C, BT * C, BT * 4 * C, BT * 4 * C};
    model.num_grad_acts = 0;
    for (size_t s : grad_sizes) model.num_grad_acts += s;
    model.grad_acts_memory = ops::device_alloc<float>(model.num_grad_acts);
    float* g = model.grad_acts_memory;
    float** slots[NUM_ACTIVATION_GRADS] = {&model.grad_acts.residual, &model.grad_acts.ln, &model.grad_acts.qkv,
                                           &model.grad_acts.atty, &model.grad_acts.fch, &model.grad_acts.fch_gelu};
    for (int i = 0; i < NUM_ACTIVATION_GRADS; i++) { *slots[i] = g; g += grad_sizes[i]; }
    model.inputs = ops::device_alloc<int>(BT);
    model.targets = ops::device_alloc<int>(BT);
    model.host_losses.assign(BT, 0.0f);
    gpt_set_attention(model, model.attn);
}

// Copies the parameters back to the host (llm.c order).
inline std::vector<float> gpt_host_parameters(const GPT& model) {
    std::vector<float> host(model.num_parameters);
    ops::copy_to_host(host.data(), model.params_memory, host.size() * sizeof(float));
    return host;
}

// Forward pass over inputs (B, T) of host token ids. With targets (B, T) it
// also computes the per-token losses and their mean (model.mean_loss); with
// targets == nullptr only the logits. B and T may be smaller than the
// allocated batch (used for sampling). draw_step is the Philox step of the
// attention's random draws (kernels/common/draws.h: training, sampling and
// evaluation steps live in separate ranges), and draw_batch0 the global batch
// row of input row 0 (draw_batch0(), there): row b draws as row draw_batch0 + b
// of the step's whole batch. The backward of this forward draws at the same
// step and rows.
//
// fused_dloss > 0 (with targets) fuses the classifier's backward into the
// forward, as the training step does: one pass per row writes the losses and
// the dlogits for that dloss (the value the following gpt_backward must get),
// in place, so after it acts.logits holds dlogits, not logits, and
// gpt_logits_at refuses to read them. The losses and mean_loss are the same
// as without fusing. Evaluation and sampling leave it at 0.
inline void gpt_forward(GPT& model, const int* host_inputs, const int* host_targets, int B, int T,
                        uint32_t draw_step, float fused_dloss = 0.0f, int draw_batch0 = 0) {
    const GPTConfig& cfg = model.config;
    if (B < 1 || B > model.B || T < 1 || T > model.T)
        throw std::runtime_error("forward: batch (" + std::to_string(B) + ", " + std::to_string(T) +
                                 ") outside the allocated (" + std::to_string(model.B) + ", " + std::to_string(model.T) + ")");
    if (draw_batch0 < 0 || !draw_rows_fit((long long)draw_batch0 + B, T))
        throw std::runtime_error("forward: attention draw rows (" + std::to_string(draw_batch0) + " + " +
                                 std::to_string(B) + ") * " + std::to_string(T) + " pass 2^32 (kernels/common/draws.h)");
    for (int i = 0; i < B * T; i++) {
        if (host_inputs[i] < 0 || host_inputs[i] >= cfg.vocab_size)
            throw std::runtime_error("forward: token " + std::to_string(host_inputs[i]) + " outside the vocabulary [0, " +
                                     std::to_string(cfg.vocab_size) + ")");
        if (host_targets && (host_targets[i] < 0 || host_targets[i] >= cfg.vocab_size))
            throw std::runtime_error("forward: target " + std::to_string(host_targets[i]) + " outside the vocabulary");
    }
    model.cur_B = B;
    model.cur_T = T;
    model.draw_step = draw_step;
    model.draw_batch0 = draw_batch0;
    model.have_targets = host_targets != nullptr;
    model.dlogits_ready = false;  // set again below by a fused forward
    model.fused_dloss = 0.0f;
    const int C = cfg.channels, L = cfg.num_layers, NH = cfg.num_heads, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    const int N = B * T;
    // per-layer strides use the allocated (B, T), so the layout never depends on the current batch
    const size_t BTa = (size_t)model.B * model.T;
    ops::copy_to_device(model.inputs, host_inputs, (size_t)N * sizeof(int));
    if (host_targets) ops::copy_to_device(model.targets, host_targets, (size_t)N * sizeof(int));

    ParameterTensors& p = model.params;
    ActivationTensors& a = model.acts;
    ops::encoder_forward(a.encoded, model.inputs, p.wte, p.wpe, B, T, C);
    float* residual = a.encoded;  // (B, T, C)
    for (int l = 0; l < L; l++) {
        LayerActivations la = layer_activations(a, l, BTa, C, NH);
        ops::layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, N, C);
        ops::matmul_forward(la.qkv, la.ln1, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, N, C, 3 * C);
        attention_layer_forward(attn_layer_call(model, l), la.atty, la.att_lse, la.qkv, B, T, C, NH);
        if (l == model.poison_layer) {
            const float nan = NAN;
            ops::copy_to_device(la.atty, &nan, sizeof(nan));
        }
        ops::refresh_activation_copy(la.atty, (size_t)N * C);  // the attention kernels write fp32 only
        ops::matmul_forward(la.attproj, la.atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, N, C, C);
        ops::residual_forward(la.residual2, residual, la.attproj, (size_t)N * C);
        ops::layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.residual2, p.ln2w + l * C, p.ln2b + l * C, N, C);
        // fch = ln2 @ fcw^T + fcb and fch_gelu = gelu(fch), one op (the CUDA GEMM can fuse the GELU)
        ops::matmul_forward_gelu(la.fch_gelu, la.fch, la.ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, N, C,
                                 4 * C);
        ops::matmul_forward(la.fcproj, la.fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, p.fcprojb + l * C, N, 4 * C, C);
        ops::residual_forward(la.residual3, la.residual2, la.fcproj, (size_t)N * C);
        residual = la.residual3;
    }
    ops::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, residual, p.lnfw, p.lnfb, N, C);
    ops::matmul_forward(a.logits, a.lnf, p.wte, nullptr, N, C, Vp);

    if (host_targets) {
        if (fused_dloss > 0.0f) {
            // losses and dlogits in one pass; dlogits overwrite the logits in place
            ops::crossentropy_fused(a.losses, a.logits, a.logits, model.targets, fused_dloss, N, V, Vp);
            model.dlogits_ready = true;
            model.fused_dloss = fused_dloss;
        } else {
            ops::crossentropy_forward(a.losses, a.logits, model.targets, N, V, Vp);
        }
        ops::copy_to_host(model.host_losses.data(), a.losses, (size_t)N * sizeof(float));
        double sum = 0.0;
        for (int i = 0; i < N; i++) sum += model.host_losses[i];
        model.mean_loss = (float)(sum / N);
    } else {
        model.mean_loss = -1.0f;
    }
}

// Logits of one position of the last forward, copied to the host as Vp floats (bf16 logits
// widened). Not after a fused forward, whose logits buffer holds dlogits.
inline void gpt_logits_at(const GPT& model, int b, int t, float* host_logits) {
    if (model.dlogits_ready)
        throw std::runtime_error("logits: the last forward was fused (fused_dloss > 0), the logits buffer holds dlogits");
    const int Vp = model.config.padded_vocab_size;
    size_t offset = ((size_t)b * model.cur_T + t) * Vp;
    std::vector<ops::Logit> row(Vp);
    ops::copy_to_host(row.data(), model.acts.logits + offset, Vp * sizeof(ops::Logit));
    for (int v = 0; v < Vp; v++) host_logits[v] = ops::logit_value(row[v]);
}

inline void gpt_zero_grad(GPT& model) {
    ops::device_zero(model.grads_memory, model.padded_parameters * sizeof(float));
}

// Does this model sum gradients over ranks without sharding them (ZeRO-0 under MPI or NCCL)?
inline bool gpt_all_reduces(const GPT& model) {
    return model.parallel.zero_stage == 0 && model.parallel.comm && model.parallel.comm->carries_collectives();
}

// Block l's slices of the 12 per-layer gradient tensors (ln1w .. fcprojb).
inline std::vector<FloatSpan> block_gradient_spans(const GPT& model, int l) {
    std::vector<FloatSpan> spans;
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (i >= 2 && i < NUM_PARAMETER_TENSORS - 2) {  // not wte, wpe, lnfw, lnfb
            const size_t per_layer = model.param_sizes[i] / model.config.num_layers;
            spans.push_back({model.grads_memory + offset + l * per_layer, per_layer});
        }
        offset += model.param_sizes[i];
    }
    return spans;
}

// Backward pass of the last forward (which must have had targets).
// Accumulates into the parameter gradients (call gpt_zero_grad once per
// optimizer step), so gradient accumulation is repeated forward + backward.
// dloss is the weight of each token's loss in the objective: 1 / (B·T) for a
// plain mean, 1 / (B·T·accumulation steps) when accumulating. After a fused
// forward the dlogits are already there, and dloss must be its fused_dloss.
// last_micro_batch: the optimizer step's gradients are complete block by block,
// so under ZeRO-0 their sums over the ranks start here (see DataParallel).
inline void gpt_backward(GPT& model, float dloss, bool last_micro_batch = false) {
    if (!model.have_targets) throw std::runtime_error("backward: the last forward had no targets");
    if (model.dlogits_ready && dloss != model.fused_dloss) {
        char msg[160];
        std::snprintf(msg, sizeof(msg), "backward: dloss %.9g differs from the fused_dloss %.9g of the last forward",
                      dloss, model.fused_dloss);
        throw std::runtime_error(msg);
    }
    const GPTConfig& cfg = model.config;
    const int B = model.cur_B, T = model.cur_T;
    const int C = cfg.channels, L = cfg.num_layers, NH = cfg.num_heads, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    const int N = B * T;
    const size_t BTa = (size_t)model.B * model.T;
    ParameterTensors& p = model.params;
    ParameterTensors& g = model.grads;
    ActivationTensors& a = model.acts;
    ActivationGrads& ga = model.grad_acts;

    // matmul_backward overwrites its dinp (ga.ln, ga.fch_gelu, ga.atty); the
    // other backward ops accumulate (+=): ga.residual starts at 0 here, ga.fch
    // and ga.qkv in each block
    ops::device_zero(ga.residual, (size_t)N * C * sizeof(float));

    // classifier: dlogits overwrite the logits in place (already done by a fused forward)
    ops::Logit* dlogits = a.logits;
    if (!model.dlogits_ready) ops::crossentropy_softmax_backward(dlogits, a.logits, model.targets, dloss, N, V, Vp);
    ops::matmul_backward(ga.ln, g.wte, nullptr, dlogits, a.lnf, p.wte, N, C, Vp);
    float* last_residual = a.residual3 + (L - 1) * BTa * C;
    ops::layernorm_backward(ga.residual, g.lnfw, g.lnfb, ga.ln, last_residual, p.lnfw, a.lnf_mean, a.lnf_rstd, N, C);

    // ga.residual now holds d(loss)/d(residual3 of the last layer); walk the blocks backwards.
    for (int l = L - 1; l >= 0; l--) {
        float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTa * C;  // the block's input
        LayerActivations la = layer_activations(a, l, BTa, C, NH);
        // residual3 = residual2 + fcproj: both receive d(residual3). The branch
        // reads it first; then layernorm2's input gradient is added to it in
        // place, which turns ga.residual into d(residual2).
        float* dfcproj = ga.residual;  // d(fcproj) == d(residual3)
        ops::matmul_backward(ga.fch_gelu, g.fcprojw + (size_t)l * C * 4 * C, g.fcprojb + l * C, dfcproj, la.fch_gelu,
                             p.fcprojw + (size_t)l * C * 4 * C, N, 4 * C, C);
        ops::device_zero(ga.fch, (size_t)N * 4 * C * sizeof(float));
        ops::gelu_backward(ga.fch, la.fch, ga.fch_gelu, (size_t)N * 4 * C);
        ops::matmul_backward(ga.ln, g.fcw + (size_t)l * 4 * C * C, g.fcb + l * 4 * C, ga.fch, la.ln2,
                             p.fcw + (size_t)l * 4 * C * C, N, C, 4 * C);
        // d(residual2) = d(residual3) + layernorm2's input gradient: accumulate into ga.residual
        ops::layernorm_backward(ga.residual, g.ln2w + l * C, g.ln2b + l * C, ga.ln, la.residual2, p.ln2w + l * C,
                                la.ln2_mean, la.ln2_rstd, N, C);

        // residual2 = residual + attproj: d(attproj) == d(residual2)
        float* dattproj = ga.residual;
        ops::matmul_backward(ga.atty, g.attprojw + (size_t)l * C * C, g.attprojb + l * C, dattproj, la.atty,
                             p.attprojw + (size_t)l * C * C, N, C, C);
        ops::device_zero(ga.qkv, (size_t)N * 3 * C * sizeof(float));
        attention_layer_backward(attn_layer_call(model, l), ga.qkv, ga.atty, la.qkv, la.atty, la.att_lse, B, T, C, NH);
        ops::matmul_backward(ga.ln, g.qkvw + (size_t)l * 3 * C * C, g.qkvb + l * 3 * C, ga.qkv, la.ln1,
                             p.qkvw + (size_t)l * 3 * C * C, N, C, 3 * C);
        // d(residual) = d(residual2) + layernorm1's input gradient
        ops::layernorm_backward(ga.residual, g.ln1w + l * C, g.ln1b + l * C, ga.ln, residual, p.ln1w + l * C,
                                la.ln1_mean, la.ln1_rstd, N, C);
        if (last_micro_batch && gpt_all_reduces(model)) model.parallel.comm->all_reduce_start(block_gradient_spans(model, l));
    }
    model.blocks_reduced = last_micro_batch && gpt_all_reduces(model);
    ops::encoder_backward(g.wte, g.wpe, ga.residual, model.inputs, B, T, C, model.config.vocab_size);
}

struct AdamWConfig {
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
    float grad_clip = 1.0f;  // clip the global gradient norm to this; 0 = no clipping
};

// Is the optimizer state sharded over the ranks (ZeRO-1 under MPI or NCCL, even of one rank)?
inline bool gpt_is_sharded(const GPT& model) {
    return model.parallel.zero_stage == 1 && model.parallel.comm && model.parallel.comm->carries_collectives();
}

// The first half of an optimizer step: sums the ranks' gradients (see
// DataParallel) and returns the global gradient norm, the same on every rank.
inline float gpt_reduce_gradients(GPT& model) {
    Comm* comm = model.parallel.comm;
    const bool sharded = gpt_is_sharded(model);
    if (sharded) {
        comm->reduce_scatter(model.grads_memory, model.shard_size, ReduceOp::Sum);
    } else if (gpt_all_reduces(model) && model.blocks_reduced) {
        // the blocks' sums are under way (gpt_backward); add wte, wpe, lnfw, lnfb and wait
        const size_t head = model.param_sizes[0] + model.param_sizes[1];
        const size_t tail = model.param_sizes[NUM_PARAMETER_TENSORS - 2] + model.param_sizes[NUM_PARAMETER_TENSORS - 1];
        comm->all_reduce_start({{model.grads_memory, head}, {model.grads_memory + model.num_parameters - tail, tail}});
        comm->all_reduce_wait();
    } else if (gpt_all_reduces(model)) {
        comm->all_reduce(model.grads_memory, model.num_parameters, ReduceOp::Sum);
    }
    model.blocks_reduced = false;
    // this rank's parameters [begin, end): all of them, or its shard
    const size_t begin = model.shard_begin, end = model.shard_end;
    double norm_squared = end > begin ? ops::global_norm_squared(model.grads_memory + begin, end - begin) : 0.0;
    if (sharded) norm_squared = comm->all_reduce_host(norm_squared, ReduceOp::Sum);
    return (float)std::sqrt(norm_squared);
}

// The second half: AdamW step t (t >= 1) at learning rate lr on the reduced
// gradients, whose global norm is `norm` (gpt_reduce_gradients). Clips the
// gradient to the global norm opt.grad_clip by scaling it inside the update.
// Weight decay applies to the tensors PARAMETER_IS_DECAYED marks.
inline void gpt_apply_update(GPT& model, float lr, const AdamWConfig& opt, int t, float norm) {
    const size_t begin = model.shard_begin, end = model.shard_end;
    float grad_scale = (opt.grad_clip > 0.0f && norm > opt.grad_clip) ? opt.grad_clip / norm : 1.0f;
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        // the part of tensor i inside [begin, end); the moments are indexed from begin
        const size_t lo = std::max(offset, begin), hi = std::min(offset + model.param_sizes[i], end);
        float wd = PARAMETER_IS_DECAYED[i] ? opt.weight_decay : 0.0f;
        if (hi > lo)
            ops::adamw_update(model.params_memory + lo, model.grads_memory + lo, model.m_memory + (lo - begin),
                              model.v_memory + (lo - begin), hi - lo, lr, opt.beta1, opt.beta2, opt.eps, wd, t,
                              grad_scale);
        offset += model.param_sizes[i];
    }
    if (gpt_is_sharded(model)) {
        model.parallel.comm->all_gather(model.params_memory, model.shard_size);
        ops::refresh_parameter_copy(model.params_memory, model.num_parameters);  // the other ranks' shards
    }
}

// One AdamW step: both halves. A non-finite gradient norm (a NaN or inf
// somewhere in the gradient) never reaches the parameters or the moments: the
// update is skipped, on every rank alike. Returns the norm before clipping.
inline float gpt_update(GPT& model, float lr, const AdamWConfig& opt, int t) {
    const float norm = gpt_reduce_gradients(model);
    if (std::isfinite(norm)) gpt_apply_update(model, lr, opt, t, norm);
    return norm;
}

// ----------------------------------------------------------------------------
// Numerical faults: where a NaN or inf first appears. Each copies tensors to
// the host one by one, so call them only once a fault is known (a non-finite
// loss or gradient norm), never on the way of a healthy step.

// Does the device range [x, x + n) hold a NaN or inf? (floats, or the logits' type)
template <class Element>
inline bool device_has_nonfinite(const Element* x, size_t n) {
    std::vector<Element> host(std::min<size_t>(n, (size_t)1 << 20));
    for (size_t done = 0; done < n; done += host.size()) {
        const size_t count = std::min(host.size(), n - done);
        ops::copy_to_host(host.data(), x + done, count * sizeof(Element));
        for (size_t i = 0; i < count; i++)
            if (!std::isfinite(ops::logit_value(host[i]))) return true;
    }
    return false;
}

// The first activation of the last forward, in the order the forward writes
// them, that holds a NaN or inf: "layer 1 atty", "lnf", "logits" (dlogits after
// a fused forward), ...; "" when there is none.
inline std::string gpt_first_nonfinite_activation(const GPT& model) {
    const GPTConfig& c = model.config;
    const size_t N = (size_t)model.cur_B * model.cur_T, C = c.channels, BTa = (size_t)model.B * model.T;
    const ActivationTensors& a = model.acts;
    if (device_has_nonfinite(a.encoded, N * C)) return "encoded (wte + wpe)";
    for (int l = 0; l < c.num_layers; l++) {
        const LayerActivations la = layer_activations(a, l, BTa, C, c.num_heads);
        const std::pair<const char*, std::pair<const float*, size_t>> tensors[] = {
            {"ln1", {la.ln1, N * C}},       {"qkv", {la.qkv, N * 3 * C}},       {"atty", {la.atty, N * C}},
            {"attproj", {la.attproj, N * C}}, {"residual2", {la.residual2, N * C}}, {"ln2", {la.ln2, N * C}},
            {"fch", {la.fch, N * 4 * C}},   {"fch_gelu", {la.fch_gelu, N * 4 * C}}, {"fcproj", {la.fcproj, N * C}},
            {"residual3", {la.residual3, N * C}}};
        for (const auto& [name, range] : tensors)
            if (device_has_nonfinite(range.first, range.second)) return "layer " + std::to_string(l) + " " + name;
    }
    if (device_has_nonfinite(a.lnf, N * C)) return "lnf";
    if (device_has_nonfinite(a.logits, N * c.padded_vocab_size)) return model.dlogits_ready ? "dlogits" : "logits";
    if (device_has_nonfinite(a.losses, N)) return "losses";
    return "";
}

// The first parameter gradient, in the order the backward writes them (lnf,
// then the blocks from the last down, then the embeddings), that holds a NaN
// or inf, as "layer 1 qkvw" or "wte"; "" when there is none. Under ZeRO-1 only
// this rank's shard is searched (the rest is not reduced here).
inline std::string gpt_first_nonfinite_gradient(const GPT& model) {
    std::array<size_t, NUM_PARAMETER_TENSORS> offsets{};
    for (int i = 1; i < NUM_PARAMETER_TENSORS; i++) offsets[i] = offsets[i - 1] + model.param_sizes[i - 1];
    // the part of [offset, offset + n) inside this rank's [shard_begin, shard_end)
    auto bad = [&](size_t offset, size_t n) {
        const size_t lo = std::max(offset, model.shard_begin), hi = std::min(offset + n, model.shard_end);
        return hi > lo && device_has_nonfinite(model.grads_memory + lo, hi - lo);
    };
    const int L = model.config.num_layers;
    for (int i : {NUM_PARAMETER_TENSORS - 2, NUM_PARAMETER_TENSORS - 1})
        if (bad(offsets[i], model.param_sizes[i])) return PARAMETER_NAMES[i];
    for (int l = L - 1; l >= 0; l--)
        for (int i = NUM_PARAMETER_TENSORS - 3; i >= 2; i--) {
            const size_t per_layer = model.param_sizes[i] / L;
            if (bad(offsets[i] + l * per_layer, per_layer)) return "layer " + std::to_string(l) + " " + PARAMETER_NAMES[i];
        }
    for (int i : {0, 1})
        if (bad(offsets[i], model.param_sizes[i])) return PARAMETER_NAMES[i];
    return "";
}

}  // namespace knngpt
