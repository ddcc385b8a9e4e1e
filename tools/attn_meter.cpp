// tools/attn_meter.cpp — per layer and head, how far the approximate attention
// modes are from exact attention on a model's own q, k, v, the softmax mass of the
// top-k set, kmv's heavy keys, and assumption A's constant c of [P2] against T on
// the model and on a random init of its config (tools/attention_meters.h;
// ALGORITHMS.md §2.2, §7.7).
//
//   build/attn_meter -e MODEL_FILE (--text FILE | -j VAL_TOKENS) [--json FILE] [--csv FILE] [options]
//
// The q, k, v of every layer come from the model's forward under exact attention
// (tools/qkv_capture.h) on --windows validation windows of T tokens. Writes JSON
// and a tidy CSV (one number a line), each to FILE.tmp first and then renamed;
// progress on stderr; bad input stops with one line and exit status 1.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/dataloader.h"
#include "tools/attention_meters.h"
#include "model/checkpoint.h"
#include "tools/qkv_capture.h"
#include "train/flag_values.h"

using namespace knngpt;
using json = nlohmann::ordered_json;

namespace {

const char* USAGE = R"(usage: attn_meter -e MODEL_FILE (--text FILE | -j VAL_TOKENS) [options]

Per layer and head, on validation windows, with q, k, v from the model's forward under
exact attention: the relative l2 error |o - o_exact| / |o_exact| of each approximate
attention mode (mean and max over rows) against k; the softmax mass of the top-k set
(mean, min) and §2.2's bound on knn's error; kmv's heavy-key fraction and mass; and
assumption A's constant c (the kernel matrix's mass outside its n = T largest entries
over the mass inside them, causal) for several T, on the model and on a random init.

  -e FILE              the model (llm.c model file)
  --text FILE          validation text, byte-level (a token per byte), from the start
                       of the file's last tenth, windows one after the other
  -j FILE              validation tokens instead: an llm.c token shard (or glob)
  -t T                 the window length of the error meters (default the model's max T)
  --windows N          validation windows (default 4)
  --k LIST             comma-separated k values, each 1..T (default: the powers of 2
                       below T, T itself, and n^(1/8), n^(1/4), n^(1/2) rounded, n = T)
  --modes LIST         approximate modes among knn, knn-tail, gumbel, kmv
                       (default all four; knn is always measured)
  --attn-tail M        tail samples of knn-tail and light samples of kmv (default 8)
  --attn-gumbel-groups R, --attn-gumbel-samples S
                       gumbel's median of means, R groups of S samples (default 3, 8)
  --attn-kmv-threshold absolute|relative
                       kmv's heavy test in its forward (default absolute)
  --kmv-alpha A        kmv's heavy threshold exponent (default 0.3333)
  --attn-kmv-levels N  kmv's LSH bucket widths w .. 2^(N-1) w, as the trainer's flag (default 1)
  --attn-seed S        key of the sampled modes' draws (default 0)
  --c-t LIST           the T values of the c meter (default 64, 128, 256, ... below the
                       model's max T, and max T)
  --random-init 0|1    also measure c on a random init of the model's config (default 1)
  --init-seed S        the random init's seed (default 1337)
  --json FILE          the JSON output (default attn_meter.json)
  --csv FILE           the CSV output (default the JSON's name with .csv)
  -h, --help           this help

CSV columns: quantity,model,layer,head,T,mode,k,value (model: trained or random_init).
)";

[[noreturn]] void die(const std::string& msg) {
    fprintf(stderr, "attn_meter: error: %s\n", msg.c_str());
    exit(1);
}

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, ',');) out.push_back(item);
    return out;
}

std::vector<int> int_list(const std::string& flag, const std::string& s) {
    std::vector<int> out;
    for (const std::string& item : split_list(s)) out.push_back((int)parse_flag_long(flag, item.c_str()));
    if (out.empty()) die(flag + ": empty list");
    return out;
}

AttnMode mode_of(const std::string& name) {
    for (AttnMode m : {AttnMode::Knn, AttnMode::KnnTail, AttnMode::Gumbel, AttnMode::Kmv})
        if (name == attn_mode_name(m)) return m;
    die("--modes: unknown mode '" + name + "' (knn, knn-tail, gumbel, kmv)");
}

struct Options {
    std::string model, text, val, json_path = "attn_meter.json", csv_path;
    int T = 0, windows = 4, random_init = 1;
    long init_seed = 1337;
    std::vector<int> ks, c_ts;
    MeterSpec spec;
};

Options parse_args(int argc, char** argv) {
    Options o;
    o.spec.modes = {AttnMode::Knn, AttnMode::KnnTail, AttnMode::Gumbel, AttnMode::Kmv};
    std::string modes;
    for (int a = 1; a < argc; a++) {
        const std::string flag = argv[a];
        if (flag == "-h" || flag == "--help") {
            fputs(USAGE, stdout);
            exit(0);
        }
        if (a + 1 >= argc) die(flag + ": missing value (see -h)");
        const char* v = argv[++a];
        try {
            if (flag == "-e") o.model = v;
            else if (flag == "--text") o.text = v;
            else if (flag == "-j") o.val = v;
            else if (flag == "-t") o.T = (int)parse_flag_long(flag, v);
            else if (flag == "--windows") o.windows = (int)parse_flag_long(flag, v);
            else if (flag == "--k") o.ks = int_list(flag, v);
            else if (flag == "--modes") modes = v;
            else if (flag == "--attn-tail") o.spec.tail = (int)parse_flag_long(flag, v);
            else if (flag == "--attn-gumbel-groups") o.spec.gumbel_groups = (int)parse_flag_long(flag, v);
            else if (flag == "--attn-gumbel-samples") o.spec.gumbel_samples = (int)parse_flag_long(flag, v);
            else if (flag == "--attn-kmv-threshold") {
                const std::string t = v;
                if (t != "absolute" && t != "relative") die("--attn-kmv-threshold takes absolute or relative");
                o.spec.kmv_threshold = t == "absolute" ? KmvThreshold::Absolute : KmvThreshold::Relative;
            } else if (flag == "--kmv-alpha") o.spec.kmv_alpha = parse_flag_float(flag, v);
            else if (flag == "--attn-kmv-levels") o.spec.kmv_levels = (int)parse_flag_long(flag, v);
            else if (flag == "--attn-seed") o.spec.seed = (uint64_t)parse_flag_long(flag, v);
            else if (flag == "--c-t") o.c_ts = int_list(flag, v);
            else if (flag == "--random-init") {
                const std::string t = v;
                if (t != "0" && t != "1") die("--random-init takes 0 or 1");
                o.random_init = t == "1";
            } else if (flag == "--init-seed") o.init_seed = parse_flag_long(flag, v);
            else if (flag == "--json") o.json_path = v;
            else if (flag == "--csv") o.csv_path = v;
            else die("unknown flag '" + flag + "' (see -h)");
        } catch (const std::runtime_error& e) {
            die(e.what());
        }
    }
    if (o.model.empty()) die("no -e MODEL_FILE given (see -h)");
    if (o.text.empty() == o.val.empty()) die("give exactly one of --text FILE and -j VAL_TOKENS");
    if (o.windows < 1) die("--windows must be >= 1");
    if (o.spec.tail < 1) die("--attn-tail must be >= 1");
    if (o.spec.gumbel_groups < 1 || o.spec.gumbel_samples < 1) die("--attn-gumbel-groups and -samples must be >= 1");
    if (!kmv_alpha_ok(o.spec.kmv_alpha)) die("--kmv-alpha must be in (0, 4]");
    if (!kmv_width_levels_ok(o.spec.kmv_levels)) die("--attn-kmv-levels must be in 1..8");
    if (!modes.empty()) {
        o.spec.modes = {AttnMode::Knn};
        for (const std::string& name : split_list(modes)) {
            const AttnMode m = mode_of(name);
            bool seen = false;
            for (AttnMode x : o.spec.modes) seen = seen || x == m;
            if (!seen) o.spec.modes.push_back(m);
        }
    }
    if (o.csv_path.empty()) {
        o.csv_path = o.json_path;
        const size_t dot = o.csv_path.rfind('.'), slash = o.csv_path.rfind('/');
        if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) o.csv_path.resize(dot);
        o.csv_path += ".csv";
    }
    return o;
}

// W windows of T tokens, row after row: the text's last tenth byte-level, or the shard's first batches.
std::vector<int> validation_tokens(const Options& o, int T, int vocab_size) {
    if (!o.text.empty()) {
        std::vector<int> tokens = text_window_tokens(o.text, -1, o.windows * T);
        for (int t : tokens)
            if (t >= vocab_size)
                die(o.text + ": byte " + std::to_string(t) + " is not below the model's vocab size " +
                    std::to_string(vocab_size) + " (give -j with the model's own tokens)");
        return tokens;
    }
    DataLoader loader(o.val, o.windows, T, 0, 1, false, 1, vocab_size);
    std::vector<int> inputs((size_t)o.windows * T), targets(inputs.size());
    loader.next_batch(inputs.data(), targets.data());
    return inputs;
}

// k = n^p rounded, at least 1
int k_root(int n, double p) { return std::max(1, (int)std::lround(std::pow((double)n, p))); }

void write_atomically(const std::string& path, const std::string& content) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp);
        out << content;
        if (!out) die(tmp + ": cannot write");
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) die(path + ": cannot rename " + tmp + " into place");
}

json number_or_null(double x) { return std::isfinite(x) ? json(x) : json(); }

std::string csv_number(double x) {
    if (!std::isfinite(x)) return "";
    char buf[64];
    snprintf(buf, sizeof(buf), "%.9g", x);
    return buf;
}

}  // namespace

int main(int argc, char** argv) {
    Options o = parse_args(argc, argv);
    try {
        const ModelFile file = read_model_file(o.model);
        const GPTConfig& cfg = file.config;
        const int L = cfg.num_layers, NH = cfg.num_heads, C = cfg.channels, maxT = cfg.max_seq_len;
        if (o.T == 0) o.T = maxT;
        if (o.T < 2 || o.T > maxT) die("-t " + std::to_string(o.T) + ": must be 2.." + std::to_string(maxT) + " (the model's max T)");
        const int T = o.T;
        const std::vector<std::pair<std::string, int>> roots = {
            {"n^(1/8)", k_root(T, 1.0 / 8)}, {"n^(1/4)", k_root(T, 1.0 / 4)}, {"n^(1/2)", k_root(T, 1.0 / 2)}};
        if (o.ks.empty()) {
            for (int k = 1; k < T; k *= 2) o.ks.push_back(k);
            o.ks.push_back(T);
            for (const auto& r : roots) o.ks.push_back(r.second);
        }
        std::sort(o.ks.begin(), o.ks.end());
        o.ks.erase(std::unique(o.ks.begin(), o.ks.end()), o.ks.end());
        if (o.ks.front() < 1 || o.ks.back() > T) die("--k: every k must be 1.." + std::to_string(T) + " (T)");
        if (o.c_ts.empty()) {
            for (int t = 64; t < maxT; t *= 2) o.c_ts.push_back(t);
            o.c_ts.push_back(maxT);
        }
        std::sort(o.c_ts.begin(), o.c_ts.end());
        o.c_ts.erase(std::unique(o.c_ts.begin(), o.c_ts.end()), o.c_ts.end());
        if (o.c_ts.front() < 1 || o.c_ts.back() > maxT) die("--c-t: every T must be 1.." + std::to_string(maxT) + " (the model's max T)");
        o.spec.ks = o.ks;

        // the error meters, window by window, layer by layer
        const std::vector<int> tokens = validation_tokens(o, T, cfg.vocab_size);
        fprintf(stderr, "attn_meter: %s, %d layers x %d heads, %d windows of T = %d, %zu values of k\n", o.model.c_str(), L,
                NH, o.windows, T, o.ks.size());
        const std::vector<CapturedLayer> layers = gpt_capture_layers(cfg, file.params, tokens, o.windows);
        std::vector<std::vector<HeadMeter>> meters;
        for (int l = 0; l < L; l++) {
            meters.push_back(new_head_meters(NH, o.spec));
            for (int w = 0; w < o.windows; w++) {
                fprintf(stderr, "attn_meter: errors, layer %d/%d, window %d/%d\n", l + 1, L, w + 1, o.windows);
                meter_attention_layer(meters[l], layers[l].qkv.data() + (size_t)w * T * 3 * C, T, C, NH, l, w, o.spec);
            }
        }

        // c against T, on the model and on a random init of its config
        std::vector<std::pair<std::string, std::vector<float>>> models = {{"trained", file.params}};
        if (o.random_init) models.push_back({"random_init", gpt_random_init(cfg, (uint64_t)o.init_seed)});
        // c[model][t][layer][head]
        std::vector<std::vector<std::vector<std::vector<ops::AssumptionA>>>> c(models.size());
        for (size_t mi = 0; mi < models.size(); mi++) {
            for (int t : o.c_ts) {
                fprintf(stderr, "attn_meter: c, %s model, T = %d\n", models[mi].first.c_str(), t);
                const std::vector<CapturedLayer> at_t =
                    gpt_capture_layers(cfg, models[mi].second, validation_tokens(o, t, cfg.vocab_size), o.windows);
                std::vector<std::vector<ops::AssumptionA>> per_layer;
                for (int l = 0; l < L; l++) per_layer.push_back(assumption_a_of_layer(at_t[l].qkv.data(), o.windows, t, C, NH));
                c[mi].push_back(per_layer);
            }
        }

        // JSON and CSV
        std::vector<std::string> mode_names;
        for (AttnMode m : o.spec.modes) mode_names.push_back(attn_mode_name(m));
        json root = {{"tool", "attn_meter"},
                     {"model", o.model},
                     {"config", {{"layers", L}, {"heads", NH}, {"channels", C}, {"max_T", maxT}, {"vocab", cfg.vocab_size}}},
                     {"data", o.text.empty() ? json{{"shard", o.val}} : json{{"text", o.text}}},
                     {"T", T},
                     {"windows", o.windows},
                     {"k", o.ks},
                     {"modes", mode_names},
                     {"tail", o.spec.tail},
                     {"gumbel", {{"groups", o.spec.gumbel_groups}, {"samples", o.spec.gumbel_samples}}},
                     {"kmv", {{"alpha", o.spec.kmv_alpha}, {"levels", o.spec.kmv_levels},
                              {"threshold", o.spec.kmv_threshold == KmvThreshold::Absolute ? "absolute" : "relative"}}},
                     {"attn_seed", o.spec.seed},
                     {"c_T", o.c_ts},
                     {"init_seed", o.init_seed}};
        json k_roots = json::object();
        for (const auto& r : roots) k_roots[r.first] = r.second;
        root["k_roots"] = k_roots;
        root["bound"] = "topk_bound: ALGORITHMS.md §2.2, |O_i - knn_i| <= 2 rho_i max_{j<=i} |v_j|, divided by |O_i|, "
                        "rho_i = 1 - topk mass; computed per row from the measured rho_i (no unknown constant)";
        std::string csv = "quantity,model,layer,head,T,mode,k,value\n";
        auto csv_line = [&](const std::string& q, const std::string& model, int l, int h, int t, const std::string& mode,
                            int k, double v) {
            csv += q + "," + model + "," + std::to_string(l) + "," + std::to_string(h) + "," + std::to_string(t) + "," +
                   mode + "," + (k > 0 ? std::to_string(k) : "") + "," + csv_number(v) + "\n";
        };
        json jl = json::array();
        for (int l = 0; l < L; l++) {
            json heads = json::array();
            for (int h = 0; h < NH; h++) {
                const HeadMeter& m = meters[l][h];
                json errors = json::object();
                for (size_t mi = 0; mi < o.spec.modes.size(); mi++) {
                    json mean = json::array(), max = json::array();
                    for (size_t ki = 0; ki < o.ks.size(); ki++) {
                        const RowStats& s = m.error[mi][ki];
                        mean.push_back(number_or_null(s.mean())), max.push_back(number_or_null(s.max));
                        csv_line("error_mean", "trained", l, h, T, mode_names[mi], o.ks[ki], s.mean());
                        csv_line("error_max", "trained", l, h, T, mode_names[mi], o.ks[ki], s.max);
                    }
                    errors[mode_names[mi]] = {{"mean", mean}, {"max", max}};
                }
                json mass_mean = json::array(), mass_min = json::array(), bound_mean = json::array(), bound_max = json::array();
                json kmv = {{"rows", json::array()},
                            {"absolute", {{"heavy_keys", json::array()}, {"heavy_fraction", json::array()},
                                          {"heavy_mass", json::array()}, {"list_heavy_keys", json::array()},
                                          {"list_heavy_mass", json::array()}}},
                            {"relative", {{"heavy_keys", json::array()}, {"heavy_fraction", json::array()},
                                          {"heavy_mass", json::array()}, {"list_heavy_keys", json::array()},
                                          {"list_heavy_mass", json::array()}}}};
                const bool with_kmv = std::find(o.spec.modes.begin(), o.spec.modes.end(), AttnMode::Kmv) != o.spec.modes.end();
                for (size_t ki = 0; ki < o.ks.size(); ki++) {
                    const int k = o.ks[ki];
                    mass_mean.push_back(number_or_null(m.mass[ki].mean())), mass_min.push_back(number_or_null(m.mass[ki].min));
                    bound_mean.push_back(number_or_null(m.bound[ki].mean())), bound_max.push_back(number_or_null(m.bound[ki].max));
                    csv_line("topk_mass_mean", "trained", l, h, T, "knn", k, m.mass[ki].mean());
                    csv_line("topk_mass_min", "trained", l, h, T, "knn", k, m.mass[ki].min);
                    csv_line("topk_bound_mean", "trained", l, h, T, "knn", k, m.bound[ki].mean());
                    if (!with_kmv) continue;
                    const ops::KmvHeavyTally& t = m.kmv[ki];
                    const double r = t.rows > 0 ? t.rows : NAN;
                    kmv["rows"].push_back(t.rows);
                    const double values[2][5] = {
                        {t.heavy_abs / r, t.fraction_abs / r, t.mass_abs / r, t.list_heavy_abs / r, t.list_mass_abs / r},
                        {t.heavy_rel / r, t.fraction_rel / r, t.mass_rel / r, t.list_heavy_rel / r, t.list_mass_rel / r}};
                    const char* names[5] = {"heavy_keys", "heavy_fraction", "heavy_mass", "list_heavy_keys", "list_heavy_mass"};
                    for (int th = 0; th < 2; th++)
                        for (int q = 0; q < 5; q++) {
                            const char* thr = th == 0 ? "absolute" : "relative";
                            kmv[thr][names[q]].push_back(number_or_null(values[th][q]));
                            csv_line(std::string("kmv_") + thr + "_" + names[q], "trained", l, h, T, "kmv", k, values[th][q]);
                        }
                }
                json head = {{"head", h},
                             {"error", errors},
                             {"topk_mass", {{"mean", mass_mean}, {"min", mass_min}}},
                             {"topk_bound", {{"mean", bound_mean}, {"max", bound_max}}},
                             {"zero_rows", m.zero_rows}};
                if (with_kmv) head["kmv"] = kmv;
                for (size_t mi = 0; mi < models.size(); mi++) {
                    json kernel = json::array(), raw = json::array(), causal = json::array();
                    for (size_t ti = 0; ti < o.c_ts.size(); ti++) {
                        const ops::AssumptionA& a = c[mi][ti][l][h];
                        kernel.push_back(number_or_null(a.c_kernel)), raw.push_back(number_or_null(a.c_raw));
                        causal.push_back(number_or_null(a.c_causal_radius));
                        csv_line("c_kernel", models[mi].first, l, h, o.c_ts[ti], "", 0, a.c_kernel);
                        csv_line("c_kernel_causal_radius", models[mi].first, l, h, o.c_ts[ti], "", 0, a.c_causal_radius);
                        csv_line("c_raw", models[mi].first, l, h, o.c_ts[ti], "", 0, a.c_raw);
                    }
                    head[mi == 0 ? "c" : "c_random_init"] = {{"kernel", kernel}, {"kernel_causal_radius", causal}, {"raw", raw}};
                }
                heads.push_back(head);
            }
            jl.push_back(json{{"layer", l}, {"heads", heads}});
        }
        root["layers"] = jl;

        // the means over every layer and head, for tables
        json all = json::object();
        json all_errors = json::object();
        for (size_t mi = 0; mi < o.spec.modes.size(); mi++) {
            json mean = json::array();
            for (size_t ki = 0; ki < o.ks.size(); ki++) {
                double sum = 0;
                for (int l = 0; l < L; l++)
                    for (int h = 0; h < NH; h++) sum += meters[l][h].error[mi][ki].mean();
                mean.push_back(number_or_null(sum / (L * NH)));
            }
            all_errors[mode_names[mi]] = mean;
        }
        all["error_mean"] = all_errors;
        json mass = json::array();
        for (size_t ki = 0; ki < o.ks.size(); ki++) {
            double sum = 0;
            for (int l = 0; l < L; l++)
                for (int h = 0; h < NH; h++) sum += meters[l][h].mass[ki].mean();
            mass.push_back(number_or_null(sum / (L * NH)));
        }
        all["topk_mass_mean"] = mass;
        for (size_t mi = 0; mi < models.size(); mi++) {
            json ck = json::array();
            for (size_t ti = 0; ti < o.c_ts.size(); ti++) {
                double sum = 0;
                for (int l = 0; l < L; l++)
                    for (int h = 0; h < NH; h++) sum += c[mi][ti][l][h].c_kernel;
                ck.push_back(number_or_null(sum / (L * NH)));
            }
            all[mi == 0 ? "c_kernel" : "c_kernel_random_init"] = ck;
        }
        root["all_heads"] = all;

        write_atomically(o.json_path, root.dump(1) + "\n");
        write_atomically(o.csv_path, csv);
        fprintf(stderr, "attn_meter: wrote %s and %s\n", o.json_path.c_str(), o.csv_path.c_str());
    } catch (const std::exception& e) {
        die(e.what());
    }
    return 0;
}
