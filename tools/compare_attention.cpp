// tools/compare_attention.cpp — validation loss and perplexity of attention
// settings against exact attention, as one command. It drives the trainer
// (train_gpt_cpu, or the CUDA train_gpt) through the trainer's own flags:
//
//   1. trains every setting from the same init and batch order: the base flags,
//      then --seed S --attn-seed S, then the setting's flags, once per seed S,
//      each run in OUT/runs/<setting>_s<S>/ (its log, main.log, final model);
//   2. evaluates every trained model under every setting (the trainer's
//      --eval-only 1 on the model file, same base flags and seed): the
//      cross-evaluation matrix, rows trained with X, columns evaluated with Y;
//      with --checkpoint FILE it trains nothing and evaluates FILE instead;
//   3. runs the attention meters (build/attn_meter) on every trained model, or
//      the checkpoint, once per seed: per layer and head, each approximate
//      mode's error against exact attention as a function of k, the top-k
//      mass, kmv's heavy keys, assumption A's c against T (trained and random
//      init); --meters 0 leaves them out;
//   4. writes OUT/results.json (every run, evaluation and meter, and the summary:
//      mean ± std over seeds, loss curves), runs.csv, results.csv, matrix.csv,
//      meters.csv, results.md, and the PNG plots of tools/plot_compare.py.
//
// A rerun with the same base flags skips every training, evaluation and meter that
// results.json already holds (new settings or seeds add only their own work),
// and resumes an interrupted training from its latest checkpoint (-n N); --import DIR
// takes in the results of another output directory of the same configuration first
// (settings trained side by side), so that only the missing work runs.
//
//   build/compare_attention --text FILE --setting exact --setting "knn --attn-k 16"
//       [--seeds 1337,1] [--out DIR] [--trainer PATH] -- [trainer flags]
//   build/compare_attention --preset baby|long --text FILE [--seeds ...] [-- flags that replace the preset's]
#include <fcntl.h>
#include <sys/stat.h>
#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/checkpoint_dir.h"
#include "train/duration.h"
#include "train/flag_values.h"

using namespace knngpt;
using json = nlohmann::ordered_json;

namespace {

const char* USAGE = R"(usage: compare_attention [options] -- [trainer flags]

Trains every attention setting from the same init and batch order, once per seed, then
evaluates every trained model under every setting (the cross-evaluation matrix); or, with
--checkpoint, evaluates one model file under every setting. The trainer flags after `--`
(the base configuration: shape, steps, schedule, -m, ...) go to every run.

  --preset NAME        a documented comparison: its settings, trainer flags and meter flags
                       (trainer flags after `--` replace the preset's value of the same flag;
                       --setting adds settings, --meter-flags replaces its meter flags):
                         baby  the quick start's baby config (T = 64, B 12, 2000 steps, the whole
                               validation split) under every attention mode
                         long  T = 1024 with the baby shape, B 4, 3000 steps: exact against knn
                               k = 8..64, knn-tail, the heavy index, sampled and stratified
                               gradients, knn after a dense warm-up of 2/3 of the steps (-x),
                               knn with a local window and sinks, and the window recipe (window
                               32, sinks 4, a dense warm-up of 1/10 of the steps)
  --plan 0|1           1: print the settings and trainer flags that would run, and stop
  --setting FLAGS      an attention setting: trainer flags separated by spaces, e.g.
                       "--attn knn --attn-k 16" or "--attn-grad sampled"; a first word without
                       a dash is the mode ("exact" = "--attn exact", "knn --attn-k 16");
                       repeat the flag for each setting (at least one, or a --preset)
  --seeds LIST         comma-separated seeds (default 1337); seed S gives every run of it
                       --seed S --attn-seed S (with --checkpoint: --attn-seed S); a setting's
                       own --attn-seed wins
  --text FILE          a text file: prepare_data turns it into byte-level shards in OUT/data,
                       which every run reads (else -i/-j among the trainer flags, or the
                       trainer's defaults)
  --checkpoint FILE    train nothing: evaluate this llm.c model file under every setting
  --out DIR            output directory (default build/compare)
  --trainer PATH       the trainer program (default train_gpt_cpu of the repository this
                       program was built in; the CUDA trainer: ./train_gpt)
  --prepare-data PATH  the data tool for --text (default the repository's prepare_data)
  --plots 0|1          write the PNG plots with tools/plot_compare.py (default 1; without
                       matplotlib they are skipped, saying so)
  --python PATH        the Python that runs the plots (default /usr/bin/python3)
  --plot-script PATH   the plotting script (default tools/plot_compare.py of the repository
                       this program was built in; give it when the binary was copied elsewhere)
  --meters 0|1         run the attention meters on every trained model (or the
                       checkpoint), once per seed (default 1): build/attn_meter on the
                       validation data (--text, else -j among the trainer flags) at the
                       trainer flags' -t, with --attn-seed S
  --meter PATH         the meter program (default build/attn_meter of the repository)
  --meter-flags FLAGS  more attn_meter flags, separated by spaces (e.g. "--windows 2
                       --k 1,4,16 --c-t 64,256"); a meter run with other flags is redone
  --import DIR         first take in the runs, evaluations and meters of another output
                       directory of the same configuration (settings trained side by side
                       in separate --out folders, or on other machines): its run folders
                       and meter files are copied into OUT; what OUT holds already wins;
                       repeat the flag for each folder
  -h, --help           this help

Trainer flags the tool sets itself, and so refuses after `--`: -o, -y, --eval-only, --seed,
--attn-seed; -e with --checkpoint; -i and -j with --text.
Outputs in OUT: results.json, runs.csv, results.csv, matrix.csv, results.md,
meters.csv, loss_curves.png, gap_curves.png (with exact among the settings: each setting's val
loss minus exact's, paired by seed), cross_eval.png, and per meter (setting, seed) meter_<name>_error.png,
_mass.png, _c.png, _c_vs_T.png; runs/<setting>_s<seed>/ holds each run's log and model, and
its meter.json, meter.csv and meter.log.
)";

[[noreturn]] void die(const std::string& msg) {
    fprintf(stderr, "compare_attention: error: %s\n", msg.c_str());
    exit(1);
}

// ----------------------------------------------------------------------------
// Settings: trainer flags, a label for tables and a directory name

std::vector<std::string> split_words(const std::string& s) {
    std::istringstream in(s);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    return words;
}

std::string join(const std::vector<std::string>& words) {
    std::string s;
    for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
    return s;
}

struct Setting {
    std::vector<std::string> args;  // the trainer flags
    std::string flags;              // the same, joined by single spaces: the setting's identity
    std::string label;              // e.g. "knn k=16 grad=sampled"
};

// "--attn knn --attn-k 16 --attn-grad sampled" -> "knn k=16 grad=sampled"
std::string setting_label(const std::vector<std::string>& args) {
    const std::map<std::string, std::string> short_names = {
        {"--attn-k", "k"},         {"--attn-tail", "m"},           {"--attn-index", "index"},
        {"--attn-grad", "grad"},   {"--attn-grad-samples", "s"},   {"--attn-grad-source", "source"},
        {"--attn-grad-dv", "dv"},  {"--attn-gumbel-groups", "groups"}, {"--attn-gumbel-samples", "samples"},
        {"--attn-kmv-threshold", "threshold"}, {"--attn-kmv-levels", "levels"}, {"--attn-kmv-alpha", "alpha"},
        {"--attn-seed", "attn-seed"}, {"--attn-warmup", "warmup"}};
    std::string mode = "exact", rest;
    for (size_t i = 0; i + 1 < args.size(); i += 2) {
        if (args[i] == "--attn") { mode = args[i + 1]; continue; }
        auto it = short_names.find(args[i]);
        std::string name = it != short_names.end() ? it->second : args[i].substr(args[i].find_first_not_of('-'));
        rest += " " + name + "=" + args[i + 1];
    }
    return mode + rest;
}

Setting parse_setting(const std::string& text) {
    Setting s;
    s.args = split_words(text);
    if (s.args.empty()) die("--setting: empty setting");
    if (s.args[0][0] != '-') s.args.insert(s.args.begin(), "--attn");
    if (s.args.size() % 2 != 0) die("--setting '" + text + "': expected flag-value pairs (e.g. --attn knn --attn-k 16)");
    for (size_t i = 0; i < s.args.size(); i += 2)
        if (s.args[i].rfind("-", 0) != 0) die("--setting '" + text + "': '" + s.args[i] + "' is not a flag");
    s.flags = join(s.args);
    s.label = setting_label(s.args);
    return s;
}

// A file name from a label: letters, digits and . = - kept, the rest '_'.
std::string file_name_of(const std::string& label) {
    std::string name = label;
    for (char& c : name)
        if (!isalnum((unsigned char)c) && c != '.' && c != '=' && c != '-') c = '_';
    return name;
}

// ----------------------------------------------------------------------------
// Options

struct Options {
    std::vector<Setting> settings;
    std::vector<long> seeds = {1337};
    std::string text, checkpoint, out_dir = "build/compare";
    std::string trainer, prepare_data, python = "/usr/bin/python3", plot_script, meter;
    int plots = 1, meters = 1;
    std::vector<std::string> meter_flags;  // --meter-flags, split
    std::vector<std::string> imports;      // --import DIR, in order
    std::vector<std::string> base;  // the trainer flags: the preset's, with those after -- in their place
    bool plan = false;              // --plan 1
};

// ----------------------------------------------------------------------------
// Presets: the comparisons the README and tools/README.md report, as one flag

struct Preset {
    std::vector<std::string> settings;     // --setting values
    std::vector<std::string> base;         // trainer flags
    std::vector<std::string> meter_flags;  // --meter-flags
};

// `steps`: the -x given after -- (0: none; the long preset's warm-ups are 2/3 and 1/10 of the steps)
Preset preset_named(const std::string& name, long steps) {
    if (steps == 0) steps = 3000;  // the presets' own -x: baby 2000 (no warm-up), long 3000
    if (steps < 0) die("--preset " + name + ": give -x STEPS >= 1 (the warm-up is a share of the steps)");
    if (name == "baby")  // nanoGPT's CPU baby config, as the quick start trains it
        return {{"exact", "knn --attn-k 4", "knn --attn-k 8", "knn --attn-k 16", "knn --attn-k 32",
                 "knn-tail --attn-k 8 --attn-tail 8",
                 "gumbel --attn-k 8 --attn-grad sampled", "kmv --attn-k 8 --attn-tail 8",
                 "kmv --attn-k 8 --attn-tail 8 --attn-kmv-threshold relative --attn-kmv-levels 4 --attn-kmv-alpha 1",
                 "exact --attn-grad sampled --attn-grad-samples 16",
                 "knn --attn-k 16 --attn-grad sampled --attn-grad-samples 16"},
                split_words("--layers 4 --heads 4 --channels 128 -t 64 -b 12 -x 2000 -l 1e-3 -k cosine -q 0.1 -u 100 "
                            "--beta2 0.99 -c 0.1 --grad-clip 1.0 --shuffle 1 -v 200 -m -1 -s 0 -g 64"),
                {}};
    if (name == "long")  // the long-context recipe
        return {{"exact", "knn --attn-k 8", "knn --attn-k 16", "knn --attn-k 32", "knn --attn-k 64",
                 "knn-tail --attn-k 32 --attn-tail 32", "knn --attn-k 32 --attn-index heavy",
                 "knn --attn-k 32 --attn-grad sampled", "knn --attn-k 32 --attn-warmup " + std::to_string(2 * steps / 3),
                 "knn --attn-k 32 --attn-grad stratified --attn-grad-samples 32",
                 "knn --attn-k 32 --attn-window 64 --attn-sinks 4",
                 "knn --attn-k 32 --attn-window 32 --attn-sinks 4 --attn-warmup " + std::to_string(steps / 10)},
                split_words("-t 1024 -b 4 --layers 4 --heads 4 --channels 128 -x 3000 -l 1e-3 -u 100 --shuffle 1 "
                            "-v 300 -m 16 -s 0 -n 500"),
                split_words("--windows 2")};
    die("--preset: unknown preset '" + name + "' (known: baby, long)");
}

// The repository this program was built in: the nearest directory above it
// that holds tools/plot_compare.py (the root, for build/compare_attention and
// build/sanitize/compare_attention).
std::string repository_root() {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return ".";
    std::string path(exe, (size_t)n);
    path = path.substr(0, path.rfind('/'));  // build/
    std::string dir = path;
    while (dir.rfind('/') != std::string::npos && dir.rfind('/') > 0) {
        dir = dir.substr(0, dir.rfind('/'));
        if (access((dir + "/tools/plot_compare.py").c_str(), F_OK) == 0) return dir;
    }
    return path.substr(0, path.rfind('/'));
}

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
    for (size_t i = 0; i < args.size(); i += 2)
        if (args[i] == flag) return true;
    return false;
}

// The value of the last `flag` among flag-value pairs, or "".
std::string flag_value(const std::vector<std::string>& args, const std::string& flag) {
    std::string value;
    for (size_t i = 0; i + 1 < args.size(); i += 2)
        if (args[i] == flag) value = args[i + 1];
    return value;
}

Options parse_args(int argc, char** argv) {
    Options o;
    const std::string root = repository_root();
    o.trainer = root + "/train_gpt_cpu";
    o.prepare_data = root + "/prepare_data";
    o.plot_script = root + "/tools/plot_compare.py";
    o.meter = root + "/build/attn_meter";
    std::vector<std::string> settings;
    std::string preset;
    bool meter_flags_given = false;
    int i = 1;
    for (; i < argc; i++) {
        std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            fputs(USAGE, stdout);
            exit(0);
        }
        if (flag == "--") { i++; break; }
        if (i + 1 >= argc) die(flag + ": missing value");
        const char* value = argv[++i];
        if (flag == "--setting") settings.push_back(value);
        else if (flag == "--preset") preset = value;
        else if (flag == "--plan") {
            std::string v = value;
            if (v != "0" && v != "1") die("--plan takes 0 or 1");
            o.plan = v == "1";
        } else if (flag == "--seeds") {
            o.seeds.clear();
            std::string list = value;
            for (size_t start = 0; start <= list.size();) {
                size_t comma = list.find(',', start);
                std::string seed = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
                try {
                    o.seeds.push_back(parse_flag_long("--seeds", seed.c_str()));
                } catch (const std::exception& e) {
                    die(e.what());
                }
                if (o.seeds.back() < 0) die("--seeds: a seed must be >= 0, got " + seed);
                if (comma == std::string::npos) break;
                start = comma + 1;
            }
        } else if (flag == "--text") o.text = value;
        else if (flag == "--checkpoint") o.checkpoint = value;
        else if (flag == "--out") o.out_dir = value;
        else if (flag == "--trainer") o.trainer = value;
        else if (flag == "--prepare-data") o.prepare_data = value;
        else if (flag == "--python") o.python = value;
        else if (flag == "--plot-script") o.plot_script = value;
        else if (flag == "--plots") {
            std::string v = value;
            if (v != "0" && v != "1") die("--plots takes 0 or 1");
            o.plots = v == "1";
        } else if (flag == "--meters") {
            std::string v = value;
            if (v != "0" && v != "1") die("--meters takes 0 or 1");
            o.meters = v == "1";
        } else if (flag == "--meter") o.meter = value;
        else if (flag == "--meter-flags") o.meter_flags = split_words(value), meter_flags_given = true;
        else if (flag == "--import") o.imports.push_back(value);
        else die("unknown flag '" + flag + "' (see -h; trainer flags go after --)");
    }
    for (; i < argc; i++) o.base.push_back(argv[i]);
    if (o.base.size() % 2 != 0)
        die("trainer flags after --: expected flag-value pairs, got '" + join(o.base) + "'");
    if (!preset.empty()) {
        // the preset's flags, each replaced by the value given after --, then the others given
        const std::vector<std::string> given = o.base;
        const std::string given_steps = flag_value(given, "-x");
        long steps = 0;
        try {
            if (!given_steps.empty()) steps = parse_flag_long("-x", given_steps.c_str());
        } catch (const std::exception& e) {
            die(e.what());
        }
        const Preset p = preset_named(preset, steps);
        o.base = p.base;
        for (size_t u = 0; u + 1 < given.size(); u += 2) {
            bool replaced = false;
            for (size_t v = 0; v + 1 < o.base.size(); v += 2)
                if (o.base[v] == given[u]) o.base[v + 1] = given[u + 1], replaced = true;
            if (!replaced) o.base.insert(o.base.end(), {given[u], given[u + 1]});
        }
        settings.insert(settings.begin(), p.settings.begin(), p.settings.end());
        if (!meter_flags_given) o.meter_flags = p.meter_flags;
    }

    if (settings.empty()) die("no --setting given (e.g. --setting exact --setting \"knn --attn-k 16\", or a --preset)");
    for (const auto& text : settings) {
        Setting s = parse_setting(text);
        for (const auto& other : o.settings) {
            if (other.flags == s.flags) die("--setting '" + text + "' is given twice");
            // run directories and logs are named after the label: two settings must not share one
            if (file_name_of(other.label) == file_name_of(s.label))
                die("--setting '" + text + "' and '" + other.flags + "' would share the name '" +
                    file_name_of(s.label) + "' (the same flags in another order?)");
        }
        o.settings.push_back(s);
    }
    for (size_t a = 0; a < o.seeds.size(); a++)
        for (size_t b = 0; b < a; b++)
            if (o.seeds[a] == o.seeds[b]) die("--seeds: seed " + std::to_string(o.seeds[a]) + " is given twice");
    std::vector<std::string> owned = {"-o", "-y", "--eval-only", "--seed", "--attn-seed"};
    if (!o.checkpoint.empty()) owned.push_back("-e");
    if (!o.text.empty()) owned.insert(owned.end(), {"-i", "-j"});
    for (const auto& flag : owned)
        if (has_flag(o.base, flag)) die("trainer flag " + flag + " after --: the tool sets it itself (see -h)");
    if (access(o.trainer.c_str(), X_OK) != 0) die("--trainer " + o.trainer + ": not an executable (make train_gpt_cpu?)");
    if (!o.text.empty() && access(o.text.c_str(), R_OK) != 0) die("--text " + o.text + ": cannot read it");
    if (!o.checkpoint.empty() && access(o.checkpoint.c_str(), R_OK) != 0)
        die("--checkpoint " + o.checkpoint + ": cannot read it");
    // checked before any training, so that a long run cannot end without its plots
    if (o.plots && access(o.plot_script.c_str(), R_OK) != 0)
        die("--plot-script " + o.plot_script + ": cannot read it (give the path of tools/plot_compare.py, or --plots 0)");
    if (o.meters && access(o.meter.c_str(), X_OK) != 0)
        die("--meter " + o.meter + ": not an executable (make build/attn_meter, or --meters 0)");
    for (const auto& dir : o.imports)
        if (access((dir + "/results.json").c_str(), R_OK) != 0)
            die("--import " + dir + ": no results.json in it (it takes an output directory of compare_attention)");
    if (o.meters && o.text.empty() && !has_flag(o.base, "-j"))
        die("--meters 1 needs the validation data: --text FILE, or -j among the trainer flags (or --meters 0)");
    return o;
}

// ----------------------------------------------------------------------------
// Running a program with its output in a log file

// Runs args[0] with args[1..], stdout and stderr to log (appended or
// truncated); returns its exit status (128 + signal when killed).
int run_program(const std::vector<std::string>& args, const std::string& log, bool append) {
    pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
        int fd = open(log.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
        if (fd < 0) _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        std::vector<char*> argv;
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        dprintf(2, "cannot run %s\n", argv[0]);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) die("waitpid failed");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

// The line of a failed run's log that says why: its last "error:" line, else its last line.
std::string failure_line(const std::string& log) {
    std::vector<std::string> lines = read_lines(log);
    for (auto it = lines.rbegin(); it != lines.rend(); ++it)
        if (it->find("error:") != std::string::npos) return *it;
    return lines.empty() ? "(no output)" : lines.back();
}

// The number after `key` in line, or NAN.
double number_after(const std::string& line, const std::string& key) {
    size_t at = line.find(key);
    if (at == std::string::npos) return NAN;
    return std::strtod(line.c_str() + at + key.size(), nullptr);
}

// ----------------------------------------------------------------------------
// What a run printed

struct TrainResult {
    std::map<int, double> train_curve, val_curve;  // step -> loss (a resumed log repeats steps: the last wins)
    double final_train_loss = NAN, val_loss = NAN, ms_per_step = NAN;
    int steps = -1;
    bool done = false;
};

// The step lines ("step n/N | loss X"), the validation lines under the run's own
// attention ("val loss X | perplexity P | step n", without "| attention"), and
// the summary line ("done: ...") of a training log.
TrainResult parse_train_log(const std::string& log) {
    TrainResult r;
    for (const std::string& line : read_lines(log)) {
        int step = 0, total = 0;
        double loss = 0, ppl = 0;
        if (sscanf(line.c_str(), "step %d/%d | loss %lf", &step, &total, &loss) == 3) {
            r.train_curve[step] = loss;
            r.steps = total;
        } else if (sscanf(line.c_str(), "val loss %lf | perplexity %lf | step %d", &loss, &ppl, &step) == 3 &&
                   line.find("| attention") == std::string::npos) {
            r.val_curve[step] = loss;
        } else if (line.rfind("done:", 0) == 0) {
            r.done = true;
            r.ms_per_step = number_after(line, "| mean ");
            r.final_train_loss = number_after(line, "final train loss ");
            r.val_loss = number_after(line, "| val loss ");
        }
    }
    return r;
}

struct EvalResult {
    double val_loss = NAN;
    int val_batches = 0;
    bool done = false;
};

// The summary line of --eval-only: "done: evaluation only in S s | N val batches | val loss X | ..."
EvalResult parse_eval_log(const std::string& log) {
    EvalResult r;
    for (const std::string& line : read_lines(log))
        if (line.rfind("done: evaluation only", 0) == 0) {
            r.done = true;
            r.val_batches = (int)number_after(line, "s | ");
            r.val_loss = number_after(line, "| val loss ");
        }
    return r;
}

// ----------------------------------------------------------------------------
// results.json: what was run (the base configuration), every run and evaluation, and the summary

json curve_json(const std::map<int, double>& curve) {
    json steps = json::array(), losses = json::array();
    for (const auto& [step, loss] : curve) steps.push_back(step), losses.push_back(loss);
    return json{{"step", steps}, {"loss", losses}};
}

std::string trainer_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// What results of another configuration would differ in: refused on a rerun.
json configuration_json(const Options& o) {
    return json{{"trainer", trainer_name(o.trainer)}, {"base_flags", o.base}, {"text", o.text},
                {"checkpoint", o.checkpoint}};
}

void write_file_atomically(const std::string& path, const std::string& content) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp);
        out << content;
        if (!out) die(tmp + ": cannot write");
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) die(path + ": cannot rename " + tmp + " into place");
}

// A JSON file, or one line naming it and what to do (`advice`, e.g. "; remove it to start again").
json read_json_file(const std::string& path, const std::string& advice = "") {
    std::ifstream in(path);
    try {
        return json::parse(in);
    } catch (const std::exception& e) {
        die(path + ": not valid JSON (" + e.what() + ")" + advice);
    }
}

// Whether stored results are of this run's configuration (compared as unordered objects:
// a file edited by hand may list the keys in another order).
bool of_this_configuration(const json& results, const Options& o) {
    return results.contains("configuration") &&
           nlohmann::json::parse(results["configuration"].dump()) == nlohmann::json::parse(configuration_json(o).dump());
}

json* find_run(json& db, const std::string& setting, long seed) {
    for (json& r : db["runs"])
        if (r["setting"] == setting && r["seed"] == seed) return &r;
    return nullptr;
}

json* find_meter(json& db, const std::string& trained, long seed) {
    for (json& m : db["meters"])
        if (m["trained"] == trained && m["seed"] == seed) return &m;
    return nullptr;
}

json* find_eval(json& db, const std::string& trained, long seed, const std::string& evaluated) {
    for (json& e : db["evals"])
        if (e["trained"] == trained && e["seed"] == seed && e["evaluated"] == evaluated) return &e;
    return nullptr;
}

struct Stats {
    int n = 0;
    double mean = NAN, std = NAN;  // std: the sample standard deviation (n - 1), NAN below two values
};

Stats stats_of(const std::vector<double>& x) {
    Stats s;
    s.n = (int)x.size();
    if (s.n == 0) return s;
    double sum = 0;
    for (double v : x) sum += v;
    s.mean = sum / s.n;
    if (s.n < 2) return s;
    double sq = 0;
    for (double v : x) sq += (v - s.mean) * (v - s.mean);
    s.std = std::sqrt(sq / (s.n - 1));
    return s;
}

json stats_json(const Stats& s) {
    return json{{"n", s.n}, {"mean", std::isfinite(s.mean) ? json(s.mean) : json()},
                {"std", std::isfinite(s.std) ? json(s.std) : json()}};
}

// "1.8809 ± 0.0040", or "1.8809" from one seed, or "-" from none.
std::string mean_pm_std(const Stats& s, int decimals = 4) {
    if (s.n == 0) return "-";
    char buf[64];
    if (s.n < 2) snprintf(buf, sizeof(buf), "%.*f", decimals, s.mean);
    else snprintf(buf, sizeof(buf), "%.*f ± %.*f", decimals, s.mean, decimals, s.std);
    return buf;
}

// The rows of the matrix: each trained setting, or the one checkpoint.
struct Row {
    std::string key, label;
};

std::vector<Row> matrix_rows(const Options& o) {
    if (!o.checkpoint.empty()) return {{"checkpoint", "checkpoint"}};
    std::vector<Row> rows;
    for (const auto& s : o.settings) rows.push_back({s.flags, s.label});
    return rows;
}

// The mean and std over seeds of a curve, at the steps every seed has; train
// losses first averaged over windows of `window` steps (the window's last step names it).
json curve_summary(const std::vector<std::map<int, double>>& curves, int window) {
    std::map<int, std::vector<double>> at;
    for (const auto& curve : curves) {
        std::map<int, std::pair<double, int>> binned;
        for (const auto& [step, loss] : curve) {
            int bin = ((step - 1) / window + 1) * window;
            binned[bin].first += loss, binned[bin].second++;
        }
        for (const auto& [bin, sum] : binned) at[bin].push_back(sum.first / sum.second);
    }
    json steps = json::array(), mean = json::array(), std = json::array();
    for (const auto& [step, values] : at) {
        if (values.size() != curves.size()) continue;
        Stats s = stats_of(values);
        steps.push_back(step), mean.push_back(s.mean), std.push_back(std::isfinite(s.std) ? s.std : 0.0);
    }
    return json{{"step", steps}, {"mean", mean}, {"std", std}};
}

void push_finite(std::vector<double>& x, double v) {
    if (std::isfinite(v)) x.push_back(v);
}

// The meters' means over every layer and head (attn_meter's all_heads) at k = n^(1/8),
// n^(1/4), n^(1/2), and c at the largest T, per row: mean and std over the seeds.
json meters_summary(const Options& o, json& db) {
    json rows = json::array();
    for (const auto& r : matrix_rows(o)) {
        std::vector<const json*> found;
        for (long seed : o.seeds)
            if (json* m = find_meter(db, r.key, seed)) found.push_back(&(*m)["result"]);
        if (found.empty()) continue;
        const json& first = *found[0];
        json row{{"flags", r.key}, {"label", r.label}, {"T", first["T"]}, {"k_roots", first["k_roots"]}};
        auto at_k = [](const json& m, const json& values, int k) {
            for (size_t i = 0; i < m["k"].size(); i++)
                if (m["k"][i].get<int>() == k && !values[i].is_null()) return values[i].get<double>();
            return (double)NAN;
        };
        json errors = json::object(), mass = json::object();
        for (const auto& [root, k] : first["k_roots"].items()) {
            for (const auto& [mode, values] : first["all_heads"]["error_mean"].items()) {
                std::vector<double> x;
                for (const json* m : found)
                    if (m->contains("all_heads") && (*m)["all_heads"]["error_mean"].contains(mode))
                        push_finite(x, at_k(*m, (*m)["all_heads"]["error_mean"][mode], k.get<int>()));
                errors[mode][root] = stats_json(stats_of(x));
            }
            std::vector<double> x;
            for (const json* m : found) push_finite(x, at_k(*m, (*m)["all_heads"]["topk_mass_mean"], k.get<int>()));
            mass[root] = stats_json(stats_of(x));
        }
        row["error_mean"] = errors;
        row["topk_mass_mean"] = mass;
        row["c_T"] = first["c_T"].back();
        for (const char* key : {"c_kernel", "c_kernel_random_init"}) {
            std::vector<double> x;
            for (const json* m : found)
                if ((*m)["all_heads"].contains(key) && !(*m)["all_heads"][key].back().is_null())
                    x.push_back((*m)["all_heads"][key].back().get<double>());
            row[key] = stats_json(stats_of(x));
        }
        rows.push_back(row);
    }
    return rows;
}

json summary_json(const Options& o, json& db) {
    json s;
    const std::vector<Row> rows = matrix_rows(o);
    json columns = json::array();
    for (const auto& c : o.settings) columns.push_back(json{{"flags", c.flags}, {"label", c.label}});
    s["seeds"] = o.seeds;
    s["rows"] = json::array();
    for (const auto& r : rows) s["rows"].push_back(json{{"flags", r.key}, {"label", r.label}});
    s["columns"] = columns;
    // the cross-evaluation matrix: mean ± std over seeds, val loss and perplexity
    s["matrix"] = json::array();
    for (const auto& r : rows) {
        json line = json::array();
        for (const auto& c : o.settings) {
            std::vector<double> loss, ppl;
            for (long seed : o.seeds)
                if (json* e = find_eval(db, r.key, seed, c.flags)) {
                    loss.push_back((*e)["val_loss"].get<double>());
                    ppl.push_back(std::exp(loss.back()));
                }
            line.push_back(json{{"val_loss", stats_json(stats_of(loss))}, {"perplexity", stats_json(stats_of(ppl))}});
        }
        s["matrix"].push_back(line);
    }
    s["meters"] = meters_summary(o, db);
    if (!o.checkpoint.empty()) return s;
    // training: each setting's runs, and the paired difference to the exact setting's run of the same seed
    bool exact = false;
    for (const auto& c : o.settings) exact = exact || c.flags == "--attn exact";
    s["training"] = json::array();
    for (const auto& c : o.settings) {
        std::vector<double> train, val, ppl, ms, delta;
        std::vector<std::map<int, double>> train_curves, val_curves;
        int steps = 1;
        for (long seed : o.seeds) {
            json* r = find_run(db, c.flags, seed);
            if (!r) continue;
            train.push_back((*r)["final_train_loss"].get<double>());
            val.push_back((*r)["val_loss"].get<double>());
            ppl.push_back(std::exp(val.back()));
            ms.push_back((*r)["ms_per_step"].get<double>());
            steps = std::max(steps, (*r)["steps"].get<int>());
            std::map<int, double> tc, vc;
            const json& t = (*r)["train_curve"];
            for (size_t i = 0; i < t["step"].size(); i++) tc[t["step"][i].get<int>()] = t["loss"][i].get<double>();
            const json& v = (*r)["val_curve"];
            for (size_t i = 0; i < v["step"].size(); i++) vc[v["step"][i].get<int>()] = v["loss"][i].get<double>();
            train_curves.push_back(tc), val_curves.push_back(vc);
            if (exact)
                if (json* e = find_run(db, "--attn exact", seed)) delta.push_back(val.back() - (*e)["val_loss"].get<double>());
        }
        const int window = std::max(1, (steps + 199) / 200);  // at most ~200 points a curve
        json t{{"flags", c.flags}, {"label", c.label}, {"final_train_loss", stats_json(stats_of(train))},
               {"val_loss", stats_json(stats_of(val))}, {"perplexity", stats_json(stats_of(ppl))},
               {"ms_per_step", stats_json(stats_of(ms))}};
        if (exact) t["val_loss_minus_exact"] = stats_json(stats_of(delta));
        t["train_curve"] = curve_summary(train_curves, window);
        t["train_curve"]["window"] = window;
        t["val_curve"] = curve_summary(val_curves, 1);
        s["training"].push_back(t);
    }
    return s;
}

Stats stats_from_json(const json& j) {
    Stats s;
    s.n = j["n"].get<int>();
    s.mean = j["mean"].is_null() ? NAN : j["mean"].get<double>();
    s.std = j["std"].is_null() ? NAN : j["std"].get<double>();
    return s;
}

std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

std::string number(double x, int decimals = 6) {
    if (!std::isfinite(x)) return "";
    char buf[64];
    snprintf(buf, sizeof(buf), "%.*f", decimals, x);
    return buf;
}

std::string label_of(const Options& o, const std::string& flags) {
    if (flags == "checkpoint") return flags;
    for (const auto& s : o.settings)
        if (s.flags == flags) return s.label;
    return setting_label(split_words(flags));
}

// runs.csv, results.csv, matrix.csv and results.md, from results.json's records and summary.
void write_tables(const Options& o, json& db) {
    const json& s = db["summary"];
    std::string runs = "setting,flags,seed,steps,final_train_loss,val_loss,perplexity,ms_per_step\n";
    for (const json& r : db["runs"])
        runs += csv_field(label_of(o, r["setting"])) + "," + csv_field(r["setting"]) + "," +
                std::to_string(r["seed"].get<long>()) + "," + std::to_string(r["steps"].get<int>()) + "," +
                number(r["final_train_loss"]) + "," + number(r["val_loss"]) + "," + number(std::exp(r["val_loss"].get<double>()), 4) +
                "," + number(r["ms_per_step"], 1) + "\n";
    write_file_atomically(o.out_dir + "/runs.csv", runs);
    std::string results = "trained,trained_flags,seed,evaluated,evaluated_flags,val_loss,perplexity,val_batches\n";
    for (const json& e : db["evals"])
        results += csv_field(label_of(o, e["trained"])) + "," + csv_field(e["trained"]) + "," +
                   std::to_string(e["seed"].get<long>()) + "," + csv_field(label_of(o, e["evaluated"])) + "," +
                   csv_field(e["evaluated"]) + "," + number(e["val_loss"]) + "," +
                   number(std::exp(e["val_loss"].get<double>()), 4) + "," + std::to_string(e["val_batches"].get<int>()) + "\n";
    write_file_atomically(o.out_dir + "/results.csv", results);

    std::string matrix = "trained,evaluated,seeds,val_loss_mean,val_loss_std,perplexity_mean,perplexity_std\n";
    std::string md = "# compare_attention\n\nTrainer `" + trainer_name(o.trainer) + "`, base flags `" + join(o.base) +
                     "`" + (o.text.empty() ? "" : ", text `" + o.text + "`") +
                     (o.checkpoint.empty() ? "" : ", checkpoint `" + o.checkpoint + "`") + ", seeds " +
                     s["seeds"].dump() + ". Every figure is the mean ± the sample standard deviation over the seeds " +
                     "(the mean alone from one seed).\n\n";
    if (s.contains("training")) {
        const bool with_delta = !s["training"].empty() && s["training"][0].contains("val_loss_minus_exact");
        md += "## Training\n\nEach setting trained from the same init and batch order; its validation loss "
              "under its own attention at the end.\n\n| setting | flags | seeds | final train loss | val loss | "
              "perplexity |" + std::string(with_delta ? " val loss − exact (paired) |" : "") + " ms/step |\n|---|---|---|---|---|---|" +
              (with_delta ? "---|" : "") + "---|\n";
        for (const json& t : s["training"]) {
            md += "| " + t["label"].get<std::string>() + " | `" + t["flags"].get<std::string>() + "` | " +
                  std::to_string(t["val_loss"]["n"].get<int>()) + " | " + mean_pm_std(stats_from_json(t["final_train_loss"])) +
                  " | " + mean_pm_std(stats_from_json(t["val_loss"])) + " | " + mean_pm_std(stats_from_json(t["perplexity"]), 3) +
                  " | " + (with_delta ? mean_pm_std(stats_from_json(t["val_loss_minus_exact"])) + " | " : "") +
                  mean_pm_std(stats_from_json(t["ms_per_step"]), 1) + " |\n";
        }
        md += "\n";
    }
    std::string loss_table, ppl_table, header = "| trained with \\ evaluated with |", rule = "|---|";
    for (const json& c : s["columns"]) header += " " + c["label"].get<std::string>() + " |", rule += "---|";
    for (size_t i = 0; i < s["rows"].size(); i++) {
        const std::string row = s["rows"][i]["label"];
        loss_table += "| " + row + " |", ppl_table += "| " + row + " |";
        for (size_t j = 0; j < s["columns"].size(); j++) {
            const json& cell = s["matrix"][i][j];
            Stats loss = stats_from_json(cell["val_loss"]), ppl = stats_from_json(cell["perplexity"]);
            loss_table += " " + mean_pm_std(loss) + " |", ppl_table += " " + mean_pm_std(ppl, 3) + " |";
            matrix += csv_field(row) + "," + csv_field(s["columns"][j]["label"]) + "," + std::to_string(loss.n) + "," +
                      number(loss.mean) + "," + number(loss.std) + "," + number(ppl.mean, 4) + "," + number(ppl.std, 4) + "\n";
        }
        loss_table += "\n", ppl_table += "\n";
    }
    write_file_atomically(o.out_dir + "/matrix.csv", matrix);
    md += "## Cross-evaluation: validation loss\n\n" + header + "\n" + rule + "\n" + loss_table +
          "\n## Cross-evaluation: perplexity\n\n" + header + "\n" + rule + "\n" + ppl_table;

    // the meters: every meter's CSV, its rows prefixed by the model and seed, and a table
    std::string meters = "trained,seed,quantity,model,layer,head,T,mode,k,value\n";
    for (const json& m : db["meters"]) {
        const std::vector<std::string> lines = read_lines(o.out_dir + "/" + m["csv"].get<std::string>());
        for (size_t i = 1; i < lines.size(); i++)
            meters += csv_field(m["label"]) + "," + std::to_string(m["seed"].get<long>()) + "," + lines[i] + "\n";
    }
    write_file_atomically(o.out_dir + "/meters.csv", meters);
    if (!s["meters"].empty()) {
        const json& first = s["meters"][0];
        std::string head = "| model | T |", line = "|---|---|";
        std::vector<std::pair<std::string, std::string>> error_columns;  // (mode, root)
        for (const auto& [mode, roots] : first["error_mean"].items())  // knn at every root, the others at n^(1/2)
            for (const auto& [root, value] : roots.items()) {
                if (mode != "knn" && root != "n^(1/2)") continue;
                error_columns.push_back({mode, root});
                head += " " + mode + " error, k = " + root + " |", line += "---|";
            }
        for (const auto& [root, k] : first["k_roots"].items())
            head += " top-k mass, k = " + root + " (" + std::to_string(k.get<int>()) + ") |", line += "---|";
        head += " c, T = " + std::to_string(first["c_T"].get<int>()) + " | c, random init |";
        line += "---|---|";
        md += "\n## Attention meters\n\nbuild/attn_meter on each model (`--meter-flags` `" + join(o.meter_flags) +
              "`), on validation windows, q, k, v from its forward under exact attention: the relative l2 error "
              "|o − o_exact| / |o_exact| of each mode, the softmax mass of the top-k set, and assumption A's c "
              "(the kernel matrix's mass outside its T largest entries over the mass inside them), each the mean over "
              "rows, then over every layer and head; mean ± std over seeds. Per layer and head: meters.csv, "
              "the meter_*.png plots; the other modes at every k in meters.csv.\n\n" + head + "\n" + line + "\n";
        for (const json& r : s["meters"]) {
            md += "| " + r["label"].get<std::string>() + " | " + std::to_string(r["T"].get<int>()) + " |";
            for (const auto& [mode, root] : error_columns)
                md += " " + (r["error_mean"].contains(mode) ? mean_pm_std(stats_from_json(r["error_mean"][mode][root]))
                                                             : std::string("-")) + " |";
            for (const auto& [root, k] : first["k_roots"].items())
                md += " " + mean_pm_std(stats_from_json(r["topk_mass_mean"][root])) + " |";
            md += " " + mean_pm_std(stats_from_json(r["c_kernel"]), 3) + " | " +
                  mean_pm_std(stats_from_json(r["c_kernel_random_init"]), 3) + " |\n";
        }
    }
    write_file_atomically(o.out_dir + "/results.md", md);
}

void save(const Options& o, json& db) {
    db["summary"] = summary_json(o, db);
    write_file_atomically(o.out_dir + "/results.json", db.dump(1) + "\n");
    write_tables(o, db);
}

// ----------------------------------------------------------------------------
// Progress: job i of N and the time left, from the mean time of the jobs run so far

struct Progress {
    int train_left = 0, eval_left = 0;
    double train_s = 0, eval_s = 0;
    int trains_run = 0, evals_run = 0;
    // "3m10s", or "3m10s + 12 evaluations" while no evaluation has been timed
    std::string eta() const {
        double left = 0;
        std::string untimed;
        if (train_left > 0 && trains_run) left += train_s / trains_run * train_left;
        else if (train_left > 0) untimed += " + " + std::to_string(train_left) + " trainings";
        if (eval_left > 0 && evals_run) left += eval_s / evals_run * eval_left;
        else if (eval_left > 0) untimed += " + " + std::to_string(eval_left) + " evaluations";
        return format_duration(left) + untimed;
    }
};

// mkdir -p
void make_dirs(const std::string& path) {
    for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
        mkdir(path.substr(0, at).c_str(), 0755);
    mkdir(path.c_str(), 0755);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A file or directory tree copied, as hard links where the file system allows.
void copy_into(const std::string& from, const std::string& to) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::create_hard_links, ec);
    if (ec) {
        ec.clear();
        fs::remove_all(to, ec);
        fs::copy(from, to, fs::copy_options::recursive, ec);
    }
    if (ec) die("--import: cannot copy " + from + " to " + to + " (" + ec.message() + ")");
}

// --import DIR: the results of another output directory of the same configuration, taken
// into db, with the files they name copied into OUT. A run OUT already holds (same
// setting and seed) keeps its own evaluations and meter: only the evaluations and meters
// of the runs imported here come along, so that every figure of a row is of one model.
// With --checkpoint (no runs) an evaluation or meter OUT lacks is taken in.
void import_results(const Options& o, json& db, const std::string& from) {
    const json other = read_json_file(from + "/results.json", " (--import " + from + ")");
    if (!of_this_configuration(other, o))
        die("--import " + from + " holds results of another configuration (" +
            other.value("configuration", json()).dump() + ")");
    std::vector<std::pair<std::string, long>> taken;  // (trained, seed) of the runs imported
    auto importable = [&](const json& record) {
        const std::pair<std::string, long> key{record["trained"].get<std::string>(), record["seed"].get<long>()};
        return !o.checkpoint.empty() || std::find(taken.begin(), taken.end(), key) != taken.end();
    };
    int runs = 0, evals = 0, meters = 0;
    for (const json& run : other.value("runs", json::array())) {
        if (find_run(db, run["setting"], run["seed"])) continue;
        const std::string rel = run["dir"], to = o.out_dir + "/" + rel;
        if (file_exists(to))
            die("--import " + from + ": " + to + " exists, but " + o.out_dir +
                "/results.json has no such run (an interrupted training?): remove it to import " + from + "/" + rel);
        copy_into(from + "/" + rel, to);
        db["runs"].push_back(run);
        taken.push_back({run["setting"].get<std::string>(), run["seed"].get<long>()});
        runs++;
    }
    for (const json& e : other.value("evals", json::array()))
        if (importable(e) && !find_eval(db, e["trained"], e["seed"], e["evaluated"])) db["evals"].push_back(e), evals++;
    for (const json& m : other.value("meters", json::array())) {
        if (!importable(m) || find_meter(db, m["trained"], m["seed"])) continue;
        make_dirs(o.out_dir + "/meters");
        const std::string stem = "meters/" + m["name"].get<std::string>();  // as the meter runs name their files
        for (const char* ext : {".json", ".csv", ".log"})
            if (file_exists(from + "/" + stem + ext)) copy_into(from + "/" + stem + ext, o.out_dir + "/" + stem + ext);
        db["meters"].push_back(m);
        meters++;
    }
    save(o, db);
    printf("compare_attention: imported %d run(s), %d evaluation(s) and %d meter(s) from %s\n", runs, evals, meters,
           from.c_str());
    fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    Options o = parse_args(argc, argv);
    if (o.plan) {
        printf("trainer flags: %s\n", join(o.base).c_str());
        if (!o.meter_flags.empty()) printf("meter flags: %s\n", join(o.meter_flags).c_str());
        for (const Setting& s : o.settings) printf("setting: %s (%s)\n", s.flags.c_str(), s.label.c_str());
        return 0;
    }
    make_dirs(o.out_dir + "/runs");
    if (!file_exists(o.out_dir + "/runs")) die("--out " + o.out_dir + ": cannot create it");

    // the stored results, if they are of this configuration
    json db;
    const std::string results_path = o.out_dir + "/results.json";
    if (file_exists(results_path)) {
        db = read_json_file(results_path, "; remove it to start again");
        if (!of_this_configuration(db, o))
            die(results_path + " holds results of another configuration (" + db.value("configuration", json()).dump() +
                "): use another --out, or remove it");
    } else {
        db = json{{"tool", "compare_attention"}, {"configuration", configuration_json(o)},
                  {"runs", json::array()}, {"evals", json::array()}, {"meters", json::array()}};
    }
    if (!db.contains("meters")) db["meters"] = json::array();  // results of a version without meters
    for (const auto& dir : o.imports) import_results(o, db, dir);

    // the data
    std::vector<std::string> data;
    if (!o.text.empty()) {
        const std::string dir = o.out_dir + "/data", log = o.out_dir + "/prepare_data.log";
        mkdir(dir.c_str(), 0755);
        if (access(o.prepare_data.c_str(), X_OK) != 0) die("--prepare-data " + o.prepare_data + ": not an executable");
        if (run_program({o.prepare_data, "--input", o.text, "--out-dir", dir, "--name", "text"}, log, false) != 0)
            die("prepare_data failed on " + o.text + ": " + failure_line(log));
        data = {"-i", dir + "/text_train.bin", "-j", dir + "/text_val.bin"};
    }
    auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
    };
    std::vector<std::string> common = with(with({o.trainer}, o.base), data);

    // the work: trainings (none with --checkpoint), then every model under every setting
    const bool training = o.checkpoint.empty();
    const std::vector<Row> rows = matrix_rows(o);
    Progress p;
    int skipped = 0;
    if (training)
        for (long seed : o.seeds)
            for (const auto& s : o.settings) p.train_left += find_run(db, s.flags, seed) == nullptr;
    for (const auto& r : rows)
        for (long seed : o.seeds)
            for (const auto& c : o.settings) p.eval_left += find_eval(db, r.key, seed, c.flags) == nullptr;
    const int trains_total = training ? (int)(o.seeds.size() * o.settings.size()) : 0;
    const int evals_total = (int)(rows.size() * o.seeds.size() * o.settings.size());
    skipped = trains_total - p.train_left + evals_total - p.eval_left;
    printf("compare_attention: %d setting(s) x %zu seed(s): %d training(s) and %d evaluation(s) to run, %d already in %s\n",
           (int)o.settings.size(), o.seeds.size(), p.train_left, p.eval_left, skipped, results_path.c_str());
    fflush(stdout);

    // every setting with work left, checked by the trainer before anything runs (its flags, the
    // build's kernels, the data): an evaluation of zero batches, so that a typo in the last
    // setting does not stop the comparison hours in
    for (const auto& c : o.settings) {
        bool needed = false;
        for (long seed : o.seeds) {
            needed = needed || (training && !find_run(db, c.flags, seed));
            for (const auto& r : rows) needed = needed || !find_eval(db, r.key, seed, c.flags);
        }
        if (!needed) continue;
        std::vector<std::string> args = with(with(common, c.args), {"--eval-only", "1", "-m", "0"});
        if (!training) args = with(args, {"-e", o.checkpoint});
        const std::string log = o.out_dir + "/check.log";
        if (run_program(args, log, false) != 0)
            die("setting '" + c.flags + "': the trainer refuses it: " + failure_line(log));
    }

    auto run_dir_of = [&](const Setting& s, long seed) {
        return "runs/" + file_name_of(s.label) + "_s" + std::to_string(seed);
    };
    int job = 0;
    for (long seed : o.seeds) {
        if (!training) break;
        for (const auto& s : o.settings) {
            job++;
            if (find_run(db, s.flags, seed)) continue;
            const std::string rel = run_dir_of(s, seed), dir = o.out_dir + "/" + rel, log = dir + "/train.log";
            mkdir(dir.c_str(), 0755);
            const bool resume = latest_checkpoint(dir) >= 0;  // an interrupted run that wrote checkpoints (-n)
            printf("[train %d/%d] %s, seed %ld%s ... ", job, trains_total, s.label.c_str(), seed,
                   resume ? " (resumed from its checkpoint)" : "");
            fflush(stdout);
            std::vector<std::string> args =
                with(with(common, {"--seed", std::to_string(seed), "--attn-seed", std::to_string(seed)}), s.args);
            args = with(args, {"-o", dir});
            if (resume) args = with(args, {"-y", "1"});
            auto t0 = std::chrono::steady_clock::now();
            int status = run_program(args, log, resume);
            if (status != 0)
                die("training '" + s.label + "' seed " + std::to_string(seed) + " failed (exit " + std::to_string(status) +
                    "): " + failure_line(log) + " (log: " + log + ")");
            TrainResult r = parse_train_log(log);
            const int step = latest_checkpoint(dir);
            if (!r.done || step < 0) die("training '" + s.label + "' ended without its summary line or model (log: " + log + ")");
            const double seconds = seconds_since(t0);
            p.train_s += seconds, p.trains_run++, p.train_left--;
            db["runs"].push_back(json{{"setting", s.flags}, {"label", s.label}, {"seed", seed}, {"dir", rel},
                                      {"model", checkpoint_path(rel, "model", step)},
                                      {"steps", r.steps}, {"final_train_loss", r.final_train_loss},
                                      {"val_loss", r.val_loss}, {"ms_per_step", r.ms_per_step}, {"wall_s", seconds},
                                      {"train_curve", curve_json(r.train_curve)}, {"val_curve", curve_json(r.val_curve)}});
            save(o, db);
            printf("val loss %.6f (perplexity %.4f), %s | eta %s\n", r.val_loss, std::exp(r.val_loss),
                   format_duration(seconds).c_str(), p.eta().c_str());
            fflush(stdout);
        }
    }

    job = 0;
    for (const auto& r : rows) {
        for (long seed : o.seeds) {
            std::string model = o.checkpoint, dir = o.out_dir;
            if (training) {
                json* run = find_run(db, r.key, seed);
                dir = o.out_dir + "/" + (*run)["dir"].get<std::string>();
                model = o.out_dir + "/" + (*run)["model"].get<std::string>();
            }
            for (const auto& c : o.settings) {
                job++;
                if (find_eval(db, r.key, seed, c.flags)) continue;
                if (!file_exists(model))
                    die("model " + model + " of '" + r.label + "' seed " + std::to_string(seed) +
                        " is gone: remove its run from " + results_path + " to train it again");
                const std::string log = dir + "/eval_" + file_name_of(c.label) + (training ? "" : "_s" + std::to_string(seed)) + ".log";
                printf("[eval %d/%d] %s, seed %ld, evaluated with %s ... ", job, evals_total, r.label.c_str(), seed,
                       c.label.c_str());
                fflush(stdout);
                std::vector<std::string> seeds = {"--attn-seed", std::to_string(seed)};
                if (training) seeds = with({"--seed", std::to_string(seed)}, seeds);
                std::vector<std::string> args = with(with(with(common, seeds), c.args), {"-e", model, "--eval-only", "1"});
                auto t0 = std::chrono::steady_clock::now();
                int status = run_program(args, log, false);
                if (status != 0)
                    die("evaluating '" + r.label + "' seed " + std::to_string(seed) + " with '" + c.label + "' failed (exit " +
                        std::to_string(status) + "): " + failure_line(log) + " (log: " + log + ")");
                EvalResult e = parse_eval_log(log);
                if (!e.done) die("evaluation ended without its summary line (log: " + log + ")");
                const double seconds = seconds_since(t0);
                p.eval_s += seconds, p.evals_run++, p.eval_left--;
                db["evals"].push_back(json{{"trained", r.key}, {"seed", seed}, {"evaluated", c.flags},
                                           {"val_loss", e.val_loss}, {"val_batches", e.val_batches}});
                save(o, db);
                printf("val loss %.6f, %s | eta %s\n", e.val_loss, format_duration(seconds).c_str(), p.eta().c_str());
                fflush(stdout);
            }
        }
    }
    // the attention meters of every model (the checkpoint: once per seed, the draws' key)
    int meters_run = 0, meters_skipped = 0, meters_total = 0;
    double meter_s = 0;
    const std::string meter_flags = join(o.meter_flags);
    if (o.meters) {
        make_dirs(o.out_dir + "/meters");
        std::vector<std::string> data_flags = o.text.empty() ? std::vector<std::string>{"-j", flag_value(o.base, "-j")}
                                                             : std::vector<std::string>{"--text", o.text};
        if (!flag_value(o.base, "-t").empty()) data_flags = with(data_flags, {"-t", flag_value(o.base, "-t")});
        int left = 0;
        for (const auto& r : rows)
            for (long seed : o.seeds) {
                const json* m = find_meter(db, r.key, seed);
                left += !m || (*m)["flags"] != meter_flags;
            }
        meters_total = (int)(rows.size() * o.seeds.size());
        meters_skipped = meters_total - left;
        job = 0;
        for (const auto& r : rows) {
            for (long seed : o.seeds) {
                job++;
                json* done = find_meter(db, r.key, seed);
                if (done && (*done)["flags"] == meter_flags) continue;
                std::string model = o.checkpoint;
                if (training) model = o.out_dir + "/" + (*find_run(db, r.key, seed))["model"].get<std::string>();
                if (!file_exists(model))
                    die("model " + model + " of '" + r.label + "' seed " + std::to_string(seed) + " is gone");
                const std::string name = file_name_of(r.label) + "_s" + std::to_string(seed);
                const std::string rel = "meters/" + name, log = o.out_dir + "/" + rel + ".log";
                printf("[meter %d/%d] %s, seed %ld ... ", job, meters_total, r.label.c_str(), seed);
                fflush(stdout);
                std::vector<std::string> args = with(with({o.meter, "-e", model}, data_flags),
                                                     {"--attn-seed", std::to_string(seed), "--json",
                                                      o.out_dir + "/" + rel + ".json", "--csv", o.out_dir + "/" + rel + ".csv"});
                args = with(args, o.meter_flags);
                auto t0 = std::chrono::steady_clock::now();
                const int status = run_program(args, log, false);
                if (status != 0)
                    die("the meter of '" + r.label + "' seed " + std::to_string(seed) + " failed (exit " +
                        std::to_string(status) + "): " + failure_line(log) + " (log: " + log + ")");
                const json result = read_json_file(o.out_dir + "/" + rel + ".json");
                const double seconds = seconds_since(t0);
                meter_s += seconds, meters_run++, left--;
                json record{{"trained", r.key}, {"label", r.label}, {"seed", seed}, {"flags", meter_flags},
                            {"name", name}, {"json", rel + ".json"}, {"csv", rel + ".csv"}, {"result", result}};
                if (done) *done = record;
                else db["meters"].push_back(record);
                save(o, db);
                printf("done, %s | eta %s\n", format_duration(seconds).c_str(),
                       format_duration(meter_s / meters_run * left).c_str());
                fflush(stdout);
            }
        }
    }
    save(o, db);  // the summary of the settings and seeds asked for, also when nothing ran

    if (o.plots) {
        const std::string log = o.out_dir + "/plot.log";
        if (run_program({o.python, "-c", "import matplotlib"}, log, false) != 0)
            printf("compare_attention: plots skipped: %s has no matplotlib (bash tools/install_deps.sh installs "
                   "python3-matplotlib)\n", o.python.c_str());
        else if (run_program({o.python, o.plot_script, results_path, o.out_dir}, log, false) != 0)
            die("plotting failed: " + failure_line(log) + " (log: " + log + ")");
        else
            printf("compare_attention: plots %s%s/cross_eval.png%s\n",
                   training ? (o.out_dir + "/loss_curves.png, ").c_str() : "", o.out_dir.c_str(),
                   db["meters"].empty() ? "" : (", " + o.out_dir + "/meter_*.png").c_str());
    }
    if (o.meters) printf("compare_attention: %d meter(s) run, %d skipped\n", meters_run, meters_skipped);
    printf("compare_attention: %d training(s) and %d evaluation(s) run, %d skipped; results in %s/results.md\n",
           p.trains_run, p.evals_run, skipped, o.out_dir.c_str());
    return 0;
}
