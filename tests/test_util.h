// tests/test_util.h — generic helpers shared by the GoogleTest suites:
// random inputs, error measures and comparisons, finite differences,
// temporary directories and the test data and build paths.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace knngpt_test {

// n floats uniform in [lo, hi) from std::mt19937(seed).
inline std::vector<float> uniform(size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> value(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = value(rng);
    return v;
}

// n ints uniform in [0, upper) from std::mt19937(seed).
inline std::vector<int> random_ints(size_t n, unsigned seed, int upper) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> value(0, upper - 1);
    std::vector<int> v(n);
    for (int& x : v) x = value(rng);
    return v;
}

inline std::vector<double> to_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

// Largest |a - b| over the largest |b|: a norm-wise relative error that does
// not blow up on entries that happen to be near zero. A NaN in either array
// is an infinite error (fmax alone would skip it).
template <class TA, class TB>
double max_rel_error(const TA* a, const TB* b, size_t n) {
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double diff = std::fabs((double)a[i] - (double)b[i]);
        if (std::isnan(diff)) return INFINITY;
        max_diff = std::fmax(max_diff, diff);
        max_ref = std::fmax(max_ref, std::fabs((double)b[i]));
    }
    return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

// Largest |a[i] - b[i]|.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0.0;
    for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs((double)a[i] - (double)b[i]));
    return d;
}

// got has want's size and max_rel_error(got, want) <= tolerance; `what` names
// the array in the failure message.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tolerance,
                         const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_LE(max_rel_error(got.data(), want.data(), want.size()), tolerance) << what;
}

// f over xs in a loop the compiler vectorises gives, at every 997th input, the bits of a
// scalar call (its argument read through a volatile, so that call stays scalar)
template <class F>
inline void expect_vector_loop_matches_scalar(F&& f, const std::vector<double>& xs) {
    std::vector<double> lanes(xs.size());
    for (size_t n = 0; n < xs.size(); n++) lanes[n] = f(xs[n]);
    for (size_t n = 0; n < xs.size(); n += 997) {
        volatile double x = xs[n];
        const double one = f(x);
        ASSERT_EQ(std::memcmp(&one, &lanes[n], sizeof one), 0) << "x = " << xs[n];
    }
}

// dL/dx by central differences in double, L = sum(forward() * w), where
// forward() reads x. Step 1e-6: truncation ~1e-12, rounding ~1e-10 relative.
inline std::vector<double> finite_difference_gradient(std::vector<double>& x, const std::vector<float>& w,
                                                      const std::function<std::vector<double>()>& forward,
                                                      double step = 1e-6) {
    auto loss = [&] {
        std::vector<double> out = forward();
        double sum = 0.0;
        for (size_t i = 0; i < out.size(); i++) sum += out[i] * w[i];
        return sum;
    };
    std::vector<double> grad(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const double saved = x[i];
        x[i] = saved + step;
        const double loss_plus = loss();
        x[i] = saved - step;
        const double loss_minus = loss();
        x[i] = saved;
        grad[i] = (loss_plus - loss_minus) / (2.0 * step);
    }
    return grad;
}

// A fresh temporary directory, removed (with its files) when this goes out of scope.
struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/knngpt_test_XXXXXX";
        const char* p = mkdtemp(tmpl);
        if (!p) { perror("mkdtemp"); std::abort(); }
        path = p;
    }
    ~TempDir() { std::string cmd = "rm -rf '" + path + "'"; if (std::system(cmd.c_str())) {} }
    std::string file(const std::string& name) const { return path + "/" + name; }
};

// A whole file's bytes ("" if it cannot be read), and a file written with `bytes`.
inline std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
inline void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), (std::streamsize)bytes.size());
}

// The text used by tests that need real data: $KNNGPT_TEXT, else "" (the
// test then skips with a message saying so).
inline std::string test_text_path() {
    const char* p = std::getenv("KNNGPT_TEXT");
    return p ? std::string(p) : std::string();
}

// The path of a program the tests run (train_gpt_cpu, prepare_data):
// $KNNGPT_BIN_DIR/<name>, by default ./<name> (the repository root, where
// `make` puts them; `make test-portable` and `make test SANITIZE=1` point it
// at their build directories).
inline std::string program_path(const std::string& name) {
    const char* dir = std::getenv("KNNGPT_BIN_DIR");
    return std::string(dir && *dir ? dir : ".") + "/" + name;
}

// Directory holding build outputs (reference tensors, programs): $KNNGPT_BUILD or "build".
inline std::string build_dir() {
    const char* p = std::getenv("KNNGPT_BUILD");
    return p ? std::string(p) : std::string("build");
}

// Elementwise mean, standard deviation and standard error of the mean over equally
// long vectors (one estimator run each), accumulated one run at a time.
struct RunningMoments {
    std::vector<double> sum, sum2;
    int count = 0;
    explicit RunningMoments(size_t n) : sum(n, 0.0), sum2(n, 0.0) {}
    void add(const float* x) {
        for (size_t e = 0; e < sum.size(); e++) sum[e] += x[e], sum2[e] += (double)x[e] * x[e];
        count++;
    }
    void add(const std::vector<float>& x) { add(x.data()); }
    double mean(size_t e) const { return sum[e] / count; }
    double sd(size_t e) const {
        const double m = mean(e);
        return std::sqrt(std::max(0.0, (sum2[e] / count - m * m) * count / (count - 1)));
    }
    double stderr_of_mean(size_t e) const { return sd(e) / std::sqrt((double)count); }
};

// Mean and standard error of a list of numbers.
inline void mean_and_stderr(const std::vector<double>& x, double* mean, double* se) {
    double s = 0.0, s2 = 0.0;
    for (double v : x) s += v, s2 += v * v;
    *mean = s / x.size();
    *se = std::sqrt(std::max(0.0, s2 / x.size() - *mean * *mean) / (x.size() - 1));
}

}  // namespace knngpt_test
