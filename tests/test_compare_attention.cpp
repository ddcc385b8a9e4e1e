// tests/test_compare_attention.cpp — build/compare_attention end to end on a
// tiny configuration: the cross-evaluation diagonal equals what separate
// trainer runs print, knn with k >= T gives exact attention's column and row,
// a rerun skips finished work and resumes an interrupted training, --import
// merges the runs of other output folders, a
// checkpoint is evaluated under every setting, the attention meters run on every
// model (k = T gives error 0, and a rerun skips them), the plots are PNG files,
// bad input stops with one line (a copied tool without its plotting script before it
// trains), and every flag is documented.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "tests/trainer_test_util.h"

namespace {

using json = nlohmann::json;
using knngpt_test::exists;
using knngpt_test::program_path;
using knngpt_test::run_with_threads;
using knngpt_test::RunResult;
using knngpt_test::slurp;

const char* kBase = "--layers 1 --heads 2 --channels 16 -b 4 -t 16 -x 8 -v 4 -m 3 -s 0 -g 4 -l 3e-3";
const std::vector<std::string> kSettings = {"exact", "knn --attn-k 4", "knn --attn-k 16"};  // k = 16 = T: exact
const std::vector<std::string> kFlags = {"--attn exact", "--attn knn --attn-k 4", "--attn knn --attn-k 16"};

std::string tool() { return knngpt_test::build_dir() + "/compare_attention"; }
std::string meter() { return knngpt_test::build_dir() + "/attn_meter"; }

std::string quote(const std::string& s) { return "'" + s + "'"; }

// The tool's command line: the test's programs, one seed unless told, no plots unless told;
// `binary` names another copy of the tool (default: the built one).
std::string command(const std::string& text, const std::string& out, const std::vector<std::string>& settings,
                    const std::string& extra = "", const std::string& base = kBase, const std::string& binary = "") {
    std::string cmd = (binary.empty() ? tool() : binary) + " --trainer " + program_path("train_gpt_cpu") + " --prepare-data " +
                      program_path("prepare_data") + " --meter " + meter() + " --text " + text + " --out " + out;
    for (const auto& s : settings) cmd += " --setting " + quote(s);
    return cmd + " " + extra + " -- " + base;
}

json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

double eval_loss(const json& db, const std::string& trained, long seed, const std::string& evaluated) {
    for (const json& e : db["evals"])
        if (e["trained"] == trained && e["seed"] == seed && e["evaluated"] == evaluated) return e["val_loss"];
    ADD_FAILURE() << "no evaluation of '" << trained << "' seed " << seed << " under '" << evaluated << "'";
    return NAN;
}

const json* find_run(const json& db, const std::string& setting, long seed) {
    for (const json& r : db["runs"])
        if (r["setting"] == setting && r["seed"] == seed) return &r;
    return nullptr;
}

long mtime_ns(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return -1;
    return (long)st.st_mtim.tv_sec * 1000000000L + st.st_mtim.tv_nsec;
}

// A PNG file: the signature, an IHDR chunk first with a non-zero size, IEND last.
bool is_png(const std::string& bytes) {
    static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (bytes.size() < 8 + 25 + 12 || std::memcmp(bytes.data(), signature, 8) != 0) return false;
    if (bytes.compare(12, 4, "IHDR") != 0) return false;
    auto be32 = [&](size_t at) {
        return (uint32_t)(unsigned char)bytes[at] << 24 | (uint32_t)(unsigned char)bytes[at + 1] << 16 |
               (uint32_t)(unsigned char)bytes[at + 2] << 8 | (uint32_t)(unsigned char)bytes[at + 3];
    };
    return be32(16) > 0 && be32(20) > 0 && bytes.compare(bytes.size() - 8, 4, "IEND") == 0;
}

// One comparison (three settings, seed 1337) shared by the tests that only read it.
class CompareAttention : public ::testing::Test {
  protected:
    static knngpt_test::TempDir* tmp;
    static std::string text, out;
    static RunResult first;
    static json db;

    static void SetUpTestSuite() {
        if (!exists(tool()) || !exists(meter()) || !exists(program_path("train_gpt_cpu")) ||
            !exists(program_path("prepare_data")))
            return;
        tmp = new knngpt_test::TempDir;
        text = tmp->file("text.txt");
        out = tmp->file("out");
        std::ofstream(text) << knngpt_test::make_text(60000);
        first = run_with_threads(command(text, out, kSettings, "--plots 0"), 1, *tmp);
        if (first.exit_code == 0) db = read_json(out + "/results.json");
    }
    static void TearDownTestSuite() {
        delete tmp;
        tmp = nullptr;
    }
    void SetUp() override {
        if (!tmp)
            GTEST_SKIP() << tool() << ", " << meter() << ", " << program_path("train_gpt_cpu") << " or " << program_path("prepare_data")
                         << " not built (run `make test` from the repository root)";
        ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
    }
};
knngpt_test::TempDir* CompareAttention::tmp = nullptr;
std::string CompareAttention::text, CompareAttention::out;
RunResult CompareAttention::first;
json CompareAttention::db;

}  // namespace

// Every trained model evaluated under its own setting gives the val loss its
// training printed, and the val loss of a separate trainer run with the same
// flags (the base, the shards, --seed and --attn-seed, the setting).
TEST_F(CompareAttention, DiagonalEqualsWhatTheTrainerPrinted) {
    ASSERT_EQ(db["runs"].size(), 3u);
    ASSERT_EQ(db["evals"].size(), 9u);
    for (const auto& flags : kFlags) {
        const json* r = find_run(db, flags, 1337);
        ASSERT_TRUE(r) << flags;
        const double diagonal = eval_loss(db, flags, 1337, flags);
        EXPECT_EQ(diagonal, (*r)["val_loss"].get<double>()) << flags;
        EXPECT_EQ(diagonal, knngpt_test::final_val_loss(slurp(out + "/" + (*r)["dir"].get<std::string>() + "/train.log")));
        RunResult separate = run_with_threads(program_path("train_gpt_cpu") + " " + kBase + " -i " + out +
                                                  "/data/text_train.bin -j " + out +
                                                  "/data/text_val.bin --seed 1337 --attn-seed 1337 " + flags,
                                              1, *tmp);
        ASSERT_EQ(separate.exit_code, 0) << separate.err;
        EXPECT_EQ(diagonal, knngpt_test::final_val_loss(separate.out)) << flags << "\n" << separate.out;
        EXPECT_EQ((*r)["train_curve"]["step"].size(), 8u) << flags;
        EXPECT_EQ((*r)["val_curve"]["step"].size(), 3u) << flags;  // steps 0, 4, 8
    }
    // the evaluations ran under their own settings: k = 4 of 16 keys changes the loss
    EXPECT_NE(eval_loss(db, kFlags[0], 1337, kFlags[1]), eval_loss(db, kFlags[0], 1337, kFlags[0]));
    const json& matrix = db["summary"]["matrix"];
    ASSERT_EQ(matrix.size(), 3u);
    for (int i = 0; i < 3; i++)
        EXPECT_EQ(matrix[i][i]["val_loss"]["mean"].get<double>(), eval_loss(db, kFlags[i], 1337, kFlags[i]));
}

// knn with k >= T attends to every causal key: evaluated with it, every model
// scores as under exact attention, and a model trained with it scores as the
// exact-trained one, up to the order of fp32 sums.
TEST_F(CompareAttention, KAtLeastTGivesTheExactColumnAndRow) {
    for (const auto& trained : kFlags) {
        const double exact = eval_loss(db, trained, 1337, kFlags[0]);
        EXPECT_NEAR(eval_loss(db, trained, 1337, kFlags[2]), exact, 1e-5 * exact) << trained;
    }
    for (const auto& evaluated : kFlags) {
        const double exact_row = eval_loss(db, kFlags[0], 1337, evaluated);
        EXPECT_NEAR(eval_loss(db, kFlags[2], 1337, evaluated), exact_row, 2e-5 * exact_row) << evaluated;
    }
}

// Every trained model gets its meter (per layer and head, errors against k, mass, c),
// stored in results.json, meters.csv and results.md; k = T is exact attention.
TEST_F(CompareAttention, MetersEveryTrainedModel) {
    ASSERT_EQ(db["meters"].size(), 3u);
    for (const auto& flags : kFlags) {
        const json* m = nullptr;
        for (const json& x : db["meters"])
            if (x["trained"] == flags && x["seed"] == 1337) m = &x;
        ASSERT_TRUE(m) << flags;
        const json& r = (*m)["result"];
        EXPECT_EQ(r["T"], 16);
        EXPECT_EQ(r["k"].back(), 16);
        ASSERT_EQ(r["layers"].size(), 1u);
        ASSERT_EQ(r["layers"][0]["heads"].size(), 2u);
        for (const json& h : r["layers"][0]["heads"]) {
            EXPECT_EQ(h["error"]["knn"]["max"].back(), 0.0);
            EXPECT_EQ(h["topk_mass"]["min"].back(), 1.0);
            EXPECT_GT(h["error"]["knn"]["mean"][0].get<double>(), 0.0);
            EXPECT_TRUE(h["c_random_init"]["kernel"][0].is_number());
        }
        EXPECT_TRUE(exists(out + "/" + (*m)["json"].get<std::string>()));
    }
    const std::string md = slurp(out + "/results.md");
    EXPECT_NE(md.find("## Attention meters"), std::string::npos) << md;
    EXPECT_NE(md.find("| knn k=4 | 16 |"), std::string::npos) << md;
    const std::string csv = slurp(out + "/meters.csv");
    EXPECT_EQ(csv.substr(0, csv.find('\n')), "trained,seed,quantity,model,layer,head,T,mode,k,value");
    EXPECT_NE(csv.find("\nknn k=16,1337,error_max,trained,0,1,16,knn,16,0\n"), std::string::npos);
    EXPECT_NE(first.out.find("[meter 3/3] knn k=16, seed 1337 ... done"), std::string::npos) << first.out;
}

// Other --meter-flags redo the meters (only they), and --meters 0 runs none.
TEST_F(CompareAttention, MeterFlagsRedoTheMeters) {
    const std::string copy = tmp->file("meter_flags");
    ASSERT_EQ(std::system(("cp -r " + out + " " + copy).c_str()), 0);
    RunResult r = run_with_threads(command(text, copy, kSettings, "--plots 0 --meter-flags '--k 2,16 --windows 1'"), 1, *tmp);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("0 training(s) and 0 evaluation(s) run, 12 skipped"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("3 meter(s) run, 0 skipped"), std::string::npos) << r.out;
    const json after = read_json(copy + "/results.json");
    ASSERT_EQ(after["meters"].size(), 3u);
    EXPECT_EQ(after["meters"][0]["result"]["k"], json::array({2, 16}));
    RunResult none = run_with_threads(command(text, copy, kSettings, "--plots 0 --meters 0"), 1, *tmp);
    ASSERT_EQ(none.exit_code, 0) << none.err;
    EXPECT_EQ(none.out.find("meter(s) run"), std::string::npos) << none.out;
}

TEST_F(CompareAttention, WritesTheTablesOfEveryRunAndEvaluation) {
    const std::string md = slurp(out + "/results.md");
    EXPECT_NE(md.find("| trained with \\ evaluated with | exact | knn k=4 | knn k=16 |"), std::string::npos) << md;
    EXPECT_NE(md.find("| knn k=4 | `--attn knn --attn-k 4` | 1 |"), std::string::npos) << md;
    auto lines = [](const std::string& s) { return std::count(s.begin(), s.end(), '\n'); };
    EXPECT_EQ(lines(slurp(out + "/runs.csv")), 1 + 3);
    EXPECT_EQ(lines(slurp(out + "/results.csv")), 1 + 9);
    EXPECT_EQ(lines(slurp(out + "/matrix.csv")), 1 + 9);
    EXPECT_NE(first.out.find("[train 3/3] knn k=16, seed 1337"), std::string::npos) << first.out;
    EXPECT_NE(first.out.find("[eval 9/9] knn k=16, seed 1337, evaluated with knn k=16"), std::string::npos) << first.out;
    EXPECT_NE(first.out.find("| eta "), std::string::npos) << first.out;
}

// A rerun runs nothing and touches no log; a new seed adds only its own work;
// another base configuration is refused.
TEST_F(CompareAttention, RerunSkipsFinishedWork) {
    const std::string copy = tmp->file("rerun");
    ASSERT_EQ(std::system(("cp -r " + out + " " + copy).c_str()), 0);
    const std::string log = copy + "/" + (*find_run(db, kFlags[1], 1337))["dir"].get<std::string>() + "/train.log";
    const long before = mtime_ns(log);
    RunResult again = run_with_threads(command(text, copy, kSettings, "--plots 0"), 1, *tmp);
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_NE(again.out.find("0 training(s) and 0 evaluation(s) run, 12 skipped"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("0 meter(s) run, 3 skipped"), std::string::npos) << again.out;
    EXPECT_EQ(mtime_ns(log), before);
    EXPECT_EQ(read_json(copy + "/results.json")["evals"], db["evals"]);

    RunResult more = run_with_threads(command(text, copy, kSettings, "--plots 0 --seeds 1337,7"), 1, *tmp);
    ASSERT_EQ(more.exit_code, 0) << more.err;
    EXPECT_NE(more.out.find("3 training(s) and 9 evaluation(s) run, 12 skipped"), std::string::npos) << more.out;
    EXPECT_NE(more.out.find("3 meter(s) run, 3 skipped"), std::string::npos) << more.out;
    json both = read_json(copy + "/results.json");
    EXPECT_EQ(both["runs"].size(), 6u);
    EXPECT_EQ(both["summary"]["matrix"][0][0]["val_loss"]["n"], 2);
    EXPECT_NE(eval_loss(both, kFlags[0], 7, kFlags[0]), eval_loss(both, kFlags[0], 1337, kFlags[0]));

    RunResult other = run_with_threads(command(text, copy, kSettings, "--plots 0", std::string(kBase) + " -x 9"), 1, *tmp);
    EXPECT_EQ(other.exit_code, 1);
    EXPECT_NE(other.err.find("holds results of another configuration"), std::string::npos) << other.err;
}

// A training stopped after a checkpoint (-n) continues from it (-y 1) and ends
// where the uninterrupted one did.
TEST_F(CompareAttention, ResumesAnInterruptedTrainingFromItsCheckpoint) {
    const std::string dir = tmp->file("interrupted");
    const std::string base = std::string(kBase) + " -n 4";
    const std::string cmd = command(text, dir, {"knn --attn-k 4"}, "--plots 0", base);
    RunResult full = run_with_threads(cmd, 1, *tmp);
    ASSERT_EQ(full.exit_code, 0) << full.err;
    json whole = read_json(dir + "/results.json");
    const json run = whole["runs"][0];
    // as if stopped after step 4: no record, no final checkpoint
    json cut = whole;
    cut["runs"] = json::array();
    cut["evals"] = json::array();
    std::ofstream(dir + "/results.json") << cut.dump(1);
    for (const char* kind : {"model", "state"})
        ASSERT_EQ(std::remove((dir + "/" + run["dir"].get<std::string>() + "/" + kind + "_00000008.bin").c_str()), 0);
    RunResult resumed = run_with_threads(cmd, 1, *tmp);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("(resumed from its checkpoint)"), std::string::npos) << resumed.out;
    json after = read_json(dir + "/results.json");
    ASSERT_EQ(after["runs"].size(), 1u);
    EXPECT_EQ(after["runs"][0]["val_loss"], run["val_loss"]);
    EXPECT_EQ(after["runs"][0]["train_curve"], run["train_curve"]);  // steps 1-4 from the first part of the log
    EXPECT_EQ(after["evals"], whole["evals"]);
}

// --checkpoint: no training; the model file under every setting, as its own run's row.
TEST_F(CompareAttention, EvaluatesACheckpointUnderEverySetting) {
    const std::string dir = tmp->file("checkpoint");
    const std::string model = out + "/" + (*find_run(db, kFlags[0], 1337))["model"].get<std::string>();
    RunResult r = run_with_threads(command(text, dir, kSettings, "--plots 0 --checkpoint " + model), 1, *tmp);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("0 training(s) and 3 evaluation(s) run"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("1 meter(s) run, 0 skipped"), std::string::npos) << r.out;
    json c = read_json(dir + "/results.json");
    EXPECT_TRUE(c["runs"].empty());
    ASSERT_EQ(c["meters"].size(), 1u);
    EXPECT_EQ(c["meters"][0]["trained"], "checkpoint");
    // the checkpoint is the exact run's model, with the same seed: the same meter
    for (const json& m : db["meters"]) {
        if (m["trained"] == kFlags[0]) {
            EXPECT_EQ(c["meters"][0]["result"]["layers"], m["result"]["layers"]);
        }
    }
    for (const auto& flags : kFlags)
        EXPECT_EQ(eval_loss(c, "checkpoint", 1337, flags), eval_loss(db, kFlags[0], 1337, flags)) << flags;
    EXPECT_NE(slurp(dir + "/results.md").find("| checkpoint |"), std::string::npos);
}

// Settings trained in separate --out folders (side by side, or on other
// machines) come together with --import: no training is redone, only the
// missing cross-evaluations run, and every imported figure is the folder's.
TEST_F(CompareAttention, ImportTakesInTheRunsOfOtherFolders) {
    const std::string side = tmp->file("side"), merged = tmp->file("merged");
    RunResult alone = run_with_threads(command(text, side, {"knn --attn-k 8"}, "--plots 0"), 1, *tmp);
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    std::vector<std::string> all = kSettings;
    all.push_back("knn --attn-k 8");
    RunResult r = run_with_threads(command(text, merged, all, "--plots 0 --import " + out + " --import " + side), 1, *tmp);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("imported 3 run(s), 9 evaluation(s) and 3 meter(s) from " + out), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("imported 1 run(s), 1 evaluation(s) and 1 meter(s) from " + side), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("0 training(s) and 6 evaluation(s) run, 14 skipped"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("0 meter(s) run, 4 skipped"), std::string::npos) << r.out;
    json m = read_json(merged + "/results.json"), s = read_json(side + "/results.json");
    for (const auto& flags : kFlags)
        for (const auto& evaluated : kFlags)
            EXPECT_EQ(eval_loss(m, flags, 1337, evaluated), eval_loss(db, flags, 1337, evaluated)) << flags;
    const std::string knn8 = "--attn knn --attn-k 8";
    EXPECT_EQ(eval_loss(m, knn8, 1337, knn8), (*find_run(s, knn8, 1337))["val_loss"].get<double>());
    // the evaluations run here: the side model under k = T is its exact column
    const double exact8 = eval_loss(m, knn8, 1337, kFlags[0]);
    EXPECT_NEAR(eval_loss(m, knn8, 1337, kFlags[2]), exact8, 1e-5 * exact8);
    // the imported run folders came along, model files and logs included
    for (const json& run : m["runs"]) EXPECT_TRUE(exists(merged + "/" + run["model"].get<std::string>())) << run["dir"];
    EXPECT_TRUE(exists(merged + "/meters/knn_k=8_s1337.json"));

    RunResult again = run_with_threads(command(text, merged, all, "--plots 0 --import " + side), 1, *tmp);
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_NE(again.out.find("imported 0 run(s), 0 evaluation(s) and 0 meter(s)"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("0 training(s) and 0 evaluation(s) run, 20 skipped"), std::string::npos) << again.out;

    RunResult other = run_with_threads(
        command(text, tmp->file("other"), {"exact"}, "--plots 0 --import " + out, std::string(kBase) + " -x 9"), 1, *tmp);
    EXPECT_EQ(other.exit_code, 1);
    EXPECT_NE(other.err.find("--import " + out + " holds results of another configuration"), std::string::npos) << other.err;
    RunResult none = run_with_threads(command(text, tmp->file("none"), {"exact"}, "--import " + tmp->file("nowhere")), 1, *tmp);
    EXPECT_EQ(none.exit_code, 1);
    EXPECT_NE(none.err.find("no results.json in it"), std::string::npos) << none.err;
}

TEST_F(CompareAttention, PlotsArePngFiles) {
    if (std::system("/usr/bin/python3 -c 'import matplotlib' > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "/usr/bin/python3 has no matplotlib (bash tools/install_deps.sh installs python3-matplotlib)";
    const std::string copy = tmp->file("plots");
    ASSERT_EQ(std::system(("cp -r " + out + " " + copy).c_str()), 0);
    RunResult r = run_with_threads(command(text, copy, kSettings), 1, *tmp);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    for (const char* name : {"loss_curves.png", "gap_curves.png", "cross_eval.png", "meter_exact_s1337_error.png", "meter_exact_s1337_mass.png",
                             "meter_exact_s1337_c.png", "meter_exact_s1337_c_vs_T.png", "meter_knn_k=4_s1337_error.png",
                             "meter_knn_k=16_s1337_c_vs_T.png"})
        EXPECT_TRUE(is_png(slurp(copy + "/" + name))) << name << " is not a PNG file";
}

// Bad input: one line on stderr, exit status 1, no training started.
TEST_F(CompareAttention, BadInputGivesOneClearLine) {
    const std::string dir = tmp->file("bad");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {tool() + " --out " + dir, "no --setting given"},
        {command(text, dir, {"exact"}, "", std::string(kBase) + " -o x"), "trainer flag -o after --"},
        {command(text, dir, {"exact"}, "", std::string(kBase) + " --seed 3"), "trainer flag --seed after --"},
        {command(text, dir, {"exact"}, "--seeds 1,1"), "seed 1 is given twice"},
        {command(text, dir, {"exact", "--attn exact"}), "is given twice"},
        {command(text, dir, {"knn --attn-k 4", "--attn-k 4 --attn knn"}), "would share the name 'knn_k=4'"},
        {command(text, dir, {"exact"}, "--seeds 1,x"), "--seeds: expected an integer, got 'x'"},
        {command(text, dir, {"exact", "knn --attn-k"}), "expected flag-value pairs"},
        {command(text, dir, {"exact", "gumbel"}), "the trainer refuses it: train_gpt: error: --attn gumbel has no exact gradient"},
        {command(text, dir, {"exact"}, "--plots 2"), "--plots takes 0 or 1"},
        {command(text, dir, {"exact"}, "--meters 2"), "--meters takes 0 or 1"},
        {command(text, dir, {"exact"}, "--plot-script " + dir + "/none.py"), "cannot read it (give the path of tools/plot_compare.py, or --plots 0)"},
        {command(text, dir, {"exact"}, "--meter " + dir + "/none"), "not an executable (make build/attn_meter, or --meters 0)"},
        {command(text + ".missing", dir, {"exact"}), "cannot read it"},
        {tool() + " --bogus 1", "unknown flag '--bogus'"},
        {command(text, dir, {}, "--preset tiny"), "--preset: unknown preset 'tiny' (known: baby, long)"},
        {command(text, dir, {}, "--preset long", "-x -1"), "--preset long: give -x STEPS >= 1"},
        {command(text, dir, {}, "--plan 2"), "--plan takes 0 or 1"},
    };
    for (const auto& [cmd, expect] : cases) {
        RunResult r = run_with_threads(cmd, 1, *tmp);
        EXPECT_EQ(r.exit_code, 1) << cmd;
        EXPECT_NE(r.err.find(expect), std::string::npos) << cmd << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << cmd << ": " << r.err;
        EXPECT_FALSE(exists(dir + "/runs/exact_s1337/train.log")) << cmd;
    }
}

// A preset is its settings and trainer flags: flags after -- replace the preset's value of
// the same flag (the long preset's warm-ups follow -x) or are added, --setting adds a
// setting; --plan 1 prints what would run and runs nothing.
TEST_F(CompareAttention, APresetIsItsSettingsWithTheGivenFlagsInPlace) {
    const std::string dir = tmp->file("preset");
    RunResult r = run_with_threads(command(text, dir, {"knn --attn-k 2"}, "--preset long --plan 1", "-x 600 -b 2 -g 4"),
                                   1, *tmp);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("trainer flags: -t 1024 -b 2 --layers 4 --heads 4 --channels 128 -x 600 -l 1e-3 -u 100 "
                         "--shuffle 1 -v 300 -m 16 -s 0 -n 500 -g 4\n"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("meter flags: --windows 2\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("setting: --attn knn --attn-k 32 --attn-warmup 400 (knn k=32 warmup=400)\n"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("setting: --attn knn-tail --attn-k 32 --attn-tail 32 "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("setting: --attn knn --attn-k 32 --attn-window 32 --attn-sinks 4 --attn-warmup 60 "),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("setting: --attn knn --attn-k 2 (knn k=2)\n"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2 + 12 + 1) << r.out;
    EXPECT_FALSE(exists(dir + "/results.json"));
    RunResult baby = run_with_threads(command(text, dir, {}, "--preset baby --plan 1 --meter-flags '--windows 1'"), 1, *tmp);
    ASSERT_EQ(baby.exit_code, 0) << baby.err;
    EXPECT_NE(baby.out.find(" -t 16 "), std::string::npos) << "the test's base flags replace the preset's: " << baby.out;
    EXPECT_NE(baby.out.find("meter flags: --windows 1\n"), std::string::npos) << baby.out;
    EXPECT_NE(baby.out.find("setting: --attn gumbel --attn-k 8 --attn-grad sampled "), std::string::npos) << baby.out;
    EXPECT_EQ(std::count(baby.out.begin(), baby.out.end(), '\n'), 2 + 11) << baby.out;
}

// A copy of the tool run outside the repository finds no tools/plot_compare.py beside
// it: it stops before training, naming --plot-script, instead of failing at the end.
TEST_F(CompareAttention, ACopiedToolWithoutItsPlotScriptStopsBeforeTraining) {
    const std::string dir = tmp->file("copied");
    ASSERT_EQ(std::system(("mkdir -p " + dir + " && cp " + tool() + " " + dir + "/compare_attention").c_str()), 0);
    const std::string cmd = command(text, dir + "/out", {"exact"}, "", kBase, dir + "/compare_attention");
    RunResult r = run_with_threads(cmd, 1, *tmp);
    EXPECT_EQ(r.exit_code, 1) << cmd;
    EXPECT_NE(r.err.find("--plot-script "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("/tools/plot_compare.py: cannot read it"), std::string::npos) << r.err;
    EXPECT_FALSE(exists(dir + "/out/runs/exact_s1337/train.log"));
}

TEST_F(CompareAttention, EveryFlagIsInHelpAndReadme) {
    RunResult help = run_with_threads(tool() + " -h", 1, *tmp);
    ASSERT_EQ(help.exit_code, 0);
    std::string readme = slurp("tools/README.md");
    ASSERT_FALSE(readme.empty()) << "tools/README.md not found";
    size_t section = readme.find("## Comparing attention settings");
    ASSERT_NE(section, std::string::npos) << "tools/README.md has no section on compare_attention";
    readme = readme.substr(section, readme.find("\n## ", section + 1) - section);
    for (const char* flag : {"--setting", "--preset", "--plan", "--seeds", "--text", "--checkpoint", "--out", "--trainer",
                             "--prepare-data", "--plots", "--python", "--plot-script", "--meters", "--meter",
                             "--meter-flags", "--import", "-h"}) {
        std::regex documented(std::string("(^|[\\s`])") + flag + "[\\s`,]");
        EXPECT_TRUE(std::regex_search(help.out, documented)) << flag << " missing from -h";
        EXPECT_TRUE(std::regex_search(readme, documented)) << flag << " missing from tools/README.md's section";
    }
}
