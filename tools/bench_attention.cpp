// tools/bench_attention.cpp — speed and error of every attention mode against
// exact attention, measured in the same run.
//
// For n in {1K, 2K, 4K, 8K, 16K} (head size 64, one batch, --heads heads) and
// two kinds of input:
//   uniform:   q, k, v entries uniform in [-1, 1] (the seed paper's setting,
//              the worst case for pruning: every score is alike);
//   clustered: keys drawn around 64 Gaussian-mixture centres, queries near the
//              centres, values uniform (as trained attention tends to be);
// it times each mode's forward and forward + backward (one warm-up call, then
// the median of --reps calls; one call at n >= 8K),
// prints the ratio to exact attention, the mean and max absolute error of the
// output against exact, the recall of the lsh and cluster indexes against brute force,
// the log-log slope of time against n per mode, and for knn/brute the keys its search
// rescored per row (topk_brute.h). It writes a CSV.
//
// It then reruns the seed paper's forward experiment (1 batch, 10 heads,
// n = 13000, head size 64, entries uniform in [-10, 10], k = 3) and prints our
// time and mean error beside the paper's laptop figures.
//
//   build/bench_attention [--sizes 1024,2048,...] [--heads 1] [--reps 3] [--k 32] [--csv FILE] [--no-paper]
//                         [--modes knn/brute,knn/cluster,...] [--inputs clustered|uniform]
// --modes keeps only the named modes (exact always runs: it is what the others are
// compared with); --inputs keeps one kind of input.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/common/rng.h"
#include "model/attention.h"

using namespace knngpt;

namespace {

struct Inputs {
    int T, C, NH;
    std::vector<float> qkv;  // (1, T, 3C)
};

Inputs make_inputs(int T, int NH, int HS, bool clustered, float scale, uint64_t seed) {
    Inputs in{T, NH * HS, NH, {}};
    const int C = in.C;
    in.qkv.resize((size_t)T * 3 * C);
    Rng rng(seed);
    auto uniform = [&] { return scale * (2.0f * rng.uniform() - 1.0f); };
    if (!clustered) {
        for (float& x : in.qkv) x = uniform();
        return in;
    }
    // 64 centres per head on a sphere of radius 3; keys at centre + 0.3 noise; queries likewise
    const int centres = 64;
    std::vector<float> centre((size_t)NH * centres * HS);
    for (float& x : centre) x = (float)rng.normal();
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < centres; c++) {
            float* v = &centre[((size_t)h * centres + c) * HS];
            double norm = 0;
            for (int d = 0; d < HS; d++) norm += v[d] * v[d];
            for (int d = 0; d < HS; d++) v[d] = (float)(v[d] * 3.0 / std::sqrt(norm));
        }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            float* q = &in.qkv[(size_t)t * 3 * C + h * HS];
            float* k = q + C;
            float* v = q + 2 * C;
            const float* cq = &centre[((size_t)h * centres + rng.below(centres)) * HS];
            const float* ck = &centre[((size_t)h * centres + rng.below(centres)) * HS];
            for (int d = 0; d < HS; d++) {
                q[d] = cq[d] + 0.3f * (float)rng.normal();
                k[d] = ck[d] + 0.3f * (float)rng.normal();
                v[d] = uniform();
            }
        }
    return in;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median wall time of `reps` calls, after one untimed warm-up call.
double time_ms(const std::function<void()>& f, int reps) {
    f();
    std::vector<double> t;
    for (int r = 0; r < reps; r++) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(t);
}

struct Mode {
    std::string name;
    AttnConfig cfg;
};

struct Result {
    double fwd_ms = 0, fwdbwd_ms = 0, mean_err = 0, max_err = 0, recall = -1;
};

// Runs one mode on one input: forward (timed), then forward + backward (timed).
Result run_mode(const AttnConfig& cfg, const Inputs& in, const std::vector<float>& exact_out, int reps) {
    const int B = 1, T = in.T, C = in.C, NH = in.NH;
    const size_t rows = (size_t)B * NH * T;
    const int K = std::max(cfg.list_size(), 1);
    std::vector<int> idx(rows * K), topk(rows * std::max(cfg.k, 1));
    std::vector<float> logw(rows * K), out((size_t)T * C), lse(rows), dout((size_t)T * C), dqkv(in.qkv.size());
    const AttnLayerCall call{cfg, 0, 0, 0, AttnLayerState{idx.data(), logw.data(), cfg.list_size()},
                             AttnScratch{topk.data()}};
    Rng rng(7);
    for (float& x : dout) x = 2.0f * rng.uniform() - 1.0f;
    Result r;
    r.fwd_ms = time_ms([&] { attention_layer_forward(call, out.data(), lse.data(), in.qkv.data(), B, T, C, NH); }, reps);
    double sum = 0;
    for (size_t i = 0; i < out.size(); i++) {
        double e = std::fabs((double)out[i] - exact_out[i]);
        sum += e;
        r.max_err = std::max(r.max_err, e);
    }
    r.mean_err = sum / out.size();
    if (cfg.mode != AttnMode::Gumbel || cfg.grad == AttnGrad::Sampled)
        r.fwdbwd_ms = time_ms(
            [&] {
                attention_layer_forward(call, out.data(), lse.data(), in.qkv.data(), B, T, C, NH);
                attention_layer_backward(call, dqkv.data(), dout.data(), in.qkv.data(), out.data(), lse.data(), B, T, C,
                                         NH);
            },
            reps);
    return r;
}

// Fraction of brute-force top-k keys that an approximate index (lsh, cluster) also returns.
double index_recall(const Inputs& in, int k, ops::TopkIndex index) {
    const size_t rows = (size_t)in.NH * in.T;
    std::vector<int> brute(rows * k), lsh(rows * k);
    ops::causal_topk_brute(brute.data(), in.qkv.data(), 1, in.T, in.C, in.NH, k);
    ops::LshParams p;
    ops::causal_topk(lsh.data(), in.qkv.data(), 1, in.T, in.C, in.NH, k, index, p);
    long long hit = 0, total = 0;
    for (size_t r = 0; r < rows; r++)
        for (int a = 0; a < k; a++) {
            int key = brute[r * k + a];
            if (key < 0) continue;
            total++;
            for (int b = 0; b < k; b++) hit += lsh[r * k + b] == key;
        }
    return total ? (double)hit / total : 1.0;
}

// Keys the brute index's sgemm search scored again with attention_dot, per searching row
// (knn/brute runs that search unless OpenBLAS has only its SSE kernels: topk_brute.h).
double brute_rescored_per_row(const Inputs& in, int k) {
    std::vector<int> idx((size_t)in.NH * in.T * k);
    ops::TopkStats stats;
    ops::causal_topk_brute_sgemm(idx.data(), in.qkv.data(), 1, in.T, in.C, in.NH, k, &stats);
    return (double)stats.scores_rescored / ((double)in.NH * std::max(in.T - k, 1));
}

double slope(const std::vector<double>& n, const std::vector<double>& t) {
    // least-squares slope of log t against log n
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (size_t i = 0; i < n.size(); i++) {
        if (!(t[i] > 0)) continue;
        double x = std::log(n[i]), y = std::log(t[i]);
        sx += x, sy += y, sxx += x * x, sxy += x * y, m++;
    }
    if (m < 2) return NAN;
    return (m * sxy - sx * sy) / (m * sxx - sx * sx);
}

// the comma-separated fields of s
std::vector<std::string> split_commas(const char* s) {
    std::vector<std::string> v;
    std::string cur;
    for (const char* p = s;; p++) {
        if (*p == ',' || *p == 0) {
            if (!cur.empty()) v.push_back(cur);
            cur.clear();
            if (!*p) break;
        } else {
            cur += *p;
        }
    }
    return v;
}

std::vector<int> parse_sizes(const char* s) {
    std::vector<int> v;
    for (const char* p = s; *p;) {
        v.push_back(atoi(p));
        const char* comma = strchr(p, ',');
        if (!comma) break;
        p = comma + 1;
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<int> sizes = {1024, 2048, 4096, 8192, 16384};
    int heads = 1, reps = 3, k = 32;
    bool paper = true;
    std::vector<std::string> only_modes;  // empty: every mode
    std::string only_inputs;              // empty: both kinds
    std::string csv_path = "build/bench_attention.csv";
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&](const char* flag) {
            if (i + 1 >= argc) { fprintf(stderr, "bench_attention: %s needs a value\n", flag); exit(1); }
            return argv[++i];
        };
        if (a == "--sizes") sizes = parse_sizes(value("--sizes"));
        else if (a == "--heads") heads = atoi(value("--heads"));
        else if (a == "--reps") reps = atoi(value("--reps"));
        else if (a == "--k") k = atoi(value("--k"));
        else if (a == "--csv") csv_path = value("--csv");
        else if (a == "--no-paper") paper = false;
        else if (a == "--modes") only_modes = split_commas(value("--modes"));
        else if (a == "--inputs") only_inputs = value("--inputs");
        else { fprintf(stderr, "bench_attention: unknown flag '%s'\n", a.c_str()); return 1; }
    }
    if (!only_inputs.empty() && only_inputs != "clustered" && only_inputs != "uniform") {
        fprintf(stderr, "bench_attention: --inputs is clustered or uniform\n");
        return 1;
    }
    if (sizes.empty() || heads < 1 || reps < 1 || k < 1) { fprintf(stderr, "bench_attention: bad arguments\n"); return 1; }
    const int HS = 64;

    auto mode = [&](const char* name, AttnMode m, ops::TopkIndex index, int tail, AttnGrad grad) {
        AttnConfig c;
        c.mode = m, c.k = k, c.index = index, c.tail = tail, c.grad = grad, c.seed = 1;
        return Mode{name, c};
    };
    using I = ops::TopkIndex;
    std::vector<Mode> modes = {
        mode("exact", AttnMode::Exact, I::Brute, 0, AttnGrad::Exact),
        mode("knn/brute", AttnMode::Knn, I::Brute, 0, AttnGrad::Exact),
        mode("knn/block", AttnMode::Knn, I::Block, 0, AttnGrad::Exact),
        mode("knn/lsh", AttnMode::Knn, I::Lsh, 0, AttnGrad::Exact),
        mode("knn/cluster", AttnMode::Knn, I::Cluster, 0, AttnGrad::Exact),
        mode("knn-tail/block", AttnMode::KnnTail, I::Block, k, AttnGrad::Exact),
        mode("gumbel/block", AttnMode::Gumbel, I::Block, 0, AttnGrad::Sampled),
        mode("kmv", AttnMode::Kmv, I::Brute, k, AttnGrad::Exact),
        mode("exact+sampled-grad", AttnMode::Exact, I::Brute, 0, AttnGrad::Sampled),
        mode("knn/block+sampled-grad", AttnMode::Knn, I::Block, 0, AttnGrad::Sampled),
    };
    if (!only_modes.empty()) {
        for (const std::string& name : only_modes)
            if (std::none_of(modes.begin(), modes.end(), [&](const Mode& m) { return m.name == name; })) {
                fprintf(stderr, "bench_attention: unknown mode '%s'\n", name.c_str());
                return 1;
            }
        std::vector<Mode> kept;
        for (const Mode& m : modes)
            if (m.name == "exact" || std::find(only_modes.begin(), only_modes.end(), m.name) != only_modes.end())
                kept.push_back(m);
        modes = kept;
    }

    FILE* csv = fopen(csv_path.c_str(), "w");
    if (!csv) { fprintf(stderr, "bench_attention: cannot write %s\n", csv_path.c_str()); return 1; }
    fprintf(csv, "input,n,mode,fwd_ms,fwd_ratio,fwdbwd_ms,fwdbwd_ratio,mean_err,max_err,recall\n");
    printf("bench_attention: head size %d, %d head(s), k %d, %d thread(s), median of %d\n", HS, heads, k,
           omp_get_max_threads(), reps);
    for (bool clustered : {true, false}) {
        const char* kind = clustered ? "clustered" : "uniform";
        if (!only_inputs.empty() && only_inputs != kind) continue;
        std::vector<std::vector<double>> fwd_times(modes.size()), fb_times(modes.size());
        std::vector<double> ns;
        printf("\n%-10s %6s %-24s %10s %8s %12s %8s %10s %9s %7s\n", "input", "n", "mode", "fwd ms", "x exact",
               "fwd+bwd ms", "x exact", "mean err", "max err", "recall");
        for (int n : sizes) {
            Inputs in = make_inputs(n, heads, HS, clustered, 1.0f, 1000 + n);
            ns.push_back(n);
            // exact output for the error columns
            std::vector<float> exact_out((size_t)n * in.C), lse((size_t)heads * n);
            ops::attention_forward(exact_out.data(), lse.data(), in.qkv.data(), 1, n, in.C, heads);
            Result base;
            const int n_reps = n >= 8192 ? 1 : reps;  // the largest sizes: one timed call after the warm-up
            for (size_t m = 0; m < modes.size(); m++) {
                Result r = run_mode(modes[m].cfg, in, exact_out, n_reps);
                if (m == 0) base = r;
                if (modes[m].cfg.mode == AttnMode::Knn &&
                    (modes[m].cfg.index == ops::TopkIndex::Lsh || modes[m].cfg.index == ops::TopkIndex::Cluster))
                    r.recall = index_recall(in, k, modes[m].cfg.index);
                fwd_times[m].push_back(r.fwd_ms);
                fb_times[m].push_back(r.fwdbwd_ms);
                double fr = base.fwd_ms / r.fwd_ms, br = r.fwdbwd_ms > 0 ? base.fwdbwd_ms / r.fwdbwd_ms : NAN;
                printf("%-10s %6d %-24s %10.1f %7.2fx %12.1f %7.2fx %10.2e %9.2e", kind, n, modes[m].name.c_str(),
                       r.fwd_ms, fr, r.fwdbwd_ms, br, r.mean_err, r.max_err);
                if (r.recall >= 0) printf(" %7.3f", r.recall);
                if (modes[m].cfg.mode == AttnMode::Knn && modes[m].cfg.index == ops::TopkIndex::Brute) {
                    if (ops::topk_brute_sgemm_pays())
                        printf("  (sgemm search, %.1f keys rescored per row)", brute_rescored_per_row(in, k));
                    else
                        printf("  (reference search: OpenBLAS has only SSE kernels)");
                }
                printf("\n");
                fflush(stdout);
                fprintf(csv, "%s,%d,%s,%.3f,%.3f,%.3f,%.3f,%.3e,%.3e,%.4f\n", kind, n, modes[m].name.c_str(), r.fwd_ms,
                        fr, r.fwdbwd_ms, br, r.mean_err, r.max_err, r.recall);
            }
        }
        printf("log-log slope of time against n (%s):\n", kind);
        for (size_t m = 0; m < modes.size(); m++)
            printf("  %-24s forward %.2f   forward+backward %.2f\n", modes[m].name.c_str(), slope(ns, fwd_times[m]),
                   slope(ns, fb_times[m]));
    }
    fclose(csv);
    printf("csv: %s\n", csv_path.c_str());

    if (paper) {
        // The seed paper's forward experiment: 1 batch, 10 heads, n = 13000, D = 64,
        // entries uniform in [-10, 10], k = 3 (its laptop: naive 59.5 s, kNN 8.4 s,
        // mean absolute error 0.0175).
        const int n = 13000, NH = 10;
        Inputs in = make_inputs(n, NH, HS, false, 10.0f, 13000);
        std::vector<float> exact_out((size_t)n * in.C), knn_out((size_t)n * in.C), lse((size_t)NH * n);
        double exact_ms = time_ms([&] { ops::attention_forward(exact_out.data(), lse.data(), in.qkv.data(), 1, n, in.C, NH); }, 1);
        AttnConfig c;
        c.mode = AttnMode::Knn, c.k = 3, c.index = ops::TopkIndex::Brute;
        std::vector<int> idx((size_t)NH * n * 3), topk(idx.size());
        std::vector<float> logw(idx.size());
        const AttnLayerCall call{c, 0, 0, 0, AttnLayerState{idx.data(), logw.data(), 3}, AttnScratch{topk.data()}};
        double knn_ms = time_ms(
            [&] { attention_layer_forward(call, knn_out.data(), lse.data(), in.qkv.data(), 1, n, in.C, NH); }, 1);
        double err = 0, max_err = 0;
        for (size_t i = 0; i < knn_out.size(); i++) {
            double e = std::fabs((double)knn_out[i] - exact_out[i]);
            err += e;
            max_err = std::max(max_err, e);
        }
        printf("\nseed paper's forward experiment (n = 13000, 10 heads, D = 64, uniform [-10, 10], k = 3):\n");
        printf("  ours:  exact %.1f s, knn (brute top-k) %.1f s, mean abs error %.4f, max %.2f\n", exact_ms / 1000,
               knn_ms / 1000, err / knn_out.size(), max_err);
        printf("  paper: naive 59.5 s, kNN 8.4 s, mean abs error 0.0175, max 6.0 (a laptop CPU; its naive path\n"
               "         materialises the 10 x 13000 x 13000 score tensor)\n");
    }
    return 0;
}
