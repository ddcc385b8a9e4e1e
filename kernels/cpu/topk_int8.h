// kernels/cpu/topk_int8.h — brute's int8 first pass (ALGORITHMS.md §6.2): the fast scores
// of causal_topk_brute_fast (topk_brute.h) as integer dot products of quantised queries
// and keys instead of sgemm's fp32 ones; the lists stay brute force's, bit for bit.
//
//   keys     one scale per head, s_k = max |k_jd| / 127 over its finite entries, and
//            k^_jd = round(k_jd / s_k) in [-127, 127]
//   queries  one scale per row, s_q = max_d |q_d| / 127, q^_d = round(q_d / s_q)
//   fast     f_ij = sum_d q^_d k^_jd: an exact integer, |f| <= 127^2 HS < 2^24 (HS <= 1040),
//            so exact as a float too
//   bound    |s_ij / (s_q s_k) - f_ij| <= (||e_q|| K + ||s_q q^|| E + gamma_HS ||q|| K) / (s_q s_k),
//            e_q = q - s_q q^, e_k = k - s_k k^, K = max_{j<=i} ||k_j||, E = max_{j<=i} ||e_k_j||
//            (norms in double, rounded up; the derivation: §6.2): Delta_i in f's units
//
// Shapes as in topk_brute.h; nothing is saved for a backward. No CUDA twin: the CUDA brute
// (kernels/cuda/topk_index.cuh) scores in fp32 and gives the same lists. The design
// decision: the fast scores are exact integers, so AMX tiles, AVX-512 VNNI and the plain
// loop (topk_int8_kernel) compute the same values on every CPU, and brute's rows,
// threshold and rescoring are used unchanged. The brute index takes this pass where it
// pays (topk_int8_pays).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define KNNGPT_TOPK_INT8_VNNI 1
#else
#define KNNGPT_TOPK_INT8_VNNI 0
#endif
#if defined(__AVX512F__) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KNNGPT_TOPK_INT8_AMX 1
#else
#define KNNGPT_TOPK_INT8_AMX 0
#endif

#include "kernels/cpu/topk_brute.h"

namespace knngpt::cpu {

// Layout: a head's keys as unsigned bytes k^ + 128 in chunks of 16 keys,
//   (chunks, HSP / 4, 16, 4): chunk c, group g, lane l, byte b = key 16c + l, dim 4g + b
// (HSP = HS rounded up to 4, or to 64 for the AMX tiles; padding dims and keys are k^ = 0,
// byte 128); a query as HSP / 4 groups of 4 signed bytes. sum_d (k^_jd + 128) q^_d =
// f_ij + 128 sum_d q^_d, so the row's offset 128 sum_d q^_d is subtracted once per score.
// With AMX (where Linux grants the tiles) one tdpbsud computes a 16 x 16 block of scores
// over 64 dimensions; with AVX-512 VNNI one vpdpbusd adds 4 dimensions of 16 keys (64
// products); other builds run a plain loop.
constexpr int kTopkInt8Lanes = 16;    // keys per chunk
constexpr int kTopkInt8MaxHS = 1040;  // 127^2 HSP < 2^24: fast scores exact as floats

inline int topk_int8_hs4(int HS) { return (HS + 3) / 4 * 4; }
inline int topk_int8_num_chunks(int n) { return (n + kTopkInt8Lanes - 1) / kTopkInt8Lanes; }

// the quantised value of x at scale s (> 0): round(x (1 / s)) clamped to [-127, 127] (a NaN
// gives -127; its row or key never uses the fast scores). Compares rather than std::fmax and
// std::fmin, which GCC calls out of line here: the same values, signed zeros included.
inline double topk_int8_quantise(float x, double inv_s) {
    const double r = std::nearbyint((double)x * inv_s);
    const double low = r > -127.0 ? r : -127.0;  // NaN: -127
    return low < 127.0 ? low : 127.0;
}

// the scale of values whose largest finite magnitude is m: m / 127, or 1 where m is 0
inline double topk_int8_scale(double m) { return m > 0.0 ? m / 127.0 : 1.0; }

// x[0..HS) quantised at scale s into out[0..HS); returns an upper bound on ||x - s x^||_2
// (NaN or inf for a non-finite x): each difference in double is within
// 2^-52 (|x_d| + s |x^_d|) <= 2^-52 (2 |x_d| + s) of the real one, so the norm of those
// errors is below 2^-51 ||x|| + 2^-52 s sqrt(HS); the 2^-40 terms cover them and the sums'
// rounding. One loop without branches, so that it vectorises.
inline double topk_int8_quantise_row(int8_t* out, const float* x, int HS, double s) {
    const double inv_s = 1.0 / s;
    double sum = 0.0, sum_x = 0.0;
    for (int d = 0; d < HS; d++) {
        const double r = topk_int8_quantise(x[d], inv_s), e = (double)x[d] - s * r;
        out[d] = (int8_t)r;
        sum += e * e;
        sum_x += (double)x[d] * x[d];
    }
    return std::sqrt(sum) * (1.0 + 0x1p-40) + 0x1p-40 * (std::sqrt(sum_x) + s * std::sqrt((double)HS));
}

// One fast-score block: NR rows (their queries q32 + r * q_ld, HSP / 4 int32 each, 4 bytes a
// group) against NC chunks from `chunk0` (G = HSP / 4 groups a chunk); out + r * ld + 16 c.
// Plain: the same sums in a plain loop (tests compare the two).
template <int NR, int NC, bool Plain = false>
inline void topk_int8_block(float* out, size_t ld, const int32_t* q32, size_t q_ld, const int32_t* offset,
                            const uint8_t* chunk0, int G) {
#if KNNGPT_TOPK_INT8_VNNI
    if constexpr (!Plain) {
        __m512i acc[NR][NC];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_si512();
        for (int g = 0; g < G; g++) {
            __m512i key[NC];
            for (int c = 0; c < NC; c++) key[c] = _mm512_loadu_si512(chunk0 + ((size_t)c * G + g) * 64);
            for (int r = 0; r < NR; r++) {
                const __m512i q = _mm512_set1_epi32(q32[r * q_ld + g]);
                for (int c = 0; c < NC; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], key[c], q);
            }
        }
        // (the zero-masked conversion: GCC 12 warns, wrongly, about the plain one's undefined source)
        for (int r = 0; r < NR; r++) {
            const __m512i off = _mm512_set1_epi32(offset[r]);
            for (int c = 0; c < NC; c++)
                _mm512_storeu_ps(out + r * ld + c * kTopkInt8Lanes,
                                 _mm512_maskz_cvtepi32_ps((__mmask16)0xffff, _mm512_sub_epi32(acc[r][c], off)));
        }
        return;
    }
#endif
    int32_t acc[NR][NC][kTopkInt8Lanes] = {};
    for (int g = 0; g < G; g++)
        for (int r = 0; r < NR; r++) {
            int8_t q[4];
            std::memcpy(q, q32 + r * q_ld + g, 4);
            for (int c = 0; c < NC; c++) {
                const uint8_t* key = chunk0 + ((size_t)c * G + g) * 64;
                for (int l = 0; l < kTopkInt8Lanes; l++)
                    acc[r][c][l] += key[4 * l] * q[0] + key[4 * l + 1] * q[1] + key[4 * l + 2] * q[2] + key[4 * l + 3] * q[3];
            }
        }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            for (int l = 0; l < kTopkInt8Lanes; l++)
                out[r * ld + c * kTopkInt8Lanes + l] = (float)(acc[r][c][l] - offset[r]);
}

// Rows r0..r1 - 1 of a block against keys j0.. (j0 a multiple of 16; chunk0 = the chunk of
// j0): row r gets the chunks covering keys j0 .. min(r + 1, j1) - 1, in groups of four rows
// (each group as far as its last row needs; rows hold ld >= 16 ceil((j1 - j0) / 16) floats).
// q32, offset: the block's rows, row r at (r - r0).
template <bool Plain = false>
inline void topk_int8_tile(float* out, size_t ld, const int32_t* q32, size_t q_ld, const int32_t* offset,
                           const uint8_t* chunk0, int G, int r0, int r1, int j0, int j1) {
    auto chunks_of = [&](int r) { return topk_int8_num_chunks(std::min(r + 1, j1) - j0); };
    size_t chunk_bytes = (size_t)G * 64;
    int r = r0;
    for (; r + 4 <= r1; r += 4) {
        const int n = chunks_of(r + 3), u0 = r - r0;
        int c = 0;
        for (; c + 4 <= n; c += 4)
            topk_int8_block<4, 4, Plain>(out + u0 * ld + c * kTopkInt8Lanes, ld, q32 + u0 * q_ld, q_ld, offset + u0,
                                           chunk0 + c * chunk_bytes, G);
        for (; c < n; c++)
            topk_int8_block<4, 1, Plain>(out + u0 * ld + c * kTopkInt8Lanes, ld, q32 + u0 * q_ld, q_ld, offset + u0,
                                           chunk0 + c * chunk_bytes, G);
    }
    for (; r < r1; r++) {
        const int n = chunks_of(r), u0 = r - r0;
        for (int c = 0; c < n; c++)
            topk_int8_block<1, 1, Plain>(out + u0 * ld + c * kTopkInt8Lanes, ld, q32 + u0 * q_ld, q_ld, offset + u0,
                                           chunk0 + c * chunk_bytes, G);
    }
}

// Which instructions compute the fast scores: AMX tiles (a 16 x 16 block of scores per
// instruction group), AVX-512 VNNI, or the plain loop. The best the build and the process
// have, unless KNNGPT_INT8_KERNEL=amx|vnni|plain asks for another the build has (benchmarks
// compare them; every choice gives the same integers; plain also turns brute's int8 pass
// off, topk_int8_pays).
enum class TopkInt8Kernel { Plain, Vnni, Amx };

// whether Linux lets this process use the AMX tile registers: asked once
// (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; refused on CPUs or kernels without AMX)
inline bool topk_int8_amx_permitted() {
#if KNNGPT_TOPK_INT8_AMX
    static const bool permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return permitted;
#else
    return false;
#endif
}

// the kernels this build and process can run (tests run each)
inline std::vector<TopkInt8Kernel> topk_int8_kernels_here() {
    std::vector<TopkInt8Kernel> here = {TopkInt8Kernel::Plain};
    if (KNNGPT_TOPK_INT8_VNNI) here.push_back(TopkInt8Kernel::Vnni);
    if (topk_int8_amx_permitted()) here.push_back(TopkInt8Kernel::Amx);
    return here;
}
inline const char* topk_int8_kernel_name(TopkInt8Kernel kernel) {
    return kernel == TopkInt8Kernel::Amx ? "amx" : kernel == TopkInt8Kernel::Vnni ? "vnni" : "plain";
}

inline TopkInt8Kernel topk_int8_kernel() {
    static const TopkInt8Kernel chosen = [] {
        const TopkInt8Kernel best = topk_int8_amx_permitted() ? TopkInt8Kernel::Amx
                                    : KNNGPT_TOPK_INT8_VNNI  ? TopkInt8Kernel::Vnni
                                                             : TopkInt8Kernel::Plain;
        const char* env = std::getenv("KNNGPT_INT8_KERNEL");
        if (!env || !*env) return best;
        const std::string name = env;
        if (name == "plain") return TopkInt8Kernel::Plain;
        if (name == "vnni" && KNNGPT_TOPK_INT8_VNNI) return TopkInt8Kernel::Vnni;
        if (name == "amx" && best == TopkInt8Kernel::Amx) return TopkInt8Kernel::Amx;
        std::fprintf(stderr, "KNNGPT_INT8_KERNEL=%s: not one this build and CPU have (plain%s%s); using %s\n", env,
                     KNNGPT_TOPK_INT8_VNNI ? ", vnni" : "", best == TopkInt8Kernel::Amx ? ", amx" : "",
                     best == TopkInt8Kernel::Amx ? "amx" : best == TopkInt8Kernel::Vnni ? "vnni" : "plain");
        return best;
    }();
    return chosen;
}

#if KNNGPT_TOPK_INT8_AMX
// The AMX tiles of one thread, for queries of HSP bytes (a multiple of 64: the pass pads
// them for this kernel): tmm0..3 four 16 x 16 int32 blocks of scores (two row groups x two
// chunks), tmm4, tmm5 the two row groups' 16 queries x 64 bytes, tmm6, tmm7 the two chunks'
// matching 16 key groups (a chunk's groups are already the B tile's layout: row g = 16 keys
// x 4 dims). Constructed (the configuration loaded) on the thread that uses it.
struct TopkInt8AmxTiles {
    struct alignas(64) Config {
        uint8_t palette = 1, start_row = 0, reserved[14] = {};
        uint16_t colsb[16] = {};
        uint8_t rows[16] = {};
    };
    int steps;  // 64-byte steps of a query
    explicit TopkInt8AmxTiles(int HSP) : steps(HSP / 64) {
        Config c;
        for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
        _tile_loadconfig(&c);
    }
    ~TopkInt8AmxTiles() { _tile_release(); }
    TopkInt8AmxTiles(const TopkInt8AmxTiles&) = delete;
    TopkInt8AmxTiles& operator=(const TopkInt8AmxTiles&) = delete;

    // Every 16 x 16 block of fast scores of rows r0..r1 - 1 against keys j0.. (j0 a multiple of
    // 16; chunk0 = the chunk of j0), row groups in pairs and chunks in pairs as far as the
    // pair's last row needs: consume(block, u, rows, c) gets the block's int32 sums (row m at
    // block + 16 m, before the offsets) for rows r0 + u .. r0 + u + rows - 1 and chunk c. A
    // row's chunks come in ascending order. q32 must hold 32 rows from every pair's first row
    // (rows past r1 are computed and not consumed).
    template <class Consume>
    void blocks(const int32_t* q32, size_t q_ld, const uint8_t* chunk0, int G, int r0, int r1, int j0, int j1,
                Consume consume) const {
        alignas(64) int32_t block[16 * 16];
        const size_t chunk_bytes = (size_t)G * 64, q_stride = q_ld * 4;
        for (int r = r0; r < r1; r += 32) {
            const int u = r - r0, rows0 = std::min(16, r1 - r), rows1 = std::min(16, r1 - r - 16);
            const int n = topk_int8_num_chunks(std::min(r + std::min(32, r1 - r), j1) - j0);
            const uint8_t* qa = reinterpret_cast<const uint8_t*>(q32 + u * q_ld);
            const uint8_t* qb = qa + 16 * q_stride;
            for (int c = 0; c < n; c += 2) {
                const uint8_t* k0 = chunk0 + c * chunk_bytes;
                const uint8_t* k1 = k0 + chunk_bytes;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int step = 0; step < steps; step++) {
                    _tile_loadd(4, qa + 64 * step, q_stride);
                    _tile_loadd(5, qb + 64 * step, q_stride);
                    _tile_loadd(6, k0 + 1024 * step, 64);
                    _tile_loadd(7, k1 + 1024 * step, 64);
                    _tile_dpbsud(0, 4, 6);
                    _tile_dpbsud(1, 4, 7);
                    _tile_dpbsud(2, 5, 6);
                    _tile_dpbsud(3, 5, 7);
                }
                _tile_stored(0, block, 64);
                consume(block, u, rows0, c);
                if (c + 1 < n) {
                    _tile_stored(1, block, 64);
                    consume(block, u, rows0, c + 1);
                }
                if (rows1 > 0) {
                    _tile_stored(2, block, 64);
                    consume(block, u + 16, rows1, c);
                    if (c + 1 < n) {
                        _tile_stored(3, block, 64);
                        consume(block, u + 16, rows1, c + 1);
                    }
                }
            }
        }
    }
    // row m of a block minus its row's offset, as floats (exact: |f| < 2^24)
    static __m512 block_row(const int32_t* block, int m, int32_t offset) {
        return _mm512_maskz_cvtepi32_ps((__mmask16)0xffff,
                                        _mm512_sub_epi32(_mm512_load_si512(block + 16 * m), _mm512_set1_epi32(offset)));
    }
    // topk_int8_tile's contract
    void tile(float* out, size_t ld, const int32_t* q32, size_t q_ld, const int32_t* offset, const uint8_t* chunk0,
              int G, int r0, int r1, int j0, int j1) const {
        blocks(q32, q_ld, chunk0, G, r0, r1, j0, j1, [&](const int32_t* block, int u, int rows, int c) {
            for (int m = 0; m < rows; m++)
                _mm512_storeu_ps(out + (u + m) * ld + c * kTopkInt8Lanes, block_row(block, m, offset[u + m]));
        });
    }
    // the same scores offered to the rows' states as they come (state[i - r0]; the causal keys
    // j <= i of rows whose bound applies), without the tile of floats in between
    void tile_and_offer(TopkBruteRow* state, const int32_t* q32, size_t q_ld, const int32_t* offset,
                        const uint8_t* chunk0, int G, int r0, int r1, int j0, int j1) const {
        blocks(q32, q_ld, chunk0, G, r0, r1, j0, j1, [&](const int32_t* block, int u, int rows, int c) {
            const int first_key = j0 + c * kTopkInt8Lanes;
            for (int m = 0; m < rows; m++) {
                TopkBruteRow& row = state[u + m];
                const int i = r0 + u + m, count = std::min(16, i + 1 - first_key);
                if (!row.fast_ok || count <= 0) continue;
                row.append16(block_row(block, m, offset[u + m]), (__mmask16)((1u << count) - 1), first_key);
                if (row.n_kept >= row.cap) row.prune();
            }
        });
    }
};
#endif

// The int8 first pass of causal_topk_brute_fast (topk_brute.h): the heads' key panels and
// scales at construction, the block's quantised queries per thread. Queries and keys are
// padded with zeros to HSP bytes: a multiple of 4, or of 64 for the AMX tiles. Each head's
// panel has one chunk more than its keys need (zeros: the AMX tiles read chunks in pairs).
struct TopkInt8Pass {
    const float* qkv;
    TopkInt8Kernel kernel;
    int T, C, NH, HS, HSP, G, chunks;
    std::vector<uint8_t> panels;   // (B, NH, chunks, G, 16, 4)
    std::vector<double> key_scale;  // (B, NH): s_k
    std::vector<double> ekn_max;    // (B, NH, T): max_{j' <= j} ||e_k_j'||, rounded up (a NaN sticks)
    const double* kn_max;           // (B, NH, T): max_{j' <= j} ||k_j'|| (topk_brute.h)

    TopkInt8Pass(const float* qkv_, int B, int T_, int C_, int NH_, const float* keys, const double* kn_max_,
                 TopkInt8Kernel kernel_ = topk_int8_kernel())
        : qkv(qkv_), kernel(kernel_), T(T_), C(C_), NH(NH_), HS(C_ / NH_),
          HSP(kernel == TopkInt8Kernel::Amx ? (C_ / NH_ + 63) / 64 * 64 : topk_int8_hs4(C_ / NH_)), G(HSP / 4),
          chunks(topk_int8_num_chunks(T_) + 1), panels((size_t)B * NH * chunks * G * 64), key_scale((size_t)B * NH),
          ekn_max((size_t)B * NH * T), kn_max(kn_max_) {
        #pragma omp parallel for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            const float* k_head = keys + (size_t)bh * T * HS;  // (T, HS)
            float largest = 0.0f;
            for (size_t u = 0; u < (size_t)T * HS; u++)
                if (std::isfinite(k_head[u])) largest = std::max(largest, std::fabs(k_head[u]));
            const double s = key_scale[bh] = topk_int8_scale(largest);
            uint8_t* panel = panels.data() + (size_t)bh * chunks * G * 64;
            double* em = ekn_max.data() + (size_t)bh * T;
            double run = 0.0;
            std::vector<int8_t> bytes((size_t)HSP, 0);  // a key's quantised dims, zeros past HS
            for (int j = 0; j < chunks * kTopkInt8Lanes; j++) {
                const int c = j / kTopkInt8Lanes, l = j % kTopkInt8Lanes;
                double e = 0.0;  // NaN or inf for a non-finite key
                if (j < T) e = topk_int8_quantise_row(bytes.data(), k_head + (size_t)j * HS, HS, s);
                else std::fill(bytes.begin(), bytes.end(), 0);
                for (int d = 0; d < HSP; d++) panel[((size_t)c * G + d / 4) * 64 + 4 * l + d % 4] = (uint8_t)(128 + bytes[d]);
                if (j >= T) continue;
                if (!(e <= run) && !std::isnan(run)) run = e;
                em[j] = run;
            }
        }
    }

    struct Rows {
        const TopkInt8Pass& p;
        // the block's quantised queries (rows, G) and offsets, with room for 32 rows past its
        // last (the AMX tiles read whole pairs of 16-row groups; the extra rows are not stored)
        std::vector<int32_t> q32, offset;
        std::vector<TopkBruteMargin> margins;
        int bh = 0, i_first = 0;
#if KNNGPT_TOPK_INT8_AMX
        std::unique_ptr<TopkInt8AmxTiles> amx;
#endif
        explicit Rows(const TopkInt8Pass& pass)
            : p(pass), q32((size_t)(kTopkBruteQueryBlock + 32) * pass.G), offset(kTopkBruteQueryBlock + 32),
              margins(kTopkBruteQueryBlock) {
#if KNNGPT_TOPK_INT8_AMX
            if (p.kernel == TopkInt8Kernel::Amx) amx = std::make_unique<TopkInt8AmxTiles>(p.HSP);
#endif
        }

        void begin(int b, int h, int i_search, int i1) {
            bh = b * p.NH + h;
            i_first = i_search;
            const double s_k = p.key_scale[bh];
            const double* kn = p.kn_max + (size_t)bh * p.T;
            const double* en = p.ekn_max.data() + (size_t)bh * p.T;
            const double nu = p.HS * 0x1p-24, gamma = nu / (1.0 - nu);
            for (int i = i_search; i < i1; i++) {
                const int u = i - i_search;
                const float* q = p.qkv + ((size_t)b * p.T + i) * 3 * p.C + (size_t)h * p.HS;
                float largest = 0.0f;
                bool finite = true;
                for (int d = 0; d < p.HS; d++) {
                    finite = finite && std::isfinite(q[d]);
                    largest = std::max(largest, std::fabs(q[d]));
                }
                const double s_q = topk_int8_scale(finite ? largest : 0.0f);
                int8_t* bytes = reinterpret_cast<int8_t*>(q32.data() + (size_t)u * p.G);
                const double eq_row = topk_int8_quantise_row(bytes, q, p.HS, s_q);
                int32_t sum = 0;
                for (int d = p.HS; d < p.HSP; d++) bytes[d] = 0;
                for (int d = 0; d < p.HSP; d++) sum += bytes[d];
                offset[u] = 128 * sum;
                // Delta_i in f's units (header), or fast_ok false where brute's own bound
                // would not apply (non-finite or overflowing ||q|| K) or a term is not finite
                const double qn = topk_norm_up(q, p.HS), K = kn[i], E = en[i];
                const double eq = finite ? eq_row : INFINITY;
                const double real = eq * K + (qn + eq) * E + gamma * qn * K + 0x1p-100;
                const double delta = real / (s_q * s_k) * (1.0 + 0x1p-20);
                TopkBruteMargin m = topk_brute_margin(qn, K, p.HS);
                m.delta = delta;
                m.fast_ok = m.fast_ok && finite && std::isfinite(delta) && p.HS <= kTopkInt8MaxHS;
                margins[u] = m;
            }
        }
        TopkBruteMargin margin(int i) const { return margins[i - i_first]; }
        void tile_and_offer(TopkBruteRow* state, float* fast, int ld, int r0, int i1, int j0, int j1) const {
#if KNNGPT_TOPK_INT8_AMX
            if (amx) {
                const int u0 = r0 - i_first;
                const uint8_t* chunk0 = p.panels.data() + ((size_t)bh * p.chunks + j0 / kTopkInt8Lanes) * p.G * 64;
                return amx->tile_and_offer(state, q32.data() + (size_t)u0 * p.G, p.G, offset.data() + u0, chunk0, p.G,
                                           r0, i1, j0, j1);
            }
#endif
            tile(fast, ld, r0, i1, j0, j1);
            topk_offer_tile(state, fast, ld, r0, i1, j0, j1);
        }
        void tile(float* fast, int ld, int r0, int i1, int j0, int j1) const {
            const uint8_t* chunk0 = p.panels.data() + ((size_t)bh * p.chunks + j0 / kTopkInt8Lanes) * p.G * 64;
            const int u0 = r0 - i_first;
#if KNNGPT_TOPK_INT8_AMX
            if (amx) return amx->tile(fast, ld, q32.data() + (size_t)u0 * p.G, p.G, offset.data() + u0, chunk0, p.G, r0, i1,
                                      j0, j1);
#endif
            if (p.kernel == TopkInt8Kernel::Plain)
                return topk_int8_tile<true>(fast, ld, q32.data() + (size_t)u0 * p.G, p.G, offset.data() + u0, chunk0, p.G,
                                            r0, i1, j0, j1);
            topk_int8_tile(fast, ld, q32.data() + (size_t)u0 * p.G, p.G, offset.data() + u0, chunk0, p.G, r0, i1, j0,
                           j1);
        }
    };
};

// The exact causal top-k with the int8 first pass and the chosen kernel:
// causal_topk_brute_reference's lists.
inline void causal_topk_int8(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                             TopkStats* stats = nullptr) {
    causal_topk_brute_fast<TopkInt8Pass>(idx, qkv, B, T, C, NH, k, stats);
}

// Whether brute's search takes the int8 first pass for sequences of T keys: where AMX or
// AVX-512 VNNI computes it and T >= kTopkInt8MinKeys. Below that threshold, and with the
// plain loop at any T, the sgemm pass is as fast or faster (bench_attention).
constexpr int kTopkInt8MinKeys = 2048;
inline bool topk_int8_pays(int T) { return topk_int8_kernel() != TopkInt8Kernel::Plain && T >= kTopkInt8MinKeys; }

}  // namespace knngpt::cpu
