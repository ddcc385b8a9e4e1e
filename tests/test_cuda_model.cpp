// tests/test_cuda_model.cpp — the model (model/gpt.h) on the CUDA backend, in
// process, under the emulator (or natively): the bf16 copies of the activations
// that are matmul inputs (kernels/cuda/bf16_activations.cuh).
//
// What a copy must do: hold bf16(activation) wherever the forward wrote the
// activation, so that a matmul reading it gets the very operand a per-call
// conversion would, and the bf16 build's steps are the same bits with copies
// as without. And it must be used: after the copies, the only operands still
// converted per call are the four block GEMMs' douts.
//
// Also the attention registry (model/attention_registry.h) compiled against this build:
// an index entry exactly where a row lists the CUDA build, brute's giving the CPU's lists.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#define KNNGPT_CUDA
#include "model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/topk_index.h"
#include "tests/attention_test_util.h"
#include "tests/device_array.h"
#include "tests/model_test_util.h"

namespace {

using knngpt::GPT;
using knngpt::GPTConfig;
namespace cuda = knngpt::cuda;

constexpr int kB = 3, kT = 11;  // not multiples of any block size

// Sets a process-wide switch for one scope and puts it back.
template <class Value>
struct Assign {
    Value& target;
    Value saved;
    Assign(Value& target_, Value value) : target(target_), saved(target_) { target = value; }
    ~Assign() { target = saved; }
};

std::vector<int> tokens(size_t n, uint32_t seed) {
    std::vector<int> out(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        out[i] = (int)(seed >> 24);  // < 256, the config's vocabulary
    }
    return out;
}

std::unique_ptr<GPT> build_model(const GPTConfig& c, bool copies) {
    Assign<bool> keep(cuda::bf16_activation_copies(), copies);
    auto model = std::make_unique<GPT>();
    knngpt::gpt_build(*model, c, knngpt::gpt_random_init(c, 11), kB, kT);
    return model;
}

uint32_t bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    return u;
}

// Three training steps (fused forward, backward, AdamW); the step losses in order.
std::vector<float> train(GPT& model) {
    std::vector<float> losses;
    const knngpt::AdamWConfig opt;
    for (int step = 0; step < 3; step++) {
        const std::vector<int> x = tokens(kB * kT, 7 + step), y = tokens(kB * kT, 100 + step);
        knngpt::gpt_zero_grad(model);
        knngpt::gpt_forward(model, x.data(), y.data(), kB, kT, step, 1.0f / (kB * kT));
        knngpt::gpt_backward(model, 1.0f / (kB * kT), true);
        knngpt::gpt_update(model, 1e-3f, opt, step + 1);
        losses.push_back(model.mean_loss);
    }
    return losses;
}

// The registry itself: a range is found inside its registration only (at its
// offset into the copy), not straddling its end, not after it is forgotten, and
// not at all when copies are switched off; a write across its edge, and a second
// registration overlapping it, stop with an error (they would leave a copy stale).
CUDA_TEST(CudaActivationCopies, ARangeIsFoundOnlyInsideItsRegistration) {
    knngpt_test::DeviceArray<float> buffer(100);
    const float* act = buffer.ptr + 10;  // registered: [10, 90)
    {
        Assign<bool> off(cuda::bf16_activation_copies(), false);
        cuda::register_activation_copy(act, 80);
        EXPECT_EQ(cuda::activation_copy_of(act, 1), nullptr);
    }
    cuda::register_activation_copy(act, 80);
    const __nv_bfloat16* copy = cuda::activation_copy_of(act, 80);
    ASSERT_NE(copy, nullptr);
    EXPECT_EQ(cuda::activation_copy_of(act + 30, 50), copy + 30);
    EXPECT_EQ(cuda::activation_copy_of(act + 30, 51), nullptr);  // past the end
    EXPECT_EQ(cuda::activation_copy_of(buffer.ptr + 9, 2), nullptr);  // before the start
    EXPECT_EQ(cuda::activation_copy_of(buffer.ptr + 90, 1), nullptr);
    EXPECT_EQ(cuda::activation_copy_to_write(act + 30, 50), copy + 30);
    EXPECT_EQ(cuda::activation_copy_to_write(buffer.ptr, 10), nullptr);  // outside, touching no range
    EXPECT_EQ(cuda::activation_copy_to_write(buffer.ptr + 90, 10), nullptr);
    EXPECT_THROW(cuda::activation_copy_to_write(act + 30, 51), std::logic_error);
    EXPECT_THROW(cuda::activation_copy_to_write(buffer.ptr + 9, 2), std::logic_error);
    EXPECT_THROW(cuda::refresh_activation_copy(buffer.ptr, 100), std::logic_error);
    EXPECT_THROW(cuda::register_activation_copy(buffer.ptr + 5, 10), std::logic_error);
    EXPECT_EQ(cuda::activation_copy_of(buffer.ptr + 5, 5), nullptr) << "the refused range was kept";
    // refresh writes the rounded values of the range given, there only
    std::vector<float> host(100);
    for (int i = 0; i < 100; i++) host[i] = 1.0f + i / 1024.0f;  // not all representable in bf16
    CUDA_CHECK(cudaMemcpy(buffer.ptr, host.data(), sizeof(float) * 100, cudaMemcpyHostToDevice));
    cuda::refresh_activation_copy(act + 5, 20);
    std::vector<__nv_bfloat16> got(20);
    CUDA_CHECK(cudaMemcpy(got.data(), copy + 5, sizeof(__nv_bfloat16) * 20, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 20; i++)
        EXPECT_EQ(__bfloat162float(got[i]), __bfloat162float(__float2bfloat16(host[15 + i]))) << i;
    cuda::unregister_activation_copy(act);
    EXPECT_EQ(cuda::activation_copy_of(act, 1), nullptr);
}

class CudaModelFusion : public knngpt_test::CudaDeviceTest,
                        public testing::WithParamInterface<cuda::MatmulFusion> {};

// The fused GELU epilogue writes fp32 only (its copy is a conversion after it),
// the unfused path's gelu_forward kernel writes the copy itself: both must give
// the steps of the per-call conversions.
TEST_P(CudaModelFusion, Bf16ActivationCopiesGiveTheSameStepsBitForBit) {
    Assign<cuda::MatmulPrecision> precision(cuda::matmul_precision(), cuda::MatmulPrecision::BF16);
    Assign<cuda::MatmulFusion> fusion(cuda::matmul_fusion(), GetParam());
    const GPTConfig c = knngpt_test::small_config(kT);
    auto with_copies = build_model(c, true);
    auto without = build_model(c, false);
    const std::vector<float> losses_with = train(*with_copies), losses_without = train(*without);
    for (size_t i = 0; i < losses_with.size(); i++) {
        ASSERT_TRUE(std::isfinite(losses_with[i]));
        EXPECT_EQ(bits(losses_with[i]), bits(losses_without[i])) << "step " << i;
    }
    const std::vector<float> p_with = knngpt::gpt_host_parameters(*with_copies);
    const std::vector<float> p_without = knngpt::gpt_host_parameters(*without);
    size_t differ = 0;
    for (size_t i = 0; i < p_with.size(); i++) differ += bits(p_with[i]) != bits(p_without[i]);
    EXPECT_EQ(differ, 0u) << "of " << p_with.size() << " parameters";
}

INSTANTIATE_TEST_SUITE_P(Fusions, CudaModelFusion,
                         testing::Values(cuda::MatmulFusion::BiasGelu, cuda::MatmulFusion::None),
                         [](const testing::TestParamInfo<cuda::MatmulFusion>& info) {
                             return info.param == cuda::MatmulFusion::BiasGelu ? std::string("FusedGelu")
                                                                               : std::string("GeluKernel");
                         });

// After a forward, every copy holds bf16 of its activation on the rows the
// forward wrote: the whole batch, a smaller one (sampling), and with the
// trainer's NaN fault injected into an attention output.
CUDA_TEST(CudaModel, EveryActivationCopyIsItsActivationRoundedAfterAForward) {
    Assign<cuda::MatmulPrecision> precision(cuda::matmul_precision(), cuda::MatmulPrecision::BF16);
    const GPTConfig c = knngpt_test::small_config(kT);
    auto model = build_model(c, true);
    const size_t C = c.channels, BTa = (size_t)kB * kT;
    const char* names[] = {"ln1", "atty", "ln2", "fch_gelu", "lnf"};
    const size_t widths[] = {C, C, C, 4 * C, C};
    const int layers[] = {c.num_layers, c.num_layers, c.num_layers, c.num_layers, 1};
    struct Case {
        int B, T, poison_layer;
    };
    for (const Case& run : {Case{kB, kT, -1}, Case{2, 5, -1}, Case{kB, kT, 1}}) {
        SCOPED_TRACE(testing::Message() << "B " << run.B << " T " << run.T << " poison " << run.poison_layer);
        model->poison_layer = run.poison_layer;
        const std::vector<int> x = tokens((size_t)run.B * run.T, 3), y = tokens((size_t)run.B * run.T, 4);
        knngpt::gpt_forward(*model, x.data(), y.data(), run.B, run.T, 0);
        model->poison_layer = -1;
        EXPECT_EQ(std::isnan(model->mean_loss), run.poison_layer >= 0) << model->mean_loss;
        const auto ranges = knngpt::matmul_input_activations(model->acts, c, kB, kT);
        for (int r = 0; r < 5; r++) {
            for (int l = 0; l < layers[r]; l++) {
                // the rows written: the first B*T of layer l's slice (strided by the allocated batch)
                const size_t n = (size_t)run.B * run.T * widths[r];
                const float* act = ranges[r].first + l * BTa * widths[r];
                const __nv_bfloat16* copy = cuda::activation_copy_of(act, n);
                ASSERT_NE(copy, nullptr) << names[r];
                std::vector<float> host_act(n);
                std::vector<__nv_bfloat16> host_copy(n);
                CUDA_CHECK(cudaMemcpy(host_act.data(), act, n * sizeof(float), cudaMemcpyDeviceToHost));
                CUDA_CHECK(cudaMemcpy(host_copy.data(), copy, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
                size_t wrong = 0, first = n;
                for (size_t i = 0; i < n; i++) {
                    uint16_t want, got;
                    const __nv_bfloat16 rounded = __float2bfloat16(host_act[i]);
                    std::memcpy(&want, &rounded, 2);
                    std::memcpy(&got, &host_copy[i], 2);
                    // a NaN's payload may differ; it must stay a NaN
                    const bool same = std::isnan(host_act[i]) ? std::isnan(__bfloat162float(host_copy[i])) : want == got;
                    if (!same && wrong++ == 0) first = i;
                }
                EXPECT_EQ(wrong, 0u) << names[r] << " layer " << l << ": first at " << first << " of " << n;
            }
        }
    }
}

// The matmuls read every activation from its copy and every weight from the
// parameters' copy; only the douts of the four GEMMs of each block are
// converted (dlogits are bf16 already). Without copies each input is
// converted twice more (forward, and the backward's dweight GEMM).
CUDA_TEST(CudaModel, MatmulsReadEveryActivationFromItsCopyAndConvertOnlyTheGradients) {
    Assign<cuda::MatmulPrecision> precision(cuda::matmul_precision(), cuda::MatmulPrecision::BF16);
    const GPTConfig c = knngpt_test::small_config(kT);
    const size_t L = c.num_layers, inputs_per_pass = 4 * L + 1;  // qkv, attproj, fc, fcproj a block, logits
    for (bool copies : {true, false}) {
        SCOPED_TRACE(copies ? "with copies" : "without copies");
        auto model = build_model(c, copies);
        const std::vector<int> x = tokens(kB * kT, 5), y = tokens(kB * kT, 6);
        cuda::matmul_release();  // zeroes the counters
        knngpt::gpt_zero_grad(*model);
        knngpt::gpt_forward(*model, x.data(), y.data(), kB, kT, 0, 1.0f / (kB * kT));
        knngpt::gpt_backward(*model, 1.0f / (kB * kT), true);
        const auto stats = cuda::matmul_operand_stats();
        EXPECT_EQ(stats.parameter_copies, 2 * inputs_per_pass);
        EXPECT_EQ(stats.activation_copies, copies ? 2 * inputs_per_pass : 0u);
        EXPECT_EQ(stats.converted, 4 * L + (copies ? 0u : 2 * inputs_per_pass));
    }
}

// The registry compiled against this build (kernels/cuda): an entry exactly where a row
// lists the CUDA build, and brute's entry gives the CPU entry's lists.
TEST(CudaRegistry, EntriesAreThereExactlyWhereTheRowsListTheCudaBuild) {
    EXPECT_EQ(knngpt::kThisBuild, knngpt::kBuildCuda);
    for (const knngpt::TopkIndexInfo& row : knngpt::kTopkIndexes)
        EXPECT_EQ(row.entry != nullptr, (row.builds & knngpt::kBuildCuda) != 0) << row.name;
    const knngpt_test::AttentionShape s{2, 70, 32, 2};
    const std::vector<float> qkv = knngpt_test::uniform(s.qkv_size(), 61);
    const int k = 5;
    std::vector<int> want(s.idx_size(k));
    knngpt::cpu::topk_search_brute(want.data(), qkv.data(), s.B, s.T, s.C, s.NH, k, knngpt::LshParams(), nullptr);
    knngpt_test::DeviceArray<float> d_qkv(qkv);
    knngpt_test::DeviceArray<int> d_idx(std::vector<int>(s.idx_size(k), -7));
    knngpt::topk_index_info(knngpt::TopkIndex::Brute)
        .entry(d_idx.ptr, d_qkv.ptr, s.B, s.T, s.C, s.NH, k, knngpt::LshParams(), nullptr);
    EXPECT_EQ(d_idx.to_host(), want);
}

}  // namespace
