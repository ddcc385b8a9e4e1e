// tests/test_trainer.cpp — the train_gpt_cpu program end to end: resume
// equals an uninterrupted run, gradient accumulation, bad input, and every
// flag documented. Runs ./train_gpt_cpu and ./prepare_data from the
// repository root (`make test` builds them first).
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "data/dataloader.h"
#include "train/omp_threads.h"
#include "kernels/common/rng.h"
#include "model/checkpoint.h"
#include "tests/test_util.h"
#include "tests/trainer_test_util.h"

namespace {

using knngpt_test::exists;
using knngpt_test::program_path;
using knngpt_test::run;
using knngpt_test::RunResult;
using knngpt_test::slurp;
using knngpt_test::step_losses;

class Trainer : public knngpt_test::CpuTrainerTest {};

}  // namespace

TEST_F(Trainer, LossFallsOnRealText) {
    RunResult r = run(base() + " -x 40", tmp);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto losses = step_losses(r.out);
    ASSERT_EQ(losses.size(), 40u);
    EXPECT_LT(std::stod(losses.back()), std::stod(losses.front()) - 1.0) << r.out;
    EXPECT_NE(r.out.find("val loss"), std::string::npos);
    EXPECT_NE(r.out.find("perplexity"), std::string::npos);
    EXPECT_NE(r.out.find("---- sample"), std::string::npos);
    EXPECT_NE(r.out.find("done: 40 steps"), std::string::npos);
}

// Resume: run 12 steps with a checkpoint at 6; remove the final checkpoint,
// resume from step 6 and check steps 7..12 print the same losses and end in
// the same model file, byte for byte. Shuffled batches, so the data position
// must be restored too.
TEST_F(Trainer, ResumeAfterSixStepsEqualsUninterruptedRun) {
    std::string dir = tmp.file("run");
    std::string cmd = base() + " -x 12 -n 6 --shuffle 1 -o " + dir;
    RunResult full = run(cmd, tmp);
    ASSERT_EQ(full.exit_code, 0) << full.err;
    auto full_losses = step_losses(full.out);
    ASSERT_EQ(full_losses.size(), 12u);
    std::string final_model = dir + "/model_00000012.bin", final_state = dir + "/state_00000012.bin";
    ASSERT_TRUE(exists(dir + "/model_00000006.bin") && exists(dir + "/state_00000006.bin"));
    std::string uninterrupted = slurp(final_model);
    std::remove(final_model.c_str());
    std::remove(final_state.c_str());

    RunResult resumed = run(cmd + " -y 1", tmp);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    auto resumed_losses = step_losses(resumed.out);
    ASSERT_EQ(resumed_losses.size(), 6u) << resumed.out;
    for (int i = 0; i < 6; i++) EXPECT_EQ(resumed_losses[i], full_losses[6 + i]) << "step " << 7 + i;
    EXPECT_TRUE(slurp(final_model) == uninterrupted) << "resumed run ended in a different model";
    // no temporary files are left behind
    for (const char* name : {"model_00000012.bin.tmp", "state_00000012.bin.tmp"}) EXPECT_FALSE(exists(dir + "/" + name));
}

// -d: two micro-batches of 4 sequences accumulate to the gradient of one batch of 8,
// in the stochastic modes too: every forward of a step draws at the step's number, and
// micro-batch m's rows as rows 4m.. of the step's batch (kernels/common/draws.h), so
// both runs draw the same samples for each sequence.
TEST_F(Trainer, GradientAccumulationMatchesTheBigBatch) {
    for (const char* attn : {"", " --attn knn-tail --attn-k 4 --attn-tail 3 --attn-seed 5",
                             " --attn-grad sampled --attn-grad-samples 4 --attn-seed 7"}) {
        RunResult big = run(base() + attn + " -x 5 -b 8 -d 256", tmp);
        RunResult accum = run(base() + attn + " -x 5 -b 4 -d 256", tmp);
        ASSERT_EQ(big.exit_code, 0) << big.err;
        ASSERT_EQ(accum.exit_code, 0) << accum.err;
        auto a = step_losses(big.out), b = step_losses(accum.out);
        ASSERT_EQ(a.size(), 5u);
        ASSERT_EQ(b.size(), 5u);
        for (int i = 0; i < 5; i++)
            EXPECT_NEAR(std::stod(a[i]), std::stod(b[i]), 1e-5) << "step " << i + 1 << ", attention" << attn;
    }
}

TEST_F(Trainer, StartsFromAnLlmcCheckpointAndWritesOne) {
    std::string dir = tmp.file("out");
    RunResult first = run(base() + " -x 3 -o " + dir, tmp);
    ASSERT_EQ(first.exit_code, 0) << first.err;
    knngpt::ModelFile m = knngpt::read_model_file(dir + "/model_00000003.bin");
    EXPECT_EQ(m.config.num_layers, 2);
    EXPECT_EQ(m.config.vocab_size, 256);
    RunResult again = run(program_path("train_gpt_cpu") + " -i " + train + " -j " + val + " -e " + dir +
                              "/model_00000003.bin -b 4 -t 32 -x 2 -v 0 -m 2 -s 0 -g 4",
                          tmp);
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_NE(again.out.find("llm.c version 3"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Bad input: one line on stderr naming the problem, non-zero exit, nothing written.

namespace {
struct BadCase {
    std::string name, args, expect;  // expect: a piece of the error line
};
}  // namespace

TEST_F(Trainer, BadInputGivesOneClearLineAndWritesNothing) {
    // files to break
    std::vector<uint16_t> few(100, 'a');
    knngpt::write_token_shard(tmp.file("small.bin"), few);
    std::string good = slurp(train);
    std::string bad_magic = good;
    bad_magic[0] ^= 1;
    std::ofstream(tmp.file("magic.bin"), std::ios::binary) << bad_magic;
    std::ofstream(tmp.file("truncated.bin"), std::ios::binary) << good.substr(0, good.size() / 2);
    std::string bad_version = good;
    bad_version[4] = 7;
    std::ofstream(tmp.file("version.bin"), std::ios::binary) << bad_version;
    knngpt::GPTConfig c;
    c.max_seq_len = 16, c.vocab_size = 256, c.padded_vocab_size = 256, c.num_layers = 1, c.num_heads = 2, c.channels = 16;
    knngpt::write_model_file(tmp.file("ckpt.bin"), c, knngpt::gpt_random_init(c, 1));
    std::string ckpt = slurp(tmp.file("ckpt.bin"));
    std::ofstream(tmp.file("ckpt_truncated.bin"), std::ios::binary) << ckpt.substr(0, ckpt.size() - 100);
    std::string ckpt_magic = ckpt;
    ckpt_magic[1] ^= 1;
    std::ofstream(tmp.file("ckpt_magic.bin"), std::ios::binary) << ckpt_magic;

    std::string data = " -i " + train + " -j " + val;
    std::vector<BadCase> cases = {
        {"missing train file", " -i " + tmp.file("nope.bin") + " -j " + val, "nope.bin"},
        {"wrong shard magic", " -i " + tmp.file("magic.bin") + " -j " + val, "magic"},
        {"wrong shard version", " -i " + tmp.file("version.bin") + " -j " + val, "version"},
        {"truncated shard", " -i " + tmp.file("truncated.bin") + " -j " + val, "truncated.bin"},
        {"shard smaller than one batch", " -i " + tmp.file("small.bin") + " -j " + val, "small"},
        {"missing checkpoint", data + " -e " + tmp.file("none.bin"), "none.bin"},
        {"wrong checkpoint magic", data + " -e " + tmp.file("ckpt_magic.bin"), "bad magic"},
        {"truncated checkpoint", data + " -e " + tmp.file("ckpt_truncated.bin"), "truncated"},
        {"T above the model's max context", data + " -e " + tmp.file("ckpt.bin") + " -t 32", "max context 16"},
        {"data vocab larger than the model's", data + " --vocab 100", "vocab"},
        {"non-numeric flag value", data + " -b abc", "-b: expected an integer, got 'abc'"},
        {"non-numeric float", data + " -l fast", "-l: expected a number"},
        {"unknown flag", data + " --frobnicate 1", "unknown flag '--frobnicate'"},
        {"missing value", data + " -b", "-b: missing value"},
        {"unknown schedule", data + " -k wiggly", "unknown learning-rate schedule 'wiggly'"},
        {"unknown attention mode", data + " --attn fancy", "unknown attention mode 'fancy'"},
        {"bad descriptor", data + " -e d7", "unknown depth descriptor"},
        {"-d not a multiple of B*T", data + " -b 4 -t 32 -d 100", "not a multiple"},
        {"resume without checkpoint", data + " -y 1 -o " + tmp.file("empty_dir_that_is_missing"), "no checkpoint"},
    };
    for (const BadCase& bc : cases) {
        std::string out_dir = tmp.file("should_not_exist");
        // the case's own flags come last, so they win (and a missing value stays missing)
        RunResult r = run(program_path("train_gpt_cpu") + " -x 2 -v 0 -s 0 -o " + out_dir + bc.args, tmp);
        EXPECT_NE(r.exit_code, 0) << bc.name;
        EXPECT_NE(r.err.find(bc.expect), std::string::npos) << bc.name << ": stderr was: " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bc.name << ": stderr was: " << r.err;
        EXPECT_EQ(r.out, "") << bc.name << ": printed to stdout";
        EXPECT_FALSE(exists(out_dir)) << bc.name << ": created the output directory";
    }
}

// Every flag appears in -h and in the trainer's README (train/README.md).
TEST_F(Trainer, EveryFlagIsInHelpAndReadme) {
    RunResult help = run(program_path("train_gpt_cpu") + " -h", tmp);
    ASSERT_EQ(help.exit_code, 0);
    std::string readme = slurp("train/README.md");
    ASSERT_FALSE(readme.empty()) << "train/README.md not found from " << tmp.path;
    for (const char* flag : {"-i", "-j", "-e", "-o", "-b", "-t", "-d", "-l", "-u", "-k", "-q", "-c", "-x", "-a",
                             "-v", "-m", "-s", "-g", "-n", "-y", "-h", "--shuffle", "--layers", "--heads",
                             "--channels", "--max-seq-len", "--vocab", "--seed", "--attn", "--beta1", "--beta2",
                             "--eps", "--grad-clip", "--tokenizer", "--attn-k", "--attn-tail", "--attn-index",
                             "--attn-grad", "--attn-grad-samples", "--attn-grad-source", "--attn-grad-dv",
                             "--attn-gumbel-groups", "--attn-gumbel-samples", "--attn-seed", "--attn-eval",
                             "--attn-warmup", "--attn-window", "--attn-sinks", "--attn-kmv-threshold", "--attn-kmv-levels", "--attn-kmv-alpha",
                             "--eval-only", "--gpt2-vocab", "--prompt", "--prompt-file", "-z", "-pi", "-pn", "-pr",
                             "-pg", "-ps", "-pp", "--comm-timeout"}) {
        std::regex documented(std::string("(^|[\\s`])") + flag + "[\\s`,]");
        EXPECT_TRUE(std::regex_search(help.out, documented)) << flag << " missing from -h";
        EXPECT_TRUE(std::regex_search(readme, documented)) << flag << " missing from train/README.md";
    }
}

// ---------------------------------------------------------------------------
// Attention modes in the trainer

// knn with k >= T selects every causal key: the same training as exact.
TEST_F(Trainer, KnnWithKAtLeastTTrainsLikeExactFor20Steps) {
    RunResult exact = run(base() + " -x 20 --attn exact", tmp);
    RunResult knn = run(base() + " -x 20 --attn knn --attn-k 32", tmp);
    RunResult knn_ivf = run(base() + " -x 20 --attn knn --attn-k 40 --attn-index ivf", tmp);
    // a window of every key (and a sink) leaves nothing for k = 1 to choose
    RunResult window = run(base() + " -x 20 --attn knn --attn-k 1 --attn-window 32 --attn-sinks 1", tmp);
    auto a = step_losses(exact.out);
    ASSERT_EQ(a.size(), 20u) << exact.err;
    // the sparse kernel sums in another order than the flash kernel: fp32 rounding only
    for (const RunResult* r : {&knn, &knn_ivf, &window}) {
        ASSERT_EQ(r->exit_code, 0) << r->err;
        auto b = step_losses(r->out);
        ASSERT_EQ(b.size(), 20u);
        for (int i = 0; i < 20; i++) EXPECT_NEAR(std::stod(b[i]), std::stod(a[i]), 2e-5 * std::stod(a[i])) << "step " << i + 1;
    }

}

// A retired index stops the run with one line naming its replacement; an experimental
// choice prints its measured cost (model/attention_registry.h) and trains; a core one
// prints no such line.
TEST_F(Trainer, RetiredIndexesNameTheirReplacementAndExperimentalModesSayWhatTheyCost) {
    for (const auto& [retired, replacement] : {std::pair<std::string, std::string>{"block", "brute"},
                                               {"cluster", "ivf"}, {"int8", "brute"}}) {
        std::string out_dir = tmp.file("never");
        RunResult r = run(base() + " -x 2 -o " + out_dir + " --attn knn --attn-index " + retired, tmp);
        EXPECT_EQ(r.exit_code, 1) << retired;
        EXPECT_NE(r.err.find("--attn-index " + retired + " is retired: use --attn-index " + replacement),
                  std::string::npos)
            << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_FALSE(exists(out_dir)) << retired;
    }
    for (const auto& [flags, line] : {std::pair<std::string, std::string>{"--attn gumbel --attn-grad sampled",
                                                                          "note: --attn gumbel is experimental: +0.48"},
                                      {"--attn knn --attn-index lsh", "note: --attn-index lsh is experimental:"},
                                      {"--attn exact --attn-grad sampled", "note: --attn-grad sampled is experimental:"}}) {
        RunResult r = run(base() + " -x 2 " + flags, tmp);
        ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.err;
        EXPECT_NE(r.out.find(line), std::string::npos) << flags << ": " << r.out;
    }
    RunResult core = run(base() + " -x 2 --attn knn-tail --attn-k 4 --attn-tail 4 --attn-index heavy", tmp);
    ASSERT_EQ(core.exit_code, 0) << core.err;
    EXPECT_EQ(core.out.find("experimental"), std::string::npos) << core.out;
}

// Every mode trains (the loss falls) and reports its settings.
TEST_F(Trainer, EveryAttentionModeTrains) {
    const std::vector<std::pair<std::string, std::string>> modes = {
        {"--attn knn --attn-k 4", "knn k 4 index brute, grad exact"},
        {"--attn knn --attn-k 4 --attn-index lsh", "knn k 4 index lsh"},
        {"--attn knn --attn-k 4 --attn-index heavy", "knn k 4 index heavy"},
        {"--attn knn --attn-k 4 --attn-index ivf", "knn k 4 index ivf"},
        {"--attn knn-tail --attn-k 4 --attn-tail 4", "knn-tail k 4 index brute tail 4"},
        {"--attn gumbel --attn-k 4 --attn-grad sampled", "gumbel k 4"},
        {"--attn kmv --attn-k 4 --attn-tail 4", "kmv k 4"},
        {"--attn kmv --attn-k 4 --attn-tail 4 --attn-kmv-threshold relative", "light 4 threshold relative"},
        {"--attn kmv --attn-k 4 --attn-tail 4 --attn-kmv-threshold relative --attn-kmv-levels 4 --attn-kmv-alpha 1",
         "threshold relative levels 4 alpha 1,"},
        {"--attn exact --attn-grad sampled --attn-grad-samples 8", "exact, grad sampled s 8 exact-row"},
        {"--attn knn --attn-k 4 --attn-grad stratified --attn-grad-samples 4", "knn k 4 index brute, grad stratified m 4"},
        {"--attn knn --attn-k 4 --attn-window 4 --attn-sinks 1", "knn k 4 index brute window 4 sinks 1, grad exact"},
        {"--attn knn-tail --attn-k 4 --attn-tail 4 --attn-window 2 --attn-grad stratified",
         "knn-tail k 4 index brute window 2 tail 4, grad stratified m 16"},
        {"--attn knn --attn-k 4 --attn-grad sampled --attn-grad-dv signed", "lazy-gumbel signed-dv"},
    };
    for (const auto& [flags, description] : modes) {
        RunResult r = run(base() + " -x 30 " + flags, tmp);
        ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.err;
        EXPECT_NE(r.out.find(description), std::string::npos) << flags << ": header does not say '" << description << "'";
        auto losses = step_losses(r.out);
        ASSERT_EQ(losses.size(), 30u) << flags;
        EXPECT_LT(std::stod(losses.back()), std::stod(losses.front()) - 0.5) << flags << "\n" << r.out;
    }
}

TEST_F(Trainer, SameAttentionSeedSameRunAnotherSeedAnotherRun) {
    std::string cmd = base() + " -x 5 --attn knn-tail --attn-k 4 --attn-tail 4";
    RunResult a = run(cmd + " --attn-seed 1", tmp), b = run(cmd + " --attn-seed 1", tmp), c = run(cmd + " --attn-seed 2", tmp);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(step_losses(a.out), step_losses(b.out));
    EXPECT_NE(step_losses(a.out), step_losses(c.out));
}

TEST_F(Trainer, AttnEvalReportsValidationLossUnderOtherSettings) {
    RunResult r = run(base() + " -x 3 --attn-eval exact,knn:k=4,knn-tail:k=4:m=4,knn:k=32,knn:k=1:w=32:sinks=1", tmp);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::regex line(R"(val loss ([0-9.]+) \| perplexity [0-9.]+ \| step 3(?: \| attention (\S+))?)");
    std::map<std::string, double> losses;
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), line), end; it != end; ++it)
        losses[(*it)[2].matched ? (*it)[2].str() : "trained"] = std::stod((*it)[1]);
    ASSERT_EQ(losses.size(), 6u) << r.out;
    EXPECT_NEAR(losses["exact"], losses["trained"], 1e-6);         // trained with exact
    EXPECT_NEAR(losses["knn:k=32"], losses["trained"], 1e-4);      // k >= T is exact
    EXPECT_NEAR(losses["knn:k=1:w=32:sinks=1"], losses["trained"], 1e-4);  // a window of every key too
    EXPECT_NE(losses["knn:k=4"], losses["trained"]);
}

// --eval-only: the model file of a run, evaluated under the run's flags, gives the
// val loss the run printed at its end (the same batches and draws), and another
// setting another loss; it needs no train data and writes nothing.
TEST_F(Trainer, EvalOnlyGivesTheValLossTheTrainingPrinted) {
    const std::string dir = tmp.file("run_eval");
    const std::string attn = " --attn knn-tail --attn-k 4 --attn-tail 4 --attn-seed 3";
    RunResult trained = run(base() + " -x 6 -m 3" + attn + " -o " + dir, tmp);
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
    const std::string model = dir + "/model_00000006.bin";
    const std::string eval = program_path("train_gpt_cpu") + " -i " + tmp.file("no_train_data.bin") + " -j " + val +
                             " -b 4 -t 32 -m 3 -e " + model + " --eval-only 1";
    RunResult same = run(eval + attn + " --attn-eval exact", tmp);
    ASSERT_EQ(same.exit_code, 0) << same.err;
    std::smatch m;
    const std::regex summary(R"(done: evaluation only in [0-9.]+ s \| 3 val batches \| val loss ([0-9.]+) \| perplexity)");
    ASSERT_TRUE(std::regex_search(same.out, m, summary)) << same.out;
    EXPECT_EQ(std::stod(m[1]), knngpt_test::final_val_loss(trained.out)) << "trained:\n" << trained.out << "\neval:\n" << same.out;
    EXPECT_NE(same.out.find("| attention exact"), std::string::npos) << same.out;
    EXPECT_EQ(same.out.find("---- sample"), std::string::npos) << "evaluation drew a sample";
    EXPECT_EQ(same.out.find("step    1/"), std::string::npos) << "evaluation trained";
    RunResult other = run(eval + " --attn knn --attn-k 2", tmp);
    ASSERT_EQ(other.exit_code, 0) << other.err;
    ASSERT_TRUE(std::regex_search(other.out, m, summary)) << other.out;
    EXPECT_NE(std::stod(m[1]), knngpt_test::final_val_loss(trained.out));
    for (const char* flags : {" -o ", " -y 1 -o "}) {
        RunResult refused = run(eval + flags + tmp.file("never"), tmp);
        EXPECT_EQ(refused.exit_code, 1);
        EXPECT_NE(refused.err.find("--eval-only 1 trains nothing"), std::string::npos) << refused.err;
        EXPECT_FALSE(exists(tmp.file("never")));
    }
}

TEST_F(Trainer, ResumeKeepsTheAttentionSamplesExact) {
    std::string dir = tmp.file("run_attn");
    std::string cmd = base() + " -x 8 -n 4 --attn knn-tail --attn-k 4 --attn-tail 4 --attn-seed 3 -o " + dir;
    RunResult full = run(cmd, tmp);
    ASSERT_EQ(full.exit_code, 0) << full.err;
    std::remove((dir + "/model_00000008.bin").c_str());
    std::remove((dir + "/state_00000008.bin").c_str());
    RunResult resumed = run(cmd + " -y 1", tmp);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    auto a = step_losses(full.out), b = step_losses(resumed.out);
    ASSERT_EQ(b.size(), 4u);
    for (int i = 0; i < 4; i++) EXPECT_EQ(b[i], a[4 + i]) << "step " << 5 + i;
    // the state file records the attention settings
    RunResult other = run(base() + " -x 8 -n 4 --attn exact -o " + dir + " -y 1", tmp);
    EXPECT_NE(other.out.find("note: the checkpoint trained with attention 'knn-tail"), std::string::npos) << other.out;
}

// --attn-warmup N: the first N steps train exactly as an exact run (bit for bit),
// the later ones with the configured attention; a resume before the switch lands
// on the same losses as the uninterrupted run.
TEST_F(Trainer, AttnWarmupTrainsExactFirstThenTheConfiguredAttention) {
    RunResult exact = run(base() + " -x 8 --attn exact", tmp);
    RunResult knn = run(base() + " -x 8 --attn knn --attn-k 4", tmp);
    const std::string dir = tmp.file("run_warmup");
    const std::string cmd = base() + " -x 8 -n 2 --attn knn --attn-k 4 --attn-warmup 4 -o " + dir;
    RunResult warm = run(cmd, tmp);
    ASSERT_EQ(exact.exit_code, 0) << exact.err;
    ASSERT_EQ(knn.exit_code, 0) << knn.err;
    ASSERT_EQ(warm.exit_code, 0) << warm.err;
    EXPECT_NE(warm.out.find("seed 0 after 4 exact steps"), std::string::npos) << warm.out;
    auto e = step_losses(exact.out), k = step_losses(knn.out), w = step_losses(warm.out);
    ASSERT_EQ(w.size(), 8u);
    for (int i = 0; i < 4; i++) EXPECT_EQ(w[i], e[i]) << "step " << i + 1 << " is in the warmup";
    for (int i = 4; i < 8; i++) EXPECT_NE(w[i], e[i]) << "step " << i + 1 << " is past the warmup";
    EXPECT_NE(w[0], k[0]);
    // the validation runs the configured attention: the final val loss is not exact's
    EXPECT_NE(knngpt_test::final_val_loss(warm.out), knngpt_test::final_val_loss(exact.out));
    // and so does every validation inside the warmup: at step 2 the model is the exact run's,
    // and its val loss is what the exact run reports for it under --attn-eval knn:k=4
    RunResult exact_eval = run(base() + " -x 8 -v 2 --attn exact --attn-eval knn:k=4", tmp);
    RunResult warm_val = run(base() + " -x 8 -v 2 --attn knn --attn-k 4 --attn-warmup 4", tmp);
    ASSERT_EQ(exact_eval.exit_code, 0) << exact_eval.err;
    ASSERT_EQ(warm_val.exit_code, 0) << warm_val.err;
    // "val loss X" printed at `step`, for the run's own attention (`spec` empty) or an --attn-eval one
    auto val_at = [](const std::string& out, int step, const std::string& spec) {
        const std::string tail = spec.empty() ? "\n" : " \\| attention " + spec + "\n";
        std::smatch m;
        const std::regex re("val loss ([0-9.]+) \\| perplexity [0-9.]+ \\| step " + std::to_string(step) + tail);
        return std::regex_search(out, m, re) ? m[1].str() : std::string();
    };
    const std::string knn_at_2 = val_at(exact_eval.out, 2, "knn:k=4"), exact_at_2 = val_at(exact_eval.out, 2, ""),
                      warm_at_2 = val_at(warm_val.out, 2, "");
    ASSERT_FALSE(knn_at_2.empty() || exact_at_2.empty()) << exact_eval.out;
    ASSERT_FALSE(warm_at_2.empty()) << warm_val.out;
    EXPECT_EQ(warm_at_2, knn_at_2) << "a validation inside the warmup ran another attention than --attn's";
    EXPECT_NE(knn_at_2, exact_at_2) << "knn k = 4 and exact give the same val loss: the check cannot fail";
    // a sample inside the warmup runs the configured attention too, whether or not a validation
    // ran at its step (before, it ran exact attention when none had); k = 1 and 64 tokens, so the
    // attention shows in the text
    auto sample_at_2 = [](const std::string& out) {
        const size_t at = out.find("---- sample (step 2) ----");
        return at == std::string::npos ? std::string() : out.substr(at, out.find("-------------------------", at + 26) - at);
    };
    RunResult sampled_no_val = run(base() + " -x 3 -s 2 -g 64 --attn knn --attn-k 1 --attn-warmup 4", tmp);
    RunResult sampled_val = run(base() + " -x 3 -s 2 -g 64 -v 2 --attn knn --attn-k 1 --attn-warmup 4", tmp);
    ASSERT_FALSE(sample_at_2(sampled_no_val.out).empty()) << sampled_no_val.out;
    EXPECT_EQ(sample_at_2(sampled_no_val.out), sample_at_2(sampled_val.out));
    for (int s : {4, 6, 8}) {
        std::remove((dir + "/model_0000000" + std::to_string(s) + ".bin").c_str());
        std::remove((dir + "/state_0000000" + std::to_string(s) + ".bin").c_str());
    }
    RunResult resumed = run(cmd + " -y 1", tmp);  // from step 2, across the switch
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    auto r = step_losses(resumed.out);
    ASSERT_EQ(r.size(), 6u);
    for (int i = 0; i < 6; i++) EXPECT_EQ(r[i], w[2 + i]) << "step " << 3 + i;
    RunResult bad = run(base() + " -x 2 --attn-warmup -1", tmp);
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("--attn-warmup must be >= 0"), std::string::npos) << bad.err;
}

TEST_F(Trainer, BadAttentionFlagsGiveOneClearLine) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--attn knnn", "unknown attention mode 'knnn'"},
        {"--attn knn --attn-k 0", "--attn-k must be >= 1"},
        {"--attn knn --attn-tail 4", "--attn-tail needs --attn knn-tail or kmv"},
        {"--attn knn --attn-kmv-threshold relative", "--attn-kmv-threshold relative needs --attn kmv"},
        {"--attn kmv --attn-tail 4 --attn-kmv-threshold row", "unknown threshold 'row'"},
        {"--attn kmv --attn-tail 4 --attn-kmv-levels 0", "--attn-kmv-levels must be in 1..8, got 0"},
        {"--attn kmv --attn-tail 4 --attn-kmv-levels 9", "--attn-kmv-levels must be in 1..8, got 9"},
        {"--attn knn --attn-kmv-levels 2", "--attn-kmv-levels needs --attn kmv"},
        {"--attn kmv --attn-tail 4 --attn-kmv-alpha 0", "--attn-kmv-alpha must be in (0, 4]"},
        {"--attn kmv --attn-tail 4 --attn-kmv-alpha nan", "--attn-kmv-alpha"},
        {"--attn exact --attn-kmv-alpha 1", "--attn-kmv-alpha needs --attn kmv"},
        {"--attn knn-tail --attn-tail -1", "--attn-tail must be >= 0"},
        {"--attn knn --attn-index kdtree", "unknown index 'kdtree'"},
        {"--attn-grad approximate", "unknown gradient mode 'approximate'"},
        {"--attn gumbel", "use --attn-grad sampled"},
        {"--attn gumbel --attn-grad sampled --attn-index lsh", "needs an exact top-k index"},
        {"--attn knn --attn-index lsh --attn-grad sampled", "needs an exact top-k index"},
        {"--attn gumbel --attn-grad sampled --attn-index ivf", "needs an exact top-k index"},
        {"--attn knn --attn-index heavy --attn-grad sampled", "not heavy"},
        {"--attn knn --attn-index ivf --attn-grad sampled", "not ivf"},
        {"--attn-grad sampled --attn-grad-samples 0", "--attn-grad-samples must be >= 1"},
        {"--attn knn --attn-window -1", "--attn-window and --attn-sinks must be >= 0"},
        {"--attn exact --attn-sinks 2", "--attn-window and --attn-sinks need --attn knn or knn-tail"},
        {"--attn knn --attn-window 4 --attn-grad sampled", "do not combine with --attn-grad sampled"},
        {"--attn exact --attn-grad stratified", "--attn-grad stratified needs --attn knn or knn-tail"},
        {"--attn-eval knn:w=x", "--attn-eval w: expected an integer"},
        {"--attn-k x", "--attn-k: expected an integer"},
        {"--attn-eval knn:q=3", "unknown field 'q'"},
        {"--attn-eval fancy", "unknown attention mode 'fancy'"},
    };
    for (const auto& [flags, expect] : cases) {
        std::string out_dir = tmp.file("never");
        RunResult r = run(base() + " -x 2 -o " + out_dir + " " + flags, tmp);
        EXPECT_NE(r.exit_code, 0) << flags;
        EXPECT_NE(r.err.find(expect), std::string::npos) << flags << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << flags << ": " << r.err;
        EXPECT_FALSE(exists(out_dir)) << flags;
    }
}

// Every op splits its work by shape, never by thread count (kernels/cpu/parallel.h,
// sgemm_blocks.h, global_norm.h): 1, 2 and 3 threads train the same model, byte for byte,
// exact and approximate attention alike. So the trainer may follow the machine's load.
TEST_F(Trainer, TheThreadCountDoesNotChangeARunsBits) {
    const std::vector<std::string> settings = {"--attn exact", "--attn knn --attn-k 4 --attn-index ivf",
                                               "--attn knn-tail --attn-k 4 --attn-tail 4 --attn-grad sampled"};
    for (size_t s = 0; s < settings.size(); s++) {
        SCOPED_TRACE(settings[s]);
        std::string first;
        for (int threads : {1, 2, 3}) {
            const std::string dir = tmp.file("threads_" + std::to_string(s) + "_" + std::to_string(threads));
            RunResult r = run_with_threads(base() + " -x 4 -b 8 " + settings[s] + " -o " + dir, threads, tmp);
            ASSERT_EQ(r.exit_code, 0) << r.err;
            const std::string model = slurp(dir + "/model_00000004.bin");
            ASSERT_FALSE(model.empty());
            if (threads == 1) first = model;
            else EXPECT_TRUE(model == first) << threads << " threads trained another model than 1";
        }
    }
}

// Without OMP_NUM_THREADS the trainer leaves the cores other processes use to them
// (train/omp_threads.h): beside a busy process on every core it runs one thread, says so, and
// trains the model it trains alone.
TEST_F(Trainer, FollowsTheLoadWithoutChangingTheModel) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 2) GTEST_SKIP() << "one core: no thread count to follow the load with";
    const std::string cmd = base() + " -x 60 -b 8";
    const std::string script = tmp.file("beside_busy.sh");
    std::ofstream(script) << "for i in $(seq " << cores << "); do sh -c 'while :; do :; done' & done\n"
                          << "sleep 0.3\n"
                          << "env -u OMP_NUM_THREADS " << cmd << " -o " << tmp.file("loaded") << "\n"
                          << "rc=$?; kill $(jobs -p); exit $rc\n";
    RunResult loaded = run("bash " + script, tmp);
    ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
    EXPECT_NE(loaded.out.find("(every core, fewer while busy)"), std::string::npos) << loaded.out;
    EXPECT_TRUE(std::regex_search(loaded.out, std::regex("note: (other processes are running: 1 of " +
                                                         std::to_string(cores) + " threads to start|step \\d+: 1 of)")))
        << loaded.out;
    RunResult alone = run_with_threads(cmd + " -o " + tmp.file("alone"), (int)cores, tmp);
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_EQ(alone.out.find("note: "), std::string::npos) << alone.out;
    EXPECT_TRUE(slurp(tmp.file("loaded/model_00000060.bin")) == slurp(tmp.file("alone/model_00000060.bin")));
}

// The arithmetic behind it: the count leaves the others' cores, at least one thread; the
// others' use is the cores' busy time less this process's; /proc/stat's busy time is read
// (this process's own spin shows in it).
TEST(ThreadsFollowingLoad, LeavesTheOthersCoresToThem) {
    EXPECT_EQ(knngpt::threads_beside(2, 0.0), 2);
    EXPECT_EQ(knngpt::threads_beside(2, 0.4), 2);
    EXPECT_EQ(knngpt::threads_beside(2, 1.1), 1);
    EXPECT_EQ(knngpt::threads_beside(2, 3.0), 1);
    EXPECT_EQ(knngpt::threads_beside(16, 5.2), 11);
    const knngpt::CoreTimes before{10.0, 100.0, 3.0, true}, after{10.5, 100.9, 3.4, true};
    EXPECT_NEAR(knngpt::others_cores(before, after), (0.9 - 0.4) / 0.5, 1e-9);
    EXPECT_EQ(knngpt::others_cores(before, knngpt::CoreTimes{}), 0.0) << "unreadable: no others";

    cpu_set_t cores;
    ASSERT_EQ(sched_getaffinity(0, sizeof(cores), &cores), 0);
    const knngpt::CoreTimes start = knngpt::read_core_times(cores);
    ASSERT_TRUE(start.ok) << "/proc/stat unreadable";
    volatile double x = 0;
    while (knngpt::clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - start.own_s < 0.3) x = x + 1;
    const knngpt::CoreTimes end = knngpt::read_core_times(cores);
    EXPECT_GE(end.own_s - start.own_s, 0.3);
    EXPECT_GE(end.busy_s - start.busy_s, 0.2) << "this process's 0.3 s of spin is busy time on its cores";
}

// The wait policy (train/omp_threads.h): without OMP_WAIT_POLICY or GOMP_SPINCOUNT the
// trainer runs itself again with a short spin, and libgomp itself reports that spin (its
// last OMP_DISPLAY_ENV block is the re-executed process's); a policy the user chose is
// kept. The header's threads row says which, and where the thread count came from.
TEST_F(Trainer, WaitsWithAShortSpinUnlessTheUserChoseAPolicy) {
    auto last_spin = [](const std::string& err) {
        const std::string key = "GOMP_SPINCOUNT = '";
        const size_t at = err.rfind(key);
        if (at == std::string::npos) return std::string("none");
        return err.substr(at + key.size(), err.find('\'', at + key.size()) - at - key.size());
    };
    const std::string cmd = base() + " -x 1 -g 4";
    RunResult ours = run("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose " + cmd, tmp);
    ASSERT_EQ(ours.exit_code, 0) << ours.err;
    EXPECT_EQ(last_spin(ours.err), "10000") << ours.err;
    EXPECT_NE(ours.out.find("| threads       | 2 (OMP_NUM_THREADS), spin 10000 then sleep"), std::string::npos)
        << ours.out;
    RunResult spin = run("env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=777 OMP_DISPLAY_ENV=verbose " + cmd, tmp);
    ASSERT_EQ(spin.exit_code, 0) << spin.err;
    EXPECT_EQ(last_spin(spin.err), "777") << spin.err;
    EXPECT_NE(spin.out.find("| threads       | 2 (OMP_NUM_THREADS), GOMP_SPINCOUNT 777 "), std::string::npos) << spin.out;
    RunResult passive = run("env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive env -u OMP_NUM_THREADS " + cmd, tmp);
    ASSERT_EQ(passive.exit_code, 0) << passive.err;
    EXPECT_NE(passive.out.find(" (every core, fewer while busy), OMP_WAIT_POLICY passive "), std::string::npos)
        << passive.out;
}
