// tests/test_cuda_trainer.cpp — the CUDA trainer end to end against the CPU
// trainer: the same train/ and model/ code built on kernels/cuda, run for 3
// AdamW steps on a tiny config. The fp32 build must print the same losses as
// train_gpt_cpu to 1e-5 relative and end in the same parameters; the default
// build (bf16 matmul operands) must stay close, within bounds set from bf16's
// precision below.
//
// The trainers: $KNNGPT_CUDA_TRAINER (fp32 build), by default
// build/train_gpt_emu, and $KNNGPT_CUDA_TRAINER_BF16, by default
// build/train_gpt_emu_bf16: the CUDA builds on the CPU emulator, made by
// `make test`. `make test-native` points them at nvcc builds run on the GPU.
//
// Why 1e-5 holds: both builds are fp32 with the same formulas; they differ in
// summation order (OpenBLAS against the CUDA kernels' reductions and
// cuBLASLt), a few ulp per op, which 3 steps of a 2-layer model do not grow
// past ~1e-6 in the loss. The final parameters are compared norm-wise
// (||a - b|| / ||b||), since Adam's update m / (sqrt(v) + eps) turns a rounding
// difference in a gradient entry near 0 into an O(lr) step (the key bias has an
// exact gradient of 0, see test_model.cpp), which makes elementwise ratios
// meaningless there. knn and knn-tail choose keys too, but from the scores alone:
// a top-k near-tie within rounding (~1e-7 relative between the 5th and 6th score)
// happens about once in 10^7 rows, and this run has ~1700 (the tail positions are
// uniform, independent of the scores), so they keep the 3-step comparison.
//
// The bf16 bounds. Each matmul output carries a relative error up to ~2^-8
// (matmul.cuh) in its largest terms, but the loss averages B·T tokens and the
// errors of independent roundings mostly cancel: measured on this config,
// losses move by <= 5e-5 relative, gradient norms by ~1e-3, parameters by
// ~5e-3 norm-wise after 3 steps. The bounds are 10x those: losses 5e-4,
// parameters 5e-2, which a wrong operand, a missing rounding-free fp32
// accumulation or a broken conversion would exceed.
//
// The stochastic-gradient modes (sampled gradients, gumbel) are compared after one
// step from the same checkpoint instead (expect_same_resumed_step). Both builds draw
// the same samples from the same inputs (kernels/common: one score, one sampler, one
// counter layout; test_cuda_sampled_grad and test_cuda_gumbel check it bit for bit),
// but here their inputs differ by rounding, ~1e-8 relative, so a draw lying that
// close to a boundary (a walk start, a cumulative sum, a near-tie of perturbed
// scores) may pick differently; signed-start dV alone draws ~10^5 walk starts a
// step at this shape. From the random init, Adam's first update is lr sign(g) and
// turns the gradient entries such a pick changes near 0 into whole lr steps, and the
// runs diverge: one walk start 1.4e-8 of its column's l1 from a boundary moved the
// parameters by 1.4e-3 norm-wise after 3 steps with OpenBLAS's SkylakeX kernels (on
// a machine whose OpenBLAS picks those) and not with its Prescott ones. One step
// from a checkpoint, with Adam's history, such a pick moves them by ~1e-8 (measured
// over 20 seeds with both kernels: 4e-9 to 9e-9), while other draws (another
// --attn-seed) move them by ~1.5e-3; the test checks 1e-5, and that another seed
// does exceed 20 times that.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "model/checkpoint.h"
#include "tests/test_util.h"
#include "tests/trainer_test_util.h"

namespace {

using knngpt_test::exists;
using knngpt_test::final_val_loss;
using knngpt_test::parameter_difference;
using knngpt_test::relative_difference;
using knngpt_test::program_path;
using knngpt_test::run;
using knngpt_test::RunResult;
using knngpt_test::step_losses;

std::string cuda_trainer() {
    const char* p = std::getenv("KNNGPT_CUDA_TRAINER");
    return p ? std::string(p) : knngpt_test::build_dir() + "/train_gpt_emu";
}
std::string cuda_trainer_bf16() {
    const char* p = std::getenv("KNNGPT_CUDA_TRAINER_BF16");
    return p ? std::string(p) : knngpt_test::build_dir() + "/train_gpt_emu_bf16";
}

class CudaTrainer : public ::testing::Test {
  protected:
    knngpt_test::TempDir tmp;
    std::string train, val;
    void SetUp() override {
        if (!exists(cuda_trainer()) || !exists(cuda_trainer_bf16()) || !exists(program_path("train_gpt_cpu")) ||
            !exists(program_path("prepare_data")))
            GTEST_SKIP() << cuda_trainer() << ", " << cuda_trainer_bf16() << ", " << program_path("train_gpt_cpu")
                         << " or " << program_path("prepare_data")
                         << " not built (run `make test` from the repository root)";
        RunResult r = knngpt_test::prepare_text_shards(tmp, 30000);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        train = tmp.file("t_train.bin");
        val = tmp.file("t_val.bin");
    }
    // 3 steps of a tiny model (C 48 over 2 heads: HS 24, not a multiple of any
    // tile; T 24) with weight decay and a clip that bites, checkpoint at the end.
    std::string flags(const std::string& out_dir) const {
        return " -i " + train + " -j " + val +
               " --layers 2 --heads 2 --channels 48 -b 3 -t 24 -x 3 -l 3e-3 -c 0.1 --grad-clip 0.5 -v 0 -m 2 -s 0 -g 4"
               " -o " + out_dir;
    }
    // Runs both trainers; losses must agree to loss_tol relative, final
    // parameters to param_tol norm-wise. precision: what the CUDA header must say.
    void expect_same_run(const std::string& extra, const std::string& trainer = cuda_trainer(),
                         const std::string& precision = "cuda (fp32", double loss_tol = 1e-5,
                         double param_tol = 1e-5) {
        RunResult cpu = run(program_path("train_gpt_cpu") + flags(tmp.file("cpu")) + extra, tmp);
        ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
        RunResult gpu = run(trainer + flags(tmp.file("cuda")) + extra, tmp);
        ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
        EXPECT_NE(gpu.out.find("| backend       | " + precision), std::string::npos) << gpu.out;

        auto want = step_losses(cpu.out), got = step_losses(gpu.out);
        ASSERT_EQ(want.size(), 3u) << cpu.out;
        ASSERT_EQ(got.size(), 3u) << gpu.out;
        for (int i = 0; i < 3; i++)
            EXPECT_LT(relative_difference(std::stod(got[i]), std::stod(want[i])), loss_tol)
                << "step " << i + 1 << ": cuda " << got[i] << ", cpu " << want[i];
        EXPECT_LT(relative_difference(final_val_loss(gpu.out), final_val_loss(cpu.out)), loss_tol) << gpu.out;

        const double param_diff =
            parameter_difference(tmp.file("cuda/model_00000003.bin"), tmp.file("cpu/model_00000003.bin"));
        EXPECT_LT(param_diff, param_tol) << "final parameters differ";
        std::printf("losses %s vs cpu %s; parameters differ by %.2e norm-wise\n", got.back().c_str(),
                    want.back().c_str(), param_diff);
    }

    // The stochastic-gradient modes: one step from the same checkpoint (see the
    // header). The CPU trainer trains 2 steps (its own 2-step schedule) and saves;
    // each trainer resumes from its own copy for step 3 of a 3-step schedule. Its loss (a forward at equal parameters), the val
    // loss after it and the parameters must agree as in expect_same_run; and the
    // CPU trainer resumed with `other_seed` (other draws) must move the parameters
    // by more than 20 times the tolerance, so the comparison does see the draws.
    void expect_same_resumed_step(const std::string& extra, const std::string& other_seed) {
        const double tol = 1e-5;
        RunResult start = run(program_path("train_gpt_cpu") + flags(tmp.file("start")) + " -x 2 -n 2" + extra, tmp);
        ASSERT_EQ(start.exit_code, 0) << start.err;
        auto resume = [&](const std::string& trainer, const std::string& dir, const std::string& flags_added) {
            std::filesystem::remove_all(tmp.file(dir));
            std::filesystem::copy(tmp.file("start"), tmp.file(dir));
            return run(trainer + flags(tmp.file(dir)) + " -y 1" + extra + flags_added, tmp);
        };
        RunResult cpu = resume(program_path("train_gpt_cpu"), "cpu", "");
        ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
        RunResult gpu = resume(cuda_trainer(), "cuda", "");
        ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
        RunResult other = resume(program_path("train_gpt_cpu"), "other", " --attn-seed " + other_seed);
        ASSERT_EQ(other.exit_code, 0) << other.err;

        auto want = step_losses(cpu.out), got = step_losses(gpu.out);
        ASSERT_EQ(want.size(), 1u) << cpu.out;
        ASSERT_EQ(got.size(), 1u) << gpu.out;
        EXPECT_LT(relative_difference(std::stod(got[0]), std::stod(want[0])), tol)
            << "step 3: cuda " << got[0] << ", cpu " << want[0];
        EXPECT_LT(relative_difference(final_val_loss(gpu.out), final_val_loss(cpu.out)), tol) << gpu.out;
        const std::string model = "/model_00000003.bin";
        const double param_diff = parameter_difference(tmp.file("cuda") + model, tmp.file("cpu") + model);
        const double seed_diff = parameter_difference(tmp.file("other") + model, tmp.file("cpu") + model);
        EXPECT_LT(param_diff, tol) << "parameters after the resumed step differ";
        EXPECT_GT(seed_diff, 20 * tol) << "another --attn-seed barely moves the parameters: the check cannot see the draws";
        std::printf("step 3 loss %s vs cpu %s; parameters differ by %.2e norm-wise (another seed: %.2e)\n",
                    got[0].c_str(), want[0].c_str(), param_diff, seed_diff);
    }
};

TEST_F(CudaTrainer, ExactAttentionMatchesCpuTrainer) { expect_same_run(""); }

TEST_F(CudaTrainer, KnnAttentionMatchesCpuTrainer) { expect_same_run(" --attn knn --attn-k 5 --attn-seed 3"); }

TEST_F(CudaTrainer, KnnTailAttentionMatchesCpuTrainer) {
    expect_same_run(" --attn knn-tail --attn-k 4 --attn-tail 3 --attn-seed 5");
}

// The local window and the sinks in the lists (kernels/common/forced_keys.h), and the
// stratified backward (its own tail draws, the same in both builds).
TEST_F(CudaTrainer, ForcedKeysAndStratifiedGradientMatchCpuTrainer) {
    expect_same_run(" --attn knn --attn-k 3 --attn-window 4 --attn-sinks 2");
    expect_same_resumed_step(" --attn knn --attn-k 4 --attn-grad stratified --attn-grad-samples 3 --attn-seed 23", "24");
    expect_same_resumed_step(
        " --attn knn-tail --attn-k 3 --attn-tail 2 --attn-window 2 --attn-grad stratified --attn-grad-samples 4 "
        "--attn-seed 25",
        "26");
}

// The sampled backward (samples from the exact row): the same Philox draws in
// both builds, so the same samples and the same step.
TEST_F(CudaTrainer, SampledGradientMatchesCpuTrainer) {
    expect_same_resumed_step(" --attn-grad sampled --attn-grad-samples 4 --attn-seed 7", "8");
    expect_same_resumed_step(" --attn knn --attn-k 5 --attn-grad sampled --attn-grad-source exact-row --attn-seed 9",
                             "10");
}

// Signed-start dV: the same walk starts and per-row samples in both builds, from the
// exact row and from lazy Gumbel on the knn forward's lists.
TEST_F(CudaTrainer, SignedStartDvMatchesCpuTrainer) {
    expect_same_resumed_step(" --attn-grad sampled --attn-grad-samples 2 --attn-grad-dv signed --attn-seed 17", "18");
    expect_same_resumed_step(" --attn knn --attn-k 5 --attn-grad sampled --attn-grad-dv signed --attn-seed 19", "20");
}

// Lazy Gumbel on the top-k lists (kernels/common/lazy_gumbel.h, one sampler for both
// builds): the gumbel forward with lazy-Gumbel gradient samples, and the knn forward
// whose sampled backward draws lazy Gumbel samples by default.
TEST_F(CudaTrainer, LazyGumbelMatchesCpuTrainer) {
    expect_same_resumed_step(" --attn gumbel --attn-k 4 --attn-grad sampled --attn-grad-samples 4 --attn-seed 11",
                             "12");
    expect_same_resumed_step(" --attn knn --attn-k 5 --attn-grad sampled --attn-seed 13", "14");
}

// HS 24 (the default flags) trains with the fp32 attention kernels; --channels 32 makes
// HS 16, which trains with the tensor-core attention (attention_exact.cuh): bf16 Q, K,
// V, P, dS operands, whose roundings average out in the loss like the matmuls' (seen:
// 4e-5 relative after 3 steps), so the same bounds hold. The logits are bf16 too (the loss
// within 2^-7 max |logit| of fp32 logits', classifier.cuh; the logits of a model this
// young are O(0.1), so that is O(1e-3) absolute at most, 2e-4 relative; seen: 3e-5).
TEST_F(CudaTrainer, Bf16BuildStaysCloseToCpuTrainer) {
    expect_same_run("", cuda_trainer_bf16(), "cuda (bf16 matmuls", 5e-4, 5e-2);
    expect_same_run(" --channels 32", cuda_trainer_bf16(), "cuda (bf16 matmuls", 5e-4, 5e-2);
    expect_same_run(" --attn knn-tail --attn-k 4 --attn-tail 3 --attn-seed 5", cuda_trainer_bf16(),
                    "cuda (bf16 matmuls", 5e-4, 5e-2);
}

// Gradient accumulation (-d: two micro-batches per step, the fused classifier
// with dloss 1/(B T 2)) and a shuffled batch order, against the CPU trainer.
TEST_F(CudaTrainer, GradientAccumulationMatchesCpuTrainer) { expect_same_run(" -d 144 --shuffle 1"); }

// Resume in the CUDA build (bf16, so the bf16 parameter copy must be rebuilt
// from the loaded weights): 4 steps with a checkpoint at 2, then steps 3..4
// again from it, print the same losses and end in the same model file.
TEST_F(CudaTrainer, Bf16ResumeEqualsUninterruptedRun) {
    const std::string dir = tmp.file("resume");
    const std::string cmd = cuda_trainer_bf16() + flags(dir) + " -x 4 -n 2 --shuffle 1";
    RunResult full = run(cmd, tmp);
    ASSERT_EQ(full.exit_code, 0) << full.err;
    const std::string final_model = dir + "/model_00000004.bin", final_state = dir + "/state_00000004.bin";
    const std::string uninterrupted = knngpt_test::slurp(final_model);
    ASSERT_FALSE(uninterrupted.empty());
    std::remove(final_model.c_str());
    std::remove(final_state.c_str());
    RunResult resumed = run(cmd + " -y 1", tmp);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    auto a = step_losses(full.out), b = step_losses(resumed.out);
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 2u) << resumed.out;
    for (int i = 0; i < 2; i++) EXPECT_EQ(b[i], a[2 + i]) << "step " << 3 + i;
    EXPECT_TRUE(knngpt_test::slurp(final_model) == uninterrupted) << "resumed run ended in a different model";
}

// What the CUDA build has no kernel for stops at start-up with one line.
TEST_F(CudaTrainer, UnsupportedModeIsRefusedInOneLine) {
    const std::pair<std::string, std::string> cases[] = {
        {" --attn kmv --attn-tail 4", "not available in the CUDA build"},
        {" --attn kmv --attn-tail 4 --attn-kmv-threshold relative", "not available in the CUDA build"},
        {" --attn knn --attn-index lsh", "not available in the CUDA build"},
        {" --attn knn --attn-index cluster", "--attn-index cluster is retired: use --attn-index ivf"},
        {" --attn knn --attn-index heavy", "--attn-index heavy is not available in the CUDA build"},
        {" --attn knn --attn-index ivf", "--attn-index ivf is not available in the CUDA build"},
        {" --attn knn-tail --attn-k 4 --attn-tail 2 --attn-index lsh", "not available in the CUDA build"},
        {" --attn gumbel --attn-grad sampled --attn-gumbel-groups 17", "--attn-gumbel-groups 17"}};
    for (const auto& [extra, message] : cases) {
        RunResult r = run(cuda_trainer() + flags(tmp.file("refused")) + extra, tmp);
        EXPECT_EQ(r.exit_code, 1) << extra;
        EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_TRUE(r.out.empty()) << r.out;
        EXPECT_FALSE(exists(tmp.file("refused"))) << extra;
    }
}

}  // namespace
