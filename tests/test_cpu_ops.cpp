// tests/test_cpu_ops.cpp — the CPU kernels (kernels/cpu/*.h) against naive
// double-precision references written here.
//
// Forward checks: the float kernel against the double reference on the same
// (float-valued) inputs, tolerance 1e-5 relative. The kernels' sums run over at
// most a few dozen terms here (a few hundred for the vocabulary and the long
// attention), each adding ~6e-8 relative rounding, so errors stay around 1e-6.
//
// Backward checks: L = sum(out * w) for a random w; the double reference's
// central differences (step 1e-6, truncation ~1e-12, rounding ~1e-9) against
// the float backward called with dout = w, tolerance 1e-4 relative: the float
// backward chains several rounded products, and a relative 1e-4 is still far
// below any error a wrong formula or index would make (those are O(1)).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <functional>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/classifier.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/global_norm.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/vector_math.h"
#include "tests/test_util.h"

using knngpt_test::finite_difference_gradient;
using knngpt_test::max_rel_error;
using knngpt_test::random_ints;
using knngpt_test::to_double;
using knngpt_test::uniform;
using std::vector;
namespace cpu = knngpt::cpu;

namespace {

constexpr double kForwardTol = 1e-5;
constexpr double kBackwardTol = 1e-4;


// ---------------------------------------------------------------------------
// Double-precision references: the formulas, as plainly as possible.
// ---------------------------------------------------------------------------

vector<double> ref_encoder(const vector<int>& inp, const vector<double>& wte, const vector<double>& wpe,
                           int B, int T, int C) {
    vector<double> out((size_t)B * T * C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] = wte[(size_t)inp[b * T + t] * C + c] + wpe[(size_t)t * C + c];
    return out;
}

struct LayerNormRef {
    vector<double> out, mean, rstd;
};
LayerNormRef ref_layernorm(const vector<double>& inp, const vector<double>& weight, const vector<double>& bias,
                           int N, int C) {
    LayerNormRef r{vector<double>((size_t)N * C), vector<double>(N), vector<double>(N)};
    for (int n = 0; n < N; n++) {
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < C; c++) mean += inp[(size_t)n * C + c];
        mean /= C;
        for (int c = 0; c < C; c++) var += (inp[(size_t)n * C + c] - mean) * (inp[(size_t)n * C + c] - mean);
        var /= C;
        const double rstd = 1.0 / std::sqrt(var + 1e-5);
        for (int c = 0; c < C; c++)
            r.out[(size_t)n * C + c] = (inp[(size_t)n * C + c] - mean) * rstd * weight[c] + bias[c];
        r.mean[n] = mean;
        r.rstd[n] = rstd;
    }
    return r;
}

vector<double> ref_matmul(const vector<double>& inp, const vector<double>& weight, const vector<double>* bias,
                          int N, int C, int OC) {
    vector<double> out((size_t)N * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? (*bias)[o] : 0.0;
            for (int c = 0; c < C; c++) s += inp[(size_t)n * C + c] * weight[(size_t)o * C + c];
            out[(size_t)n * OC + o] = s;
        }
    return out;
}

vector<double> ref_gelu(const vector<double>& x) {
    vector<double> y(x.size());
    const double scale = std::sqrt(2.0 / M_PI);
    for (size_t i = 0; i < x.size(); i++)
        y[i] = 0.5 * x[i] * (1.0 + std::tanh(scale * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
    return y;
}

// Textbook attention: for each (b, h), the full (T, T) score matrix, masked softmax, P V.
struct AttentionRef {
    vector<double> out, lse;
};
AttentionRef ref_attention(const vector<double>& qkv, int B, int T, int C, int NH) {
    const int HS = C / NH;
    const double tau = 1.0 / std::sqrt((double)HS);
    AttentionRef r{vector<double>((size_t)B * T * C, 0.0), vector<double>((size_t)B * NH * T)};
    vector<double> scores((size_t)T * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto q = [&](int t, int c) { return qkv[((size_t)b * T + t) * 3 * C + h * HS + c]; };
            auto k = [&](int t, int c) { return qkv[((size_t)b * T + t) * 3 * C + C + h * HS + c]; };
            auto v = [&](int t, int c) { return qkv[((size_t)b * T + t) * 3 * C + 2 * C + h * HS + c]; };
            for (int i = 0; i < T; i++) {
                double row_max = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    double s = 0.0;
                    for (int c = 0; c < HS; c++) s += q(i, c) * k(j, c);
                    scores[(size_t)i * T + j] = s * tau;
                    row_max = std::fmax(row_max, s * tau);
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) sum += std::exp(scores[(size_t)i * T + j] - row_max);
                r.lse[((size_t)b * NH + h) * T + i] = row_max + std::log(sum);
                for (int j = 0; j <= i; j++) {
                    const double p = std::exp(scores[(size_t)i * T + j] - row_max) / sum;
                    for (int c = 0; c < HS; c++) r.out[((size_t)b * T + i) * C + h * HS + c] += p * v(j, c);
                }
            }
        }
    return r;
}

// Textbook attention backward in double: full P, dP, dS per (b, h). Returns dqkv.
vector<double> ref_attention_backward(const vector<double>& qkv, const vector<double>& dout,
                                      int B, int T, int C, int NH) {
    const int HS = C / NH;
    const double tau = 1.0 / std::sqrt((double)HS);
    vector<double> dqkv(qkv.size(), 0.0);
    vector<double> P((size_t)T * T), dP((size_t)T * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto at = [&](int t, int part, int c) { return ((size_t)b * T + t) * 3 * C + part * C + h * HS + c; };
            auto dO = [&](int t, int c) { return dout[((size_t)b * T + t) * C + h * HS + c]; };
            for (int i = 0; i < T; i++) {
                double row_max = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    double s = 0.0;
                    for (int c = 0; c < HS; c++) s += qkv[at(i, 0, c)] * qkv[at(j, 1, c)];
                    P[(size_t)i * T + j] = s * tau;
                    row_max = std::fmax(row_max, s * tau);
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) sum += std::exp(P[(size_t)i * T + j] - row_max);
                for (int j = 0; j <= i; j++) P[(size_t)i * T + j] = std::exp(P[(size_t)i * T + j] - row_max) / sum;
            }
            for (int i = 0; i < T; i++) {
                double delta = 0.0;  // sum_j P_ij dP_ij
                for (int j = 0; j <= i; j++) {
                    double dp = 0.0;
                    for (int c = 0; c < HS; c++) dp += dO(i, c) * qkv[at(j, 2, c)];
                    dP[(size_t)i * T + j] = dp;
                    delta += P[(size_t)i * T + j] * dp;
                }
                for (int j = 0; j <= i; j++) {
                    const double p = P[(size_t)i * T + j];
                    const double ds = p * (dP[(size_t)i * T + j] - delta);
                    for (int c = 0; c < HS; c++) {
                        dqkv[at(j, 2, c)] += p * dO(i, c);
                        dqkv[at(i, 0, c)] += tau * ds * qkv[at(j, 1, c)];
                        dqkv[at(j, 1, c)] += tau * ds * qkv[at(i, 0, c)];
                    }
                }
            }
        }
    return dqkv;
}

vector<double> ref_crossentropy(const vector<double>& logits, const vector<int>& targets, int N, int V, int Vp) {
    vector<double> losses(N);
    for (int n = 0; n < N; n++) {
        double row_max = -INFINITY, sum = 0.0;
        for (int j = 0; j < V; j++) row_max = std::fmax(row_max, logits[(size_t)n * Vp + j]);
        for (int j = 0; j < V; j++) sum += std::exp(logits[(size_t)n * Vp + j] - row_max);
        losses[n] = row_max + std::log(sum) - logits[(size_t)n * Vp + targets[n]];
    }
    return losses;
}

}  // namespace

// ---------------------------------------------------------------------------
// vector_math: the exp and tanh used by the softmaxes and GELU
// ---------------------------------------------------------------------------

TEST(CpuOps, ExpVectorizableIsWithinTwoUlpOfExpOverTheFloatRange) {
    double max_rel = 0.0;
    for (float x = -87.0f; x <= 88.0f; x += 0.001f) {
        const double expected = std::exp((double)x);
        max_rel = std::fmax(max_rel, std::fabs(cpu::exp_vectorizable(x) - expected) / expected);
    }
    EXPECT_LT(max_rel, 1.2e-7);  // two float ulps (2^-23 = 1.19e-7)
    EXPECT_EQ(cpu::exp_vectorizable(0.0f), 1.0f);
    EXPECT_EQ(cpu::exp_vectorizable(-100.0f), 0.0f);
    EXPECT_EQ(cpu::exp_vectorizable(-INFINITY), 0.0f);
    EXPECT_TRUE(std::isnan(cpu::exp_vectorizable(NAN)));
}

TEST(CpuOps, DotF64LanesEqualsTheExactSumWithinDoubleRounding) {
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int n : {1, 7, 8, 9, 64, 65, 128}) {
        std::vector<float> a(n), b(n);
        long double exact = 0.0L, scale = 0.0L;
        for (int c = 0; c < n; c++) {
            a[c] = normal(rng), b[c] = normal(rng);
            exact += (long double)a[c] * b[c];
            scale += std::fabs((long double)a[c] * b[c]);
        }
        EXPECT_LE(std::fabs((long double)cpu::dot_f64_lanes(a.data(), b.data(), n) - exact), scale * n * 0x1p-53L)
            << "n " << n;
    }
}

TEST(CpuOps, TanhVectorizableIsWithinAbsoluteTolerance) {
    double max_abs = 0.0;
    for (float u = -50.0f; u <= 50.0f; u += 0.001f)
        max_abs = std::fmax(max_abs, std::fabs(cpu::tanh_vectorizable(u) - std::tanh((double)u)));
    EXPECT_LT(max_abs, 3e-7);
    EXPECT_EQ(cpu::tanh_vectorizable(100.0f), 1.0f);
    EXPECT_EQ(cpu::tanh_vectorizable(-100.0f), -1.0f);
}

// ---------------------------------------------------------------------------
// encoder
// ---------------------------------------------------------------------------

TEST(CpuOps, EncoderForwardMatchesReference) {
    const int B = 2, T = 7, C = 12, V = 5, maxT = 9;
    auto inp = random_ints((size_t)B * T, 1, V);
    auto wte = uniform((size_t)V * C, 2), wpe = uniform((size_t)maxT * C, 3);
    vector<float> out((size_t)B * T * C);
    cpu::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    auto expected = ref_encoder(inp, to_double(wte), to_double(wpe), B, T, C);
    EXPECT_LT(max_rel_error(out.data(), expected.data(), out.size()), kForwardTol);
}

TEST(CpuOps, EncoderBackwardMatchesFiniteDifferencesWithRepeatedTokens) {
    // V = 5 tokens over 26 positions: every token id repeats; C = 130 spans several channel blocks.
    const int B = 2, T = 13, C = 130, V = 5, maxT = 15;
    auto inp = random_ints((size_t)B * T, 4, V);
    auto wte = uniform((size_t)V * C, 5), wpe = uniform((size_t)maxT * C, 6);
    auto w = uniform((size_t)B * T * C, 7);
    vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
    cpu::encoder_backward(dwte.data(), dwpe.data(), w.data(), inp.data(), B, T, C, V);

    auto wte_d = to_double(wte), wpe_d = to_double(wpe);
    auto forward = [&] { return ref_encoder(inp, wte_d, wpe_d, B, T, C); };
    auto fd_wte = finite_difference_gradient(wte_d, w, forward);
    auto fd_wpe = finite_difference_gradient(wpe_d, w, forward);
    EXPECT_LT(max_rel_error(dwte.data(), fd_wte.data(), dwte.size()), kBackwardTol);
    EXPECT_LT(max_rel_error(dwpe.data(), fd_wpe.data(), dwpe.size()), kBackwardTol);
}

// ---------------------------------------------------------------------------
// layernorm
// ---------------------------------------------------------------------------

TEST(CpuOps, LayerNormForwardMatchesReferenceAndSavesMeanRstd) {
    const int N = 14, C = 20;
    auto inp = uniform((size_t)N * C, 10, -2.0f, 3.0f);
    auto weight = uniform(C, 11), bias = uniform(C, 12);
    vector<float> out((size_t)N * C), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    auto r = ref_layernorm(to_double(inp), to_double(weight), to_double(bias), N, C);
    EXPECT_LT(max_rel_error(out.data(), r.out.data(), out.size()), kForwardTol);
    EXPECT_LT(max_rel_error(mean.data(), r.mean.data(), N), kForwardTol);
    EXPECT_LT(max_rel_error(rstd.data(), r.rstd.data(), N), kForwardTol);
}

TEST(CpuOps, LayerNormBackwardMatchesFiniteDifferences) {
    const int N = 14, C = 20;
    auto inp = uniform((size_t)N * C, 13, -2.0f, 3.0f);
    auto weight = uniform(C, 14), bias = uniform(C, 15);
    auto w = uniform((size_t)N * C, 16);
    vector<float> out((size_t)N * C), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    vector<float> dinp(inp.size(), 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
    cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(),
                            mean.data(), rstd.data(), N, C);

    auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);
    auto forward = [&] { return ref_layernorm(inp_d, weight_d, bias_d, N, C).out; };
    auto fd_inp = finite_difference_gradient(inp_d, w, forward);
    auto fd_weight = finite_difference_gradient(weight_d, w, forward);
    auto fd_bias = finite_difference_gradient(bias_d, w, forward);
    EXPECT_LT(max_rel_error(dinp.data(), fd_inp.data(), dinp.size()), kBackwardTol);
    EXPECT_LT(max_rel_error(dweight.data(), fd_weight.data(), C), kBackwardTol);
    EXPECT_LT(max_rel_error(dbias.data(), fd_bias.data(), C), kBackwardTol);
}

// ---------------------------------------------------------------------------
// matmul
// ---------------------------------------------------------------------------

TEST(CpuOps, MatmulForwardMatchesReferenceWithAndWithoutBias) {
    const int N = 14, C = 12, OC = 17;
    auto inp = uniform((size_t)N * C, 20), weight = uniform((size_t)OC * C, 21);
    auto bias = uniform(OC, 22);
    auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);
    vector<float> out((size_t)N * OC);

    cpu::matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    auto expected = ref_matmul(inp_d, weight_d, &bias_d, N, C, OC);
    EXPECT_LT(max_rel_error(out.data(), expected.data(), out.size()), kForwardTol);

    cpu::matmul_forward(out.data(), inp.data(), weight.data(), nullptr, N, C, OC);
    auto expected_no_bias = ref_matmul(inp_d, weight_d, nullptr, N, C, OC);
    EXPECT_LT(max_rel_error(out.data(), expected_no_bias.data(), out.size()), kForwardTol);
}

TEST(CpuOps, MatmulBackwardMatchesFiniteDifferences) {
    // OC = 70 spans two column blocks of the dbias reduction.
    const int N = 14, C = 12, OC = 70;
    auto inp = uniform((size_t)N * C, 23), weight = uniform((size_t)OC * C, 24);
    auto bias = uniform(OC, 25);
    auto w = uniform((size_t)N * OC, 26);
    // dinp is overwritten (sgemm's beta = 0): its NaN start must not reach the result
    vector<float> dinp(inp.size(), std::nanf("")), dweight(weight.size(), 0.0f), dbias(OC, 0.0f);
    cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), N, C, OC);

    auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);
    auto forward = [&] { return ref_matmul(inp_d, weight_d, &bias_d, N, C, OC); };
    auto fd_inp = finite_difference_gradient(inp_d, w, forward);
    auto fd_weight = finite_difference_gradient(weight_d, w, forward);
    auto fd_bias = finite_difference_gradient(bias_d, w, forward);
    EXPECT_LT(max_rel_error(dinp.data(), fd_inp.data(), dinp.size()), kBackwardTol);
    EXPECT_LT(max_rel_error(dweight.data(), fd_weight.data(), dweight.size()), kBackwardTol);
    EXPECT_LT(max_rel_error(dbias.data(), fd_bias.data(), OC), kBackwardTol);

    // without a bias gradient, dinp and dweight are unchanged
    vector<float> dinp2(inp.size(), 0.0f), dweight2(weight.size(), 0.0f);
    cpu::matmul_backward(dinp2.data(), dweight2.data(), nullptr, w.data(), inp.data(), weight.data(), N, C, OC);
    EXPECT_EQ(dinp2, dinp);
    EXPECT_EQ(dweight2, dweight);
}

// The plain-loop matmul (the benchmark's baseline) computes what sgemm does.
TEST(CpuOps, MatmulLoopsMatchSgemm) {
    const int N = 19, C = 24, OC = 33;
    auto inp = uniform((size_t)N * C, 27), weight = uniform((size_t)OC * C, 28);
    auto bias = uniform(OC, 29), dout = uniform((size_t)N * OC, 30);
    vector<float> out_blas((size_t)N * OC), out_loops((size_t)N * OC);
    cpu::matmul_forward(out_blas.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    cpu::matmul_forward_loops(out_loops.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    EXPECT_LT(max_rel_error(out_loops.data(), out_blas.data(), out_blas.size()), kForwardTol);

    vector<float> dinp_b(inp.size(), 0.5f), dw_b(weight.size(), 0.5f), db_b(OC, 0.5f);
    vector<float> dinp_l = dinp_b, dw_l = dw_b, db_l = db_b;  // dinp overwritten, the others accumulate onto 0.5
    cpu::matmul_backward(dinp_b.data(), dw_b.data(), db_b.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
    cpu::matmul_backward_loops(dinp_l.data(), dw_l.data(), db_l.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
    EXPECT_LT(max_rel_error(dinp_l.data(), dinp_b.data(), dinp_b.size()), kForwardTol);
    EXPECT_LT(max_rel_error(dw_l.data(), dw_b.data(), dw_b.size()), kForwardTol);
    EXPECT_LT(max_rel_error(db_l.data(), db_b.data(), db_b.size()), kForwardTol);
}

// ---------------------------------------------------------------------------
// gelu, residual
// ---------------------------------------------------------------------------

TEST(CpuOps, GeluForwardMatchesReference) {
    auto inp = uniform(301, 30, -4.0f, 4.0f);
    const float tails[] = {-50.0f, -12.0f, -6.0f, 0.0f, 6.0f, 12.0f, 50.0f};
    for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) inp[k] = tails[k];
    vector<float> out(inp.size());
    cpu::gelu_forward(out.data(), inp.data(), inp.size());
    auto expected = ref_gelu(to_double(inp));
    EXPECT_LT(max_rel_error(out.data(), expected.data(), out.size()), kForwardTol);
}

TEST(CpuOps, GeluBackwardMatchesFiniteDifferences) {
    auto inp = uniform(301, 31, -4.0f, 4.0f);
    const float tails[] = {-50.0f, -12.0f, -6.0f, 0.0f, 6.0f, 12.0f, 50.0f};
    for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) inp[k] = tails[k];
    auto w = uniform(inp.size(), 32);
    vector<float> dinp(inp.size(), 0.0f);
    cpu::gelu_backward(dinp.data(), inp.data(), w.data(), inp.size());
    auto inp_d = to_double(inp);
    auto fd = finite_difference_gradient(inp_d, w, [&] { return ref_gelu(inp_d); });
    EXPECT_LT(max_rel_error(dinp.data(), fd.data(), dinp.size()), kBackwardTol);
}

TEST(CpuOps, ResidualForwardAddsAndBackwardPassesGradientToBothInputs) {
    const size_t N = 301;
    auto a = uniform(N, 33), b = uniform(N, 34), dout = uniform(N, 35);
    vector<float> out(N);
    cpu::residual_forward(out.data(), a.data(), b.data(), N);
    for (size_t i = 0; i < N; i++) EXPECT_EQ(out[i], a[i] + b[i]);
    vector<float> da(N, 0.0f), db(N, 0.0f);
    cpu::residual_backward(da.data(), db.data(), dout.data(), N);
    EXPECT_EQ(da, dout);
    EXPECT_EQ(db, dout);
}

// ---------------------------------------------------------------------------
// attention
// ---------------------------------------------------------------------------

namespace {

void expect_attention_forward_matches_reference(int B, int T, int C, int NH, unsigned seed) {
    auto qkv = uniform((size_t)B * T * 3 * C, seed, -2.0f, 2.0f);
    vector<float> out((size_t)B * T * C), lse((size_t)B * NH * T);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    auto r = ref_attention(to_double(qkv), B, T, C, NH);
    EXPECT_LT(max_rel_error(out.data(), r.out.data(), out.size()), kForwardTol) << "T=" << T << " C=" << C;
    EXPECT_LT(max_rel_error(lse.data(), r.lse.data(), lse.size()), kForwardTol) << "T=" << T << " C=" << C;
}

void expect_attention_backward_matches_finite_differences(int B, int T, int C, int NH, unsigned seed) {
    auto qkv = uniform((size_t)B * T * 3 * C, seed, -2.0f, 2.0f);
    auto w = uniform((size_t)B * T * C, seed + 1);
    vector<float> out((size_t)B * T * C), lse((size_t)B * NH * T);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    vector<float> dqkv(qkv.size(), 0.0f);
    cpu::attention_backward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);

    auto qkv_d = to_double(qkv);
    auto fd = finite_difference_gradient(qkv_d, w, [&] { return ref_attention(qkv_d, B, T, C, NH).out; });
    EXPECT_LT(max_rel_error(dqkv.data(), fd.data(), dqkv.size()), kBackwardTol) << "T=" << T << " C=" << C;
    // the analytic double reference used for long sequences agrees with the differences too
    auto analytic = ref_attention_backward(qkv_d, to_double(w), B, T, C, NH);
    EXPECT_LT(max_rel_error(analytic.data(), fd.data(), fd.size()), 1e-7);
}

}  // namespace

TEST(CpuOps, AttentionForwardMatchesTextbookSoftmax) {
    expect_attention_forward_matches_reference(2, 7, 12, 3, 40);
    expect_attention_forward_matches_reference(2, 13, 20, 4, 41);
    expect_attention_forward_matches_reference(2, 130, 12, 3, 42);  // three query blocks, the last partial
}

TEST(CpuOps, AttentionBackwardMatchesFiniteDifferences) {
    expect_attention_backward_matches_finite_differences(2, 7, 12, 3, 43);
    expect_attention_backward_matches_finite_differences(2, 13, 20, 4, 44);
    expect_attention_backward_matches_finite_differences(1, 70, 4, 2, 45);  // two query blocks
}

TEST(CpuOps, AttentionIsCausal) {
    // Changing q, k and v at positions > i leaves out[.., i, ..] and lse[.., i] unchanged.
    const int B = 2, T = 100, C = 12, NH = 3, i = 40;
    auto qkv = uniform((size_t)B * T * 3 * C, 46, -2.0f, 2.0f);
    vector<float> out((size_t)B * T * C), lse((size_t)B * NH * T);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);

    auto changed = qkv;
    auto noise = uniform(changed.size(), 47, -3.0f, 3.0f);
    for (int b = 0; b < B; b++)
        for (int t = i + 1; t < T; t++)
            for (int c = 0; c < 3 * C; c++) changed[((size_t)b * T + t) * 3 * C + c] = noise[((size_t)b * T + t) * 3 * C + c];
    vector<float> out2(out.size()), lse2(lse.size());
    cpu::attention_forward(out2.data(), lse2.data(), changed.data(), B, T, C, NH);

    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            bool row_same = true;
            for (int c = 0; c < C; c++) row_same &= out[((size_t)b * T + t) * C + c] == out2[((size_t)b * T + t) * C + c];
            if (t <= i) EXPECT_TRUE(row_same) << "b=" << b << " t=" << t;
            else EXPECT_FALSE(row_same) << "b=" << b << " t=" << t;
        }
        for (int h = 0; h < NH; h++)
            for (int t = 0; t <= i; t++)
                EXPECT_EQ(lse[((size_t)b * NH + h) * T + t], lse2[((size_t)b * NH + h) * T + t]);
    }
}

TEST(CpuOps, AttentionMatchesReferenceBeyondT1024) {
    // T = 1100: 18 query blocks, the last one partial; scratch stays (block, T) per thread.
    const int B = 1, T = 1100, C = 16, NH = 2;
    auto qkv = uniform((size_t)B * T * 3 * C, 48, -2.0f, 2.0f);
    auto dout = uniform((size_t)B * T * C, 49);
    vector<float> out((size_t)B * T * C), lse((size_t)B * NH * T);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    auto qkv_d = to_double(qkv);
    auto r = ref_attention(qkv_d, B, T, C, NH);
    EXPECT_LT(max_rel_error(out.data(), r.out.data(), out.size()), kForwardTol);
    EXPECT_LT(max_rel_error(lse.data(), r.lse.data(), lse.size()), kForwardTol);

    vector<float> dqkv(qkv.size(), 0.0f);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
    auto expected = ref_attention_backward(qkv_d, to_double(dout), B, T, C, NH);
    EXPECT_LT(max_rel_error(dqkv.data(), expected.data(), dqkv.size()), kBackwardTol);
}

// ---------------------------------------------------------------------------
// classifier
// ---------------------------------------------------------------------------

TEST(CpuOps, CrossEntropyForwardMatchesReferenceAndIgnoresPadding) {
    const int N = 14, V = 23, Vp = 32;
    auto logits = uniform((size_t)N * Vp, 50, -4.0f, 4.0f);
    for (int n = 0; n < N; n++)  // huge padding logits would dominate if they leaked in
        for (int j = V; j < Vp; j++) logits[(size_t)n * Vp + j] = 100.0f;
    auto targets = random_ints(N, 51, V);
    vector<float> losses(N);
    cpu::crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
    auto expected = ref_crossentropy(to_double(logits), targets, N, V, Vp);
    EXPECT_LT(max_rel_error(losses.data(), expected.data(), N), kForwardTol);
}

TEST(CpuOps, CrossEntropyBackwardMatchesFiniteDifferencesOfMeanLoss) {
    const int N = 14, V = 23, Vp = 32;
    auto logits = uniform((size_t)N * Vp, 52, -4.0f, 4.0f);
    auto targets = random_ints(N, 53, V);
    vector<float> dlogits(logits.size(), 123.0f);  // written, not accumulated
    cpu::crossentropy_softmax_backward(dlogits.data(), logits.data(), targets.data(), 1.0f / N, N, V, Vp);

    auto logits_d = to_double(logits);
    auto mean_loss = [&] {
        auto losses = ref_crossentropy(logits_d, targets, N, V, Vp);
        double sum = 0.0;
        for (double l : losses) sum += l;
        return vector<double>{sum / N};
    };
    auto fd = finite_difference_gradient(logits_d, vector<float>{1.0f}, mean_loss);
    EXPECT_LT(max_rel_error(dlogits.data(), fd.data(), dlogits.size()), kBackwardTol);
}

TEST(CpuOps, CrossEntropyBackwardZeroesPaddingAndWorksInPlace) {
    const int N = 14, V = 23, Vp = 32;
    auto logits = uniform((size_t)N * Vp, 54, -4.0f, 4.0f);
    auto targets = random_ints(N, 55, V);
    vector<float> dlogits(logits.size(), 7.0f);
    cpu::crossentropy_softmax_backward(dlogits.data(), logits.data(), targets.data(), 0.5f, N, V, Vp);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) EXPECT_EQ(dlogits[(size_t)n * Vp + j], 0.0f) << "n=" << n << " j=" << j;

    auto in_place = logits;
    cpu::crossentropy_softmax_backward(in_place.data(), in_place.data(), targets.data(), 0.5f, N, V, Vp);
    EXPECT_EQ(in_place, dlogits);
}

TEST(CpuOps, CrossEntropyFusedEqualsForwardThenBackwardInPlaceAndOut) {
    const int N = 14, V = 23, Vp = 32;
    auto logits = uniform((size_t)N * Vp, 56, -4.0f, 4.0f);
    for (int n = 0; n < N; n++)  // the padding must neither enter the softmax nor survive in dlogits
        for (int j = V; j < Vp; j++) logits[(size_t)n * Vp + j] = 100.0f;
    auto targets = random_ints(N, 57, V);
    targets[0] = V - 1;  // the last real column
    const float dloss = 1.0f / (3 * N);
    vector<float> want_losses(N), want_dlogits(logits.size());
    cpu::crossentropy_forward(want_losses.data(), logits.data(), targets.data(), N, V, Vp);
    cpu::crossentropy_softmax_backward(want_dlogits.data(), logits.data(), targets.data(), dloss, N, V, Vp);

    vector<float> losses(N, -7.0f), dlogits(logits.size(), 7.0f);
    cpu::crossentropy_fused(losses.data(), dlogits.data(), logits.data(), targets.data(), dloss, N, V, Vp);
    EXPECT_EQ(losses, want_losses);
    EXPECT_LT(max_rel_error(dlogits.data(), want_dlogits.data(), dlogits.size()), 1e-6);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) EXPECT_EQ(dlogits[(size_t)n * Vp + j], 0.0f) << "n=" << n << " j=" << j;

    // in place: dlogits is logits, the loss still reads the target's logit
    auto in_place = logits;
    vector<float> in_place_losses(N, -7.0f);
    cpu::crossentropy_fused(in_place_losses.data(), in_place.data(), in_place.data(), targets.data(), dloss, N, V, Vp);
    EXPECT_EQ(in_place_losses, want_losses);
    EXPECT_EQ(in_place, dlogits);
}

// ---------------------------------------------------------------------------
// adamw, global norm
// ---------------------------------------------------------------------------

TEST(CpuOps, AdamWMatchesHandComputedThreeSteps) {
    const size_t N = 5;
    const float lr = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
    vector<float> params = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f};
    vector<float> m(N, 0.0f), v(N, 0.0f);
    const vector<vector<float>> grads = {{0.1f, -0.2f, 0.0f, 1.0f, 4.0f},
                                         {0.3f, 0.2f, -1.0f, 1.0f, -4.0f},
                                         {-0.1f, 0.0f, 2.0f, -0.5f, 1.0f}};
    vector<double> p_ref(params.begin(), params.end()), m_ref(N, 0.0), v_ref(N, 0.0);
    for (int t = 1; t <= 3; t++) {
        cpu::adamw_update(params.data(), grads[t - 1].data(), m.data(), v.data(), N, lr, beta1, beta2, eps,
                          weight_decay, t, grad_scale);
        for (size_t i = 0; i < N; i++) {
            const double g = (double)grads[t - 1][i] * grad_scale;
            m_ref[i] = (double)beta1 * m_ref[i] + (1.0 - (double)beta1) * g;
            v_ref[i] = (double)beta2 * v_ref[i] + (1.0 - (double)beta2) * g * g;
            const double m_hat = m_ref[i] / (1.0 - std::pow((double)beta1, t));
            const double v_hat = v_ref[i] / (1.0 - std::pow((double)beta2, t));
            p_ref[i] -= (double)lr * (m_hat / (std::sqrt(v_hat) + eps) + (double)weight_decay * p_ref[i]);
        }
        EXPECT_LT(max_rel_error(params.data(), p_ref.data(), N), 1e-6) << "step " << t;
        EXPECT_LT(max_rel_error(m.data(), m_ref.data(), N), 1e-6) << "step " << t;
        EXPECT_LT(max_rel_error(v.data(), v_ref.data(), N), 1e-6) << "step " << t;
    }
}

TEST(CpuOps, GlobalNormSquaredMatchesDoubleSum) {
    auto x = uniform(100003, 60, -3.0f, 3.0f);
    double expected = 0.0;
    for (float v : x) expected += (double)v * (double)v;
    EXPECT_NEAR(cpu::global_norm_squared(x.data(), x.size()), expected, 1e-12 * expected);
}

// ---------------------------------------------------------------------------
// the += convention of every backward (matmul's dinp excepted: it is overwritten)
// ---------------------------------------------------------------------------

TEST(CpuOps, BackwardsAccumulateIntoGradients) {
    // Calling each backward twice on zeroed gradients gives twice the gradient of one call.
    auto expect_doubled = [](const vector<float>& once, const vector<float>& twice, const char* what) {
        vector<double> doubled(once.size());
        for (size_t i = 0; i < once.size(); i++) doubled[i] = 2.0 * once[i];
        EXPECT_LT(max_rel_error(twice.data(), doubled.data(), twice.size()), 1e-6) << what;
    };
    auto run_twice = [&](const char* what, vector<vector<float>*> grads, const std::function<void()>& backward) {
        for (auto* g : grads) std::fill(g->begin(), g->end(), 0.0f);
        backward();
        vector<vector<float>> once;
        for (auto* g : grads) once.push_back(*g);
        backward();
        for (size_t k = 0; k < grads.size(); k++) expect_doubled(once[k], *grads[k], what);
    };

    const int B = 2, T = 13, C = 20, NH = 4, OC = 17, V = 5, N = B * T;
    auto dout_c = uniform((size_t)N * C, 70), dout_oc = uniform((size_t)N * OC, 71);

    // encoder
    auto inp = random_ints(N, 72, V);
    vector<float> dwte((size_t)V * C), dwpe((size_t)T * C);
    run_twice("encoder", {&dwte, &dwpe},
              [&] { cpu::encoder_backward(dwte.data(), dwpe.data(), dout_c.data(), inp.data(), B, T, C, V); });

    // layernorm
    auto x = uniform((size_t)N * C, 73), weight = uniform(C, 74), bias = uniform(C, 75);
    vector<float> y((size_t)N * C), mean(N), rstd(N);
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), weight.data(), bias.data(), N, C);
    vector<float> dx(x.size()), dweight(C), dbias(C);
    run_twice("layernorm", {&dx, &dweight, &dbias}, [&] {
        cpu::layernorm_backward(dx.data(), dweight.data(), dbias.data(), dout_c.data(), x.data(), weight.data(),
                                mean.data(), rstd.data(), N, C);
    });

    // matmul: the parameter gradients accumulate; its dinp is the exception,
    // overwritten (beta = 0), so the same after the second call as after the first
    auto mw = uniform((size_t)OC * C, 76);
    vector<float> dmx(x.size()), dmw(mw.size()), dmb(OC), dmx_once;
    run_twice("matmul", {&dmw, &dmb}, [&] {
        cpu::matmul_backward(dmx.data(), dmw.data(), dmb.data(), dout_oc.data(), x.data(), mw.data(), N, C, OC);
        if (dmx_once.empty()) dmx_once = dmx;
    });
    EXPECT_EQ(dmx, dmx_once) << "matmul dinp is overwritten";

    // gelu, residual
    vector<float> dgelu(x.size());
    run_twice("gelu", {&dgelu}, [&] { cpu::gelu_backward(dgelu.data(), x.data(), dout_c.data(), x.size()); });
    vector<float> da(x.size()), db(x.size());
    run_twice("residual", {&da, &db}, [&] { cpu::residual_backward(da.data(), db.data(), dout_c.data(), x.size()); });

    // attention
    auto qkv = uniform((size_t)N * 3 * C, 77);
    vector<float> out((size_t)N * C), lse((size_t)B * NH * T);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    vector<float> dqkv(qkv.size());
    run_twice("attention", {&dqkv}, [&] {
        cpu::attention_backward(dqkv.data(), dout_c.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
    });
}
