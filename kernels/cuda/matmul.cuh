// kernels/cuda/matmul.cuh — fully connected layer, fp32 or bf16 GEMMs. Twin of
// kernels/cpu/matmul.h.
//
//   forward:  out = inp @ weight^T + bias            out[n,o] = sum_c inp[n,c] weight[o,c] + bias[o]
//   forward_gelu: pre_gelu = inp @ weight^T + bias,  out_gelu = gelu(pre_gelu)   (gelu.cuh's tanh form)
//   backward: dinp     = dout @ weight               (N, C)
//             dweight += dout^T @ inp                (OC, C)
//             dbias   += sum_n dout[n, :]            (OC)
//
// Shapes: inp (N, C), weight (OC, C), bias (OC) or nullptr, out/dout (N, OC).
// The backward reads the forward's input inp; nothing else is saved. It overwrites
// dinp (its GEMM runs with beta = 0 and does not read it, so the caller need not
// zero it first) and accumulates (+=) into the parameter gradients dweight and
// dbias; dbias may be nullptr. Device pointers, all fp32.
//
// Design: the GEMMs go to a library (cuBLASLt under nvcc, cblas_sgemm under the
// emulator). In the default BF16 precision every operand is rounded to bf16 and the
// products accumulate in fp32; weights and registered activations are read from
// their bf16 copies, which hold the very values a conversion would give. The bias
// add and GELU run in the library's epilogue where it offers one, and dbias is our
// own two-pass sum, so every result is the same bits on every run. The sections
// below hold the details: precision and its error, the library and its scratch,
// the column-major layout, epilogues, plans, dbias.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/bf16_activations.cuh"
#include "kernels/cuda/bf16_parameters.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"

#if defined(KNNGPT_CUDA_EMU)
#include "kernels/cpu/sgemm_blocks.h"
#else
#include <cublasLt.h>
#endif

namespace knngpt::cuda {

constexpr int kMatmulBiasThreads = 256;
constexpr int kMatmulDbiasStripes = 16;                      // threadIdx.y of the dbias partial-sum kernel
constexpr int kMatmulDbiasChunkRows = 256;                   // rows of dout per dbias partial sum
constexpr size_t kMatmulPlanCapacity = 64;                   // cached GEMM plans before the cache is emptied
constexpr size_t kMatmulWorkspaceBytes = 32u * 1024 * 1024;  // cuBLASLt workspace

// ---- precision ----------------------------------------------------------------

// Precision. matmul_precision() selects, at run time, how the GEMMs run:
//   FP32  fp32 operands, fp32 accumulation;
//   BF16  each GEMM operand is first rounded to bf16 (round to nearest even,
//         as __float2bfloat16 does): inp and weight in forward, dout and
//         weight for dinp, inp and dout for dweight. The products accumulate
//         in fp32 and the outputs stay fp32 (out, and dinp/dweight += ...);
//         the bias add and dbias (a sum of the fp32 dout) are fp32 in both
//         modes. The signatures are the same in both modes: the rounding
//         happens inside, by convert_to_bf16 (bf16_parameters.cuh) into a scratch buffer.
//         A weight that is a registered parameter is read from the bf16
//         copy of the parameters (bf16_parameters.cuh, kept by AdamW), an
//         input that is a registered activation from its bf16 copy
//         (bf16_activations.cuh, written by the op that wrote it); any other
//         operand (the gradients dout) is converted on every call. A copy
//         holds the very values the conversion would give, so where an
//         operand comes from changes no bit; matmul_operand_stats() counts it.
// The default is the build's: BF16, or FP32 in a build with -DKNNGPT_FP32.
// Tests set matmul_precision() at run time to test both modes.
//
// Error of BF16 mode. bf16 keeps 8 significant bits, so each rounded operand
// carries a relative error <= 2^-8 (half a unit in its last place), each product
// a_k b_k of two rounded operands <= ~2^-7 (2^-8 + 2^-8 + 2^-16), and a sum over k
//   |bf16 result - fp32 result| <= ~2^-7 sum_k |a_k b_k|  + fp32 accumulation error.
// A product of two bf16 values (8 + 8 significant bits) is exact in fp32, so
// the only rounding after the conversion is that of the fp32 accumulation.

enum class MatmulPrecision { FP32, BF16 };

// The precision of every matmul_forward/matmul_backward call from now on (see
// "Precision" above). Starts as the build's default: BF16, FP32 with
// -DKNNGPT_FP32. Tests assign it, e.g. matmul_precision() = MatmulPrecision::FP32.
inline MatmulPrecision& matmul_precision() {
#if defined(KNNGPT_FP32)
    static MatmulPrecision precision = MatmulPrecision::FP32;
#else
    static MatmulPrecision precision = MatmulPrecision::BF16;
#endif
    return precision;
}

// Epilogues. cuBLASLt can add the bias (CUBLASLT_EPILOGUE_BIAS) and apply
// GELU while storing its input (CUBLASLT_EPILOGUE_GELU_AUX_BIAS) as it writes
// the product, saving our separate passes over the (N, OC) output.
// matmul_fusion() chooses how much is handed to it: by default bias and GELU
// on sm_90+ GPUs, the bias alone on older ones and in the fp32 build. Where the library offers no
// algorithm for an epilogue (the GELU input's leading dimension must be a
// multiple of 8), the GEMM runs plain and our bias and GELU kernels follow.
// Under the emulator the library's epilogue is emulated on the host (fp32,
// gelu_tanh of gelu.cuh), so both paths are tested against the CPU twin.
//
// What the GEMM library's epilogue does for us (see "Epilogues" above):
//   None      nothing: the bias add and GELU are our own kernels
//   Bias      the bias add (matmul_forward, and the GEMM of matmul_forward_gelu)
//   BiasGelu  the bias add, and GELU with its input stored (matmul_forward_gelu)
enum class MatmulFusion { None, Bias, BiasGelu };

// Starts as BiasGelu on an sm_90 or newer GPU and under the emulator, Bias on
// older GPUs (where the fused GELU epilogue has not paid in other trainers),
// and Bias in the fp32 build (-DKNNGPT_FP32) everywhere: cuBLASLt's GELU is
// its own tanh evaluation, not gelu.cuh's (test_cuda_matmul bounds the
// difference by 2^-11 |x|), and the fp32 build is the one held to the CPU
// trainer's losses within 1e-5. Tests assign it to cover every path.
inline MatmulFusion& matmul_fusion() {
    static MatmulFusion fusion = [] {
#if defined(KNNGPT_FP32)
        return MatmulFusion::Bias;
#elif defined(KNNGPT_CUDA_EMU)
        return MatmulFusion::BiasGelu;
#else
        int device = 0;
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        return prop.major >= 9 ? MatmulFusion::BiasGelu : MatmulFusion::Bias;
#endif
    }();
    return fusion;
}

// ---- CUDA kernels -------------------------------------------------------------

// out[n, o] += bias[o], one thread per element.
__global__ void matmul_bias_add_kernel(float* out, const float* bias, int N, int OC) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * OC) return;
    out[i] += bias[i % (size_t)OC];
}

// dbias, two passes, deterministic (no atomics; the chunking depends on N
// only, so the bits are the same on every run and every device):
//   1. partial[chunk, o] = sum over the chunk's kMatmulDbiasChunkRows rows:
//      grid ceil(OC/32) x ceil(N/256) blocks of (32, 16) threads, each thread
//      a stripe of 16 rows of one column, a fixed shared-memory tree per block;
//   2. dbias[o] += partial[0, o] + partial[1, o] + ... in chunk order: one
//      thread per column.
// Pass 1 reads dout once, N·OC·4 bytes, and writes N·OC/64 bytes; pass 2 reads
// those back.
//
// dbias, pass 1: partial[chunk, o] = sum of dout[n, o] over the rows n of
// chunk (rows chunk * kMatmulDbiasChunkRows onwards, at most that many).
// Grid (ceil(OC/32), chunks), block (32, kMatmulDbiasStripes): threadIdx.x
// picks column o of tile blockIdx.x (a warp reads 32 adjacent floats of a
// row), threadIdx.y a stripe of the chunk's rows; a shared-memory tree in a
// fixed order finishes the block's column.
template <class Dout>
__global__ void matmul_dbias_partial_kernel(float* partial, const Dout* dout, int N, int OC) {
    __shared__ float stripe_sum[kMatmulDbiasStripes][32];
    const int o = blockIdx.x * 32 + threadIdx.x;
    const int chunk = blockIdx.y;
    const int row_end = min(N, (chunk + 1) * kMatmulDbiasChunkRows);
    float sum = 0.0f;
    if (o < OC) {
        for (int n = chunk * kMatmulDbiasChunkRows + threadIdx.y; n < row_end; n += kMatmulDbiasStripes)
            sum += (float)dout[(size_t)n * OC + o];
    }
    stripe_sum[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    for (int stride = kMatmulDbiasStripes / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.y < stride) stripe_sum[threadIdx.y][threadIdx.x] += stripe_sum[threadIdx.y + stride][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && o < OC) partial[(size_t)chunk * OC + o] = stripe_sum[0][threadIdx.x];
}

// dbias, pass 2 is add_chunk_sums (common.cuh).

// ---- column-major GEMM --------------------------------------------------------

// The GEMMs go to a library: cuBLASLt under nvcc (one handle and workspace
// created on first use, see "Plans"; FP32: A, B, C fp32; BF16: A, B CUDA_R_16BF,
// C/D CUDA_R_32F; both with CUBLAS_COMPUTE_32F and fp32 alpha/beta),
// OpenBLAS sgemm under KNNGPT_CUDA_EMU (the emulator's device memory is host
// memory; in BF16 mode the bf16 operands are widened back to float on the
// host, which is exact, and sgemm runs on those). The bf16 conversion, the
// bias add and the dbias column sums are our own small kernels in both
// builds.
//
// Scratch. The bf16 operands live in two buffers owned by this file (one per
// GEMM operand slot), cudaMalloc'd on first use and grown (freed and
// allocated again) when a larger operand comes; they are never freed, like
// the dbias partial sums, and live for the process. Under the emulator the
// widened float copies are two static host vectors, freed at exit. The
// scratch is shared: call the matmuls from one host thread, on the default
// stream (as everything here does).
//
// Layout trick. Both libraries are called column-major. A row-major (R, K)
// array with leading dimension K is, read column-major, its transpose: a
// (K, R) matrix with ld = K. So each row-major product Y = P @ Q is computed as
// the column-major product Y^T = Q^T @ P^T, with the operands swapped and no
// data moved:
//   out^T  (OC, N) = weight   (OC, C) . inp^T  (C, N)   A = weight stored (C, OC): op T;  B = inp stored (C, N): op N
//   dinp^T (C, N) += weight^T (C, OC) . dout^T (OC, N)  A = weight stored (C, OC): op N;  B = dout stored (OC, N): op N
//   dweight^T (C, OC) += inp^T (C, N) . dout  (N, OC)   A = inp stored (C, N): op N;      B = dout stored (OC, N): op T

namespace detail {

#if !defined(KNNGPT_CUDA_EMU)
inline void check_cublas(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    std::fprintf(stderr, "%s:%d: cuBLAS error: %d\n", file, line, (int)status);
    std::exit(1);
}
#define KNNGPT_CUBLAS_CHECK(call) ::knngpt::cuda::detail::check_cublas((call), __FILE__, __LINE__)
#endif

// The largest power of two (up to 256) dividing the address: the alignment the
// library may assume for an operand.
inline uint32_t pointer_alignment(const void* p) {
    uint32_t alignment = 256;
    while (alignment > 1 && (uintptr_t)p % alignment != 0) alignment /= 2;
    return alignment;
}

// A bf16 scratch buffer of this file, one per GEMM operand slot (0 or 1),
// grown on demand and never freed (see "Scratch" above).
inline __nv_bfloat16* bf16_scratch(int slot, size_t count) {
    static DeviceScratch scratch[2];
    return static_cast<__nv_bfloat16*>(scratch[slot].get(count * sizeof(__nv_bfloat16)));
}

// The count floats at x rounded to bf16, in scratch slot `slot`.
inline const __nv_bfloat16* to_bf16(int slot, const float* x, size_t count) {
    __nv_bfloat16* out = bf16_scratch(slot, count);
    convert_to_bf16(out, x, count);
    return out;
}

// Where the bf16 GEMM operands came from since the start (or matmul_release()).
struct MatmulOperandStats {
    size_t parameter_copies = 0;   // a weight read from the parameters' bf16 copy
    size_t activation_copies = 0;  // an input read from its activation's bf16 copy
    size_t converted = 0;          // anything else, converted into a scratch slot
};

inline MatmulOperandStats& matmul_operand_counts() {
    static MatmulOperandStats stats;
    return stats;
}

// The count floats at x as a bf16 GEMM operand: the parameters' bf16 copy when x
// is a registered parameter (bf16_parameters.cuh), its activation's copy when it
// is a registered activation (bf16_activations.cuh), else converted into slot
// `slot`: the same values in all three cases.
inline const __nv_bfloat16* bf16_operand(int slot, const float* x, size_t count) {
    MatmulOperandStats& stats = matmul_operand_counts();
    if (const __nv_bfloat16* copy = bf16_copy_of(x, count)) {
        stats.parameter_copies++;
        return copy;
    }
    if (const __nv_bfloat16* copy = activation_copy_of(x, count)) {
        stats.activation_copies++;
        return copy;
    }
    stats.converted++;
    return to_bf16(slot, x, count);
}

#if defined(KNNGPT_CUDA_EMU)
// The bf16 array x (count values) widened to float, exactly, in a host vector
// of this file (one per slot): the emulated library's view of a bf16 operand.
inline const float* widen_bf16(int slot, const void* x, size_t count) {
    static std::vector<float> widened[2];
    const __nv_bfloat16* h = static_cast<const __nv_bfloat16*>(x);
    widened[slot].resize(count);
    for (size_t i = 0; i < count; i++) widened[slot][i] = __bfloat162float(h[i]);
    return widened[slot].data();
}
#endif

// What the library applies to the product before storing it in C (beta = 0 only):
//   x = (A B)[i, j] + bias[i]              bias: (m) or nullptr
//   gelu_input[i + j ldc] = x, C = gelu(x)  when gelu_input is set (same layout as C)
struct GemmEpilogue {
    const float* bias = nullptr;
    float* gelu_input = nullptr;
    bool empty() const { return bias == nullptr && gelu_input == nullptr; }
};

// ---- GEMM plans -----------------------------------------------------------------
//
// Plans. Each GEMM's cuBLASLt descriptors (matmul descriptor, three layouts)
// and the algorithm the heuristic chose are built once per key and cached
// (GemmKey, below), so a training step makes no heuristic query after the
// first. The same key runs the same algorithm, so a cached plan gives the bits
// a fresh one would. At most kMatmulPlanCapacity plans are held; a miss on a
// full cache empties it (counted in matmul_plan_stats()). matmul_release()
// frees the plans, the handle and the workspace, as does the exit. Under the
// emulator the plans are the emulated library's descriptors (the key itself,
// which the emulated GEMM runs), so keys and counters are tested there too.
// Not thread-safe: a lookup may build a plan, and each call sets the bias and
// GELU-input pointers on the cached descriptor, so the matmuls are called
// from one host thread, as the scratch already requires.
//
// A plan is what a GEMM needs from the library before it can run: under nvcc
// the matmul descriptor (ops, epilogue kind, the GELU input's leading
// dimension), the three matrix layouts, and the algorithm the heuristic chose
// for them under our preference (workspace size, operand alignments; the
// preference is only the heuristic's input, destroyed once it has answered).
// Building one costs ~10 library calls and a heuristic query, so each is built
// once per GemmKey and kept in a cache (see "Plans" above). The answer "no
// algorithm for this epilogue" is cached too.
//
// The key holds everything that determines the descriptors and the answer:
// precision (the operand type), both ops, m, n, k, the three leading
// dimensions, the epilogue kind, the alignment of every pointer (A, B, C, the
// bias, the GELU input: the preference's minimum alignments, and the
// epilogue's pointers'), the workspace size and the device. Pointer values
// are not in it: the bias and GELU-input pointers are set on the cached
// descriptor before each call, so every layer's GEMM of one shape shares one plan.

enum class GemmEpilogueKind : uint8_t { None, Bias, GeluAux, GeluAuxBias };

inline GemmEpilogueKind epilogue_kind(const GemmEpilogue& epilogue) {
    if (epilogue.gelu_input) return epilogue.bias ? GemmEpilogueKind::GeluAuxBias : GemmEpilogueKind::GeluAux;
    return epilogue.bias ? GemmEpilogueKind::Bias : GemmEpilogueKind::None;
}

struct GemmKey {
    MatmulPrecision precision = MatmulPrecision::FP32;
    bool trans_a = false, trans_b = false;
    int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    GemmEpilogueKind epilogue = GemmEpilogueKind::None;
    uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0, align_gelu_input = 0;  // 0: no such pointer
    bool c_bf16 = false;  // C (and D) bf16 instead of fp32 (BF16 precision, no epilogue)
    uint64_t workspace_bytes = 0;
    int device = 0;

    bool operator==(const GemmKey& o) const {
        return precision == o.precision && trans_a == o.trans_a && trans_b == o.trans_b && m == o.m && n == o.n &&
               k == o.k && lda == o.lda && ldb == o.ldb && ldc == o.ldc && epilogue == o.epilogue &&
               align_a == o.align_a && align_b == o.align_b && align_c == o.align_c && align_bias == o.align_bias &&
               align_gelu_input == o.align_gelu_input && c_bf16 == o.c_bf16 && workspace_bytes == o.workspace_bytes &&
               device == o.device;
    }
};

struct GemmKeyHash {
    size_t operator()(const GemmKey& key) const {
        uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
        auto mix = [&h](uint64_t value) { h = (h ^ value) * 1099511628211ull; };
        mix((uint64_t)key.precision);
        mix((uint64_t)key.c_bf16);
        mix((uint64_t)key.trans_a << 1 | (uint64_t)key.trans_b);
        for (int v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix((uint32_t)v);
        mix((uint64_t)key.epilogue);
        for (uint32_t v : {key.align_a, key.align_b, key.align_c, key.align_bias, key.align_gelu_input}) mix(v);
        mix(key.workspace_bytes);
        mix((uint32_t)key.device);
        return (size_t)h;
    }
};

inline GemmKey gemm_key(MatmulPrecision precision, bool trans_a, bool trans_b, int m, int n, int k, const void* A,
                        int lda, const void* B, int ldb, const void* C, int ldc, const GemmEpilogue& epilogue,
                        bool c_bf16) {
    GemmKey key;
    key.precision = precision;
    key.trans_a = trans_a;
    key.trans_b = trans_b;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.epilogue = epilogue_kind(epilogue);
    key.align_a = pointer_alignment(A);
    key.align_b = pointer_alignment(B);
    key.align_c = pointer_alignment(C);
    key.align_bias = epilogue.bias ? pointer_alignment(epilogue.bias) : 0;
    key.align_gelu_input = epilogue.gelu_input ? pointer_alignment(epilogue.gelu_input) : 0;
    key.c_bf16 = c_bf16;
    key.workspace_bytes = kMatmulWorkspaceBytes;
    CUDA_CHECK(cudaGetDevice(&key.device));
    return key;
}

struct GemmPlan {
    bool has_algorithm = false;  // false: the library offers none for this epilogue
#if defined(KNNGPT_CUDA_EMU)
    // The emulated library's descriptors: it runs the GEMM the plan
    // describes, not the call's arguments, as cuBLASLt runs its descriptors
    // (so a plan found under the wrong key gives a wrong result, not a right one).
    GemmKey described;
#else
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
    cublasLtMatmulAlgo_t algo = {};
#endif
};

// How the plan cache has been used since the start (or matmul_release()).
struct MatmulPlanStats {
    size_t hits = 0;       // GEMMs that found their plan
    size_t misses = 0;     // plans built
    size_t evictions = 0;  // times the cache was full and emptied
    size_t size = 0;       // plans held now
};

// The library state of this file: under nvcc the cuBLASLt handle and
// workspace, created on first use; the plans, in both builds. Freed by
// matmul_release() and at exit (the destructor runs before the CUDA
// runtime's own teardown, which registers first; it ignores errors, as a
// destructor must not exit).
struct MatmulLibrary {
#if !defined(KNNGPT_CUDA_EMU)
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
#endif
    std::unordered_map<GemmKey, GemmPlan, GemmKeyHash> plans;
    MatmulPlanStats stats;

    ~MatmulLibrary() { release(); }

    void release_plans() {
#if !defined(KNNGPT_CUDA_EMU)
        for (auto& entry : plans) {
            GemmPlan& plan = entry.second;
            if (plan.layout_c) cublasLtMatrixLayoutDestroy(plan.layout_c);
            if (plan.layout_b) cublasLtMatrixLayoutDestroy(plan.layout_b);
            if (plan.layout_a) cublasLtMatrixLayoutDestroy(plan.layout_a);
            if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
        }
#endif
        plans.clear();
    }

    void release() {
        release_plans();
#if !defined(KNNGPT_CUDA_EMU)
        if (workspace) cudaFree(workspace);
        if (handle) cublasLtDestroy(handle);
        workspace = nullptr;
        handle = nullptr;
#endif
        stats = MatmulPlanStats{};
        matmul_operand_counts() = MatmulOperandStats{};
    }
};

inline MatmulLibrary& matmul_library() {
    static MatmulLibrary library;
    return library;
}

#if defined(KNNGPT_CUDA_EMU)
// The emulated library has an algorithm for every GEMM and epilogue.
inline GemmPlan build_gemm_plan(MatmulLibrary&, const GemmKey& key) {
    GemmPlan plan;
    plan.has_algorithm = true;
    plan.described = key;
    return plan;
}
#else
inline GemmPlan build_gemm_plan(MatmulLibrary& library, const GemmKey& key) {
    if (library.handle == nullptr) {
        KNNGPT_CUBLAS_CHECK(cublasLtCreate(&library.handle));
        CUDA_CHECK(cudaMalloc(&library.workspace, kMatmulWorkspaceBytes));
    }
    GemmPlan plan;
    const cudaDataType_t ab_type = key.precision == MatmulPrecision::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (key.epilogue != GemmEpilogueKind::None) {
        // bias and GELU input in fp32, the type of D (the library's default);
        // their pointers are set before each call (run_gemm_plan)
        cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_BIAS;
        if (key.epilogue == GemmEpilogueKind::GeluAux) kind = CUBLASLT_EPILOGUE_GELU_AUX;
        if (key.epilogue == GemmEpilogueKind::GeluAuxBias) kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        KNNGPT_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof(kind)));
        if (key.align_gelu_input != 0) {
            const int64_t aux_ld = key.ldc;  // the library needs a multiple of 8, else it offers no algorithm
            KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                               &aux_ld, sizeof(aux_ld)));
        }
    }
    // layouts describe the stored arrays, before op()
    const int m = key.m, n = key.n, k = key.k;
    KNNGPT_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&plan.layout_a, ab_type, key.trans_a ? k : m, key.trans_a ? m : k, key.lda));
    KNNGPT_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&plan.layout_b, ab_type, key.trans_b ? n : k, key.trans_b ? k : n, key.ldb));
    KNNGPT_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&plan.layout_c, key.c_bf16 ? CUDA_R_16BF : CUDA_R_32F, m, n, key.ldc));
    cublasLtMatmulPreference_t preference = nullptr;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace_bytes = key.workspace_bytes;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes, sizeof(workspace_bytes)));
    // the library assumes 256-byte aligned operands unless told otherwise; ours
    // are offsets into larger buffers, so tell it what they really are
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                             &key.align_a, sizeof(key.align_a)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                             &key.align_b, sizeof(key.align_b)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                             &key.align_c, sizeof(key.align_c)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                             &key.align_c, sizeof(key.align_c)));
    cublasLtMatmulHeuristicResult_t heuristic = {};
    int returned = 0;
    const cublasStatus_t found =
        cublasLtMatmulAlgoGetHeuristic(library.handle, plan.desc, plan.layout_a, plan.layout_b, plan.layout_c,
                                       plan.layout_c, preference, 1, &heuristic, &returned);
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    // with an epilogue "not supported" (a status or no result) means: run it without
    if (key.epilogue != GemmEpilogueKind::None && (found != CUBLAS_STATUS_SUCCESS || returned == 0)) {
        plan.has_algorithm = false;
        return plan;  // its descriptors are kept (and freed) with it
    }
    KNNGPT_CUBLAS_CHECK(found);
    if (returned == 0) {
        std::fprintf(stderr, "%s:%d: cuBLASLt: no %s algorithm for m=%d n=%d k=%d\n", __FILE__, __LINE__,
                     key.precision == MatmulPrecision::BF16 ? "bf16" : "fp32", m, n, k);
        std::exit(1);
    }
    plan.has_algorithm = true;
    plan.algo = heuristic.algo;
    return plan;
}
#endif

// The plan for key: the cached one, or a new one built and cached. When the
// cache holds kMatmulPlanCapacity plans it is emptied first (a model has a
// few dozen shapes, so this happens only when shapes keep changing).
inline const GemmPlan& gemm_plan(const GemmKey& key) {
    MatmulLibrary& library = matmul_library();
    auto found = library.plans.find(key);
    if (found != library.plans.end()) {
        library.stats.hits++;
        return found->second;
    }
    if (library.plans.size() >= kMatmulPlanCapacity) {
        library.release_plans();
        library.stats.evictions++;
    }
    library.stats.misses++;
    const GemmPlan& plan = library.plans.emplace(key, build_gemm_plan(library, key)).first->second;
    library.stats.size = library.plans.size();
    return plan;
}

// C = op(A) op(B) + beta C and the epilogue, as the plan describes them, on
// this call's pointers (alpha = 1).
inline void run_gemm_plan(const GemmPlan& plan, const void* A, const void* B, float beta, void* C_out,
                          const GemmEpilogue& epilogue) {
#if defined(KNNGPT_CUDA_EMU)
    const GemmKey& d = plan.described;
    // a bf16 C: the fp32 product in a host vector (beta = 0), rounded into C at the end, as the
    // library rounds its fp32 accumulators when it stores D
    static std::vector<float> product;
    if (d.c_bf16) product.assign((size_t)d.ldc * d.n, 0.0f);
    float* C = d.c_bf16 ? product.data() : static_cast<float*>(C_out);
    const float* a = static_cast<const float*>(A);
    const float* b = static_cast<const float*>(B);
    if (d.precision == MatmulPrecision::BF16) {
        // stored arrays: ld rows by (trans ? m : k) resp. (trans ? k : n) columns
        a = widen_bf16(0, A, (size_t)d.lda * (d.trans_a ? d.m : d.k));
        b = widen_bf16(1, B, (size_t)d.ldb * (d.trans_b ? d.k : d.n));
    }
    // column-major C(m, n) = op(A) op(B) is row-major C^T(n, m) = op(B)^T op(A)^T; in blocks
    // fixed by the shape, as the CPU matmul's, so no thread count changes its bits
    cpu::sgemm_in_blocks(d.trans_b, d.trans_a, d.n, d.m, d.k, b, d.ldb, a, d.lda, beta, C, d.ldc);
    // the emulated library's epilogue, elementwise in fp32 as cuBLASLt's
    const bool add_bias = d.epilogue == GemmEpilogueKind::Bias || d.epilogue == GemmEpilogueKind::GeluAuxBias;
    const bool gelu = d.epilogue == GemmEpilogueKind::GeluAux || d.epilogue == GemmEpilogueKind::GeluAuxBias;
    for (int j = 0; j < d.n && (add_bias || gelu); j++) {
        for (int i = 0; i < d.m; i++) {
            const size_t at = (size_t)j * d.ldc + i;
            float x = C[at] + (add_bias ? epilogue.bias[i] : 0.0f);
            if (gelu) {
                epilogue.gelu_input[at] = x;
                x = gelu_tanh(x);
            }
            C[at] = x;
        }
    }
    if (d.c_bf16) {
        __nv_bfloat16* out = static_cast<__nv_bfloat16*>(C_out);
        for (int j = 0; j < d.n; j++)
            for (int i = 0; i < d.m; i++) out[(size_t)j * d.ldc + i] = __float2bfloat16(C[(size_t)j * d.ldc + i]);
    }
#else
    const float alpha = 1.0f;
    void* C = C_out;
    MatmulLibrary& library = matmul_library();
    if (epilogue.bias) {
        KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &epilogue.bias, sizeof(epilogue.bias)));
    }
    if (epilogue.gelu_input) {
        KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                           &epilogue.gelu_input, sizeof(epilogue.gelu_input)));
    }
    KNNGPT_CUBLAS_CHECK(cublasLtMatmul(library.handle, plan.desc, &alpha, A, plan.layout_a, B, plan.layout_b, &beta,
                                       C, plan.layout_c, C, plan.layout_c, &plan.algo, library.workspace,
                                       kMatmulWorkspaceBytes, nullptr));
#endif
}

// C (m, n) = op(A) (m, k) . op(B) (k, n) + beta C, all column-major, alpha = 1,
// then the epilogue. A and B are float arrays (FP32) or __nv_bfloat16 arrays
// (BF16); C is float and the accumulation fp32 in both. beta = 0 does not read
// C (it may hold anything, NaN included). Returns false, having done nothing,
// when the library has no algorithm for the epilogue (the caller then runs the
// GEMM without it and our own kernels).
inline bool gemm_col_major(MatmulPrecision precision, bool trans_a, bool trans_b, int m, int n, int k, const void* A,
                           int lda, const void* B, int ldb, float beta, void* C, int ldc,
                           const GemmEpilogue& epilogue = GemmEpilogue{}, bool c_bf16 = false) {
    if (m == 0 || n == 0) return true;
    if (c_bf16 && (precision != MatmulPrecision::BF16 || beta != 0.0f || !epilogue.empty())) {
        std::fprintf(stderr, "%s:%d: matmul: a bf16 C needs bf16 operands, beta = 0 and no epilogue\n", __FILE__,
                     __LINE__);
        std::exit(1);
    }
    const size_t c_size = c_bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
    if (k == 0 && epilogue.empty()) {  // empty sum: C = beta C
        if (beta == 0.0f) {
            for (int j = 0; j < n; j++)
                CUDA_CHECK(cudaMemset(static_cast<char*>(C) + (size_t)j * ldc * c_size, 0, (size_t)m * c_size));
        }
        return true;
    }
    if (k == 0) return false;  // an empty product with an epilogue: our kernels do it
    if (!epilogue.empty() && beta != 0.0f) {
        std::fprintf(stderr, "%s:%d: matmul: an epilogue needs beta = 0\n", __FILE__, __LINE__);
        std::exit(1);
    }
    const GemmPlan& plan =
        gemm_plan(gemm_key(precision, trans_a, trans_b, m, n, k, A, lda, B, ldb, C, ldc, epilogue, c_bf16));
    if (!plan.has_algorithm) return false;
#if !defined(KNNGPT_CUDA_EMU)
    int timed = -1;  // KNNGPT_KERNEL_TIMES: the GEMM named by its shape (kernels/cuda/kernel_times.h)
    if (KernelTimes::enabled())
        timed = KernelTimes::get().begin(std::string("cublasLt gemm ") +
                                             (precision == MatmulPrecision::BF16 ? "bf16 " : "fp32 ") +
                                             (trans_a ? "T" : "N") + (trans_b ? "T" : "N") + " m" + std::to_string(m) +
                                             " n" + std::to_string(n) + " k" + std::to_string(k) +
                                             (epilogue.empty() ? "" : " +epilogue"),
                                         nullptr);
#endif
    run_gemm_plan(plan, A, B, beta, C, epilogue);
#if !defined(KNNGPT_CUDA_EMU)
    if (timed >= 0) KernelTimes::get().end(timed, nullptr);
#endif
    return true;
}

}  // namespace detail

// ---- host launchers -----------------------------------------------------------

// out = inp @ weight^T (+ bias); with gelu_out also gelu_out = gelu(out)
// (out then holds GELU's input). The bias add and GELU run in the GEMM's
// epilogue as far as matmul_fusion() allows and the library offers an
// algorithm, else as our own kernels: the same values either way (up to the
// library's rounding of GELU).
inline void matmul_forward_epilogue(float* out, float* gelu_out, const float* inp, const float* weight,
                                    const float* bias, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
    const MatmulPrecision precision = matmul_precision();
    const void* a = weight;  // the GEMM operands: the fp32 arrays, or their bf16 roundings
    const void* b = inp;
    if (precision == MatmulPrecision::BF16) {
        a = detail::bf16_operand(0, weight, (size_t)OC * C);
        b = detail::bf16_operand(1, inp, (size_t)N * C);
    }
    // out^T (OC, N) = weight (OC, C) . inp^T (C, N); with GELU fused the GEMM
    // writes gelu_out and stores its input in out
    const MatmulFusion fusion = matmul_fusion();
    detail::GemmEpilogue epilogue;
    if (fusion != MatmulFusion::None) epilogue.bias = bias;
    const bool fuse_gelu = gelu_out != nullptr && fusion == MatmulFusion::BiasGelu;
    if (fuse_gelu) epilogue.gelu_input = out;
    bool fused = !epilogue.empty() &&
                 detail::gemm_col_major(precision, true, false, OC, N, C, a, C, b, C, 0.0f, fuse_gelu ? gelu_out : out,
                                        OC, epilogue);
    if (fused && fuse_gelu) {
        refresh_activation_copy(gelu_out, (size_t)N * OC);  // the library's epilogue wrote fp32 only
        return;
    }
    if (!fused) {
        detail::gemm_col_major(precision, true, false, OC, N, C, a, C, b, C, 0.0f, out, OC);
        if (bias != nullptr) {
            const size_t total = (size_t)N * OC;
            launch(matmul_bias_add_kernel, (unsigned)ceil_div(total, (size_t)kMatmulBiasThreads), kMatmulBiasThreads,
                   0, nullptr, out, bias, N, OC);
        }
    }
    if (gelu_out != nullptr) gelu_forward(gelu_out, out, (size_t)N * OC);
}

inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                           int OC) {
    matmul_forward_epilogue(out, nullptr, inp, weight, bias, N, C, OC);
}

// out_gelu = gelu(inp @ weight^T + bias), pre_gelu = GELU's input; the MLP's
// first layer (shapes as matmul_forward, both outputs (N, OC)).
inline void matmul_forward_gelu(float* out_gelu, float* pre_gelu, const float* inp, const float* weight,
                                const float* bias, int N, int C, int OC) {
    matmul_forward_epilogue(pre_gelu, out_gelu, inp, weight, bias, N, C, OC);
}

// out = inp @ weight^T into a bf16 output (the bf16 build's logits: no bias). BF16 precision:
// the library stores its fp32 accumulators rounded to bf16 (round to nearest even), so out
// is the fp32 matmul_forward's result rounded, bit for bit under the emulator. FP32
// precision (tests): the library has no fp32-operand, bf16-output GEMM, so the fp32
// product goes through a scratch buffer and convert_to_bf16: the same rounding.
inline void matmul_forward(__nv_bfloat16* out, const float* inp, const float* weight, const float* bias, int N, int C,
                           int OC) {
    if (bias != nullptr) {
        std::fprintf(stderr, "%s:%d: matmul_forward: a bf16 output takes no bias\n", __FILE__, __LINE__);
        std::exit(1);
    }
    if (N == 0 || OC == 0) return;
    if (matmul_precision() == MatmulPrecision::BF16) {
        const void* a = detail::bf16_operand(0, weight, (size_t)OC * C);
        const void* b = detail::bf16_operand(1, inp, (size_t)N * C);
        detail::gemm_col_major(MatmulPrecision::BF16, true, false, OC, N, C, a, C, b, C, 0.0f, out, OC,
                               detail::GemmEpilogue{}, true);
        return;
    }
    static DeviceScratch product;  // (N, OC) floats, grown on demand, like the bf16 scratch
    float* fp32_out = static_cast<float*>(product.get((size_t)N * OC * sizeof(float)));
    matmul_forward(fp32_out, inp, weight, nullptr, N, C, OC);
    convert_to_bf16(out, fp32_out, (size_t)N * OC);
}

namespace detail {

// matmul_backward's two GEMMs, dout given as the GEMM operand of `precision` (fp32, or bf16)
inline void matmul_backward_gemms(MatmulPrecision precision, float* dinp, float* dweight, const void* dout_operand,
                                  const float* inp, const float* weight, int N, int C, int OC) {
    const bool bf16 = precision == MatmulPrecision::BF16;
    // slot 1 holds weight, then inp (the stream orders the second conversion after the first GEMM)
    const void* weight_operand = bf16 ? (const void*)bf16_operand(1, weight, (size_t)OC * C) : weight;
    // dinp^T (C, N) = weight^T (C, OC) . dout^T (OC, N)
    gemm_col_major(precision, false, false, C, N, OC, weight_operand, C, dout_operand, OC, 0.0f, dinp, C);
    const void* inp_operand = bf16 ? (const void*)bf16_operand(1, inp, (size_t)N * C) : inp;
    // dweight^T (C, OC) += inp^T (C, N) . dout (N, OC)
    gemm_col_major(precision, false, true, C, OC, N, inp_operand, C, dout_operand, OC, 1.0f, dweight, C);
}

// N == 0 or OC == 0: every sum is empty, so dinp = 0 and dweight, dbias stay; true then
inline bool matmul_backward_of_empty_sum(float* dinp, int N, int C, int OC) {
    if (N > 0 && OC > 0) return false;
    if (N > 0 && C > 0) CUDA_CHECK(cudaMemset(dinp, 0, (size_t)N * C * sizeof(float)));
    return true;
}

// dbias += sum_n dout[n, :] in two passes (see "dbias" above matmul_dbias_partial_kernel): chunk partial
// sums, then their fixed-order sum; dout fp32 or bf16 (widened, exactly)
template <class Dout>
inline void matmul_dbias(float* dbias, const Dout* dout, int N, int OC) {
    static DeviceScratch dbias_partial;  // (chunks, OC) floats, grown on demand, like the bf16 scratch
    const int chunks = ceil_div(N, kMatmulDbiasChunkRows);
    float* partial = static_cast<float*>(dbias_partial.get((size_t)chunks * OC * sizeof(float)));
    launch(matmul_dbias_partial_kernel<Dout>, dim3(ceil_div(OC, 32), chunks), dim3(32, kMatmulDbiasStripes), 0,
           nullptr, partial, dout, N, OC);
    add_chunk_sums(dbias, partial, chunks, OC);
}

}  // namespace detail

// dinp = dout @ weight (overwritten: the GEMM's beta is 0, dinp is not read);
// dweight += dout^T @ inp and dbias += sum_n dout[n, :] (accumulated).
inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int N, int C, int OC) {
    if (detail::matmul_backward_of_empty_sum(dinp, N, C, OC)) return;
    const MatmulPrecision precision = matmul_precision();
    // dout is an operand of both GEMMs: rounded once, in slot 0
    const void* dout_operand =
        precision == MatmulPrecision::BF16 ? (const void*)detail::bf16_operand(0, dout, (size_t)N * OC) : dout;
    detail::matmul_backward_gemms(precision, dinp, dweight, dout_operand, inp, weight, N, C, OC);
    if (dbias != nullptr) detail::matmul_dbias(dbias, dout, N, OC);
}

// The same with a bf16 dout (the bf16 build's dlogits): in BF16 precision dout is the GEMM
// operand as it is (the float version would round it to these very values), in FP32
// precision (tests) it is widened, exactly, first. dbias sums the widened values.
inline void matmul_backward(float* dinp, float* dweight, float* dbias, const __nv_bfloat16* dout, const float* inp,
                            const float* weight, int N, int C, int OC) {
    if (detail::matmul_backward_of_empty_sum(dinp, N, C, OC)) return;
    const MatmulPrecision precision = matmul_precision();
    const void* dout_operand = dout;
    if (precision == MatmulPrecision::FP32) {
        static DeviceScratch widened;  // (N, OC) floats, grown on demand
        float* w = static_cast<float*>(widened.get((size_t)N * OC * sizeof(float)));
        convert_from_bf16(w, dout, (size_t)N * OC);
        dout_operand = w;
    }
    detail::matmul_backward_gemms(precision, dinp, dweight, dout_operand, inp, weight, N, C, OC);
    if (dbias != nullptr) detail::matmul_dbias(dbias, dout, N, OC);
}

// How the GEMM plan cache has been used (hits, misses, evictions, plans held).
inline detail::MatmulPlanStats matmul_plan_stats() { return detail::matmul_library().stats; }

// Where the bf16 GEMM operands came from (parameter copy, activation copy, converted).
inline detail::MatmulOperandStats matmul_operand_stats() { return detail::matmul_operand_counts(); }

// Frees the cached GEMM plans and, under nvcc, the cuBLASLt handle and
// workspace, and zeroes both counters; the next matmul creates them again. At
// exit this happens by itself.
inline void matmul_release() { detail::matmul_library().release(); }

}  // namespace knngpt::cuda
