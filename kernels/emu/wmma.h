// kernels/emu/wmma.h — nvcuda::wmma for the emulator: bf16 16x16x16 tiles with
// fp32 accumulation.
//
// A fragment's layout across the lanes is opaque in CUDA, so here every lane
// simply holds the whole 16x16 tile, row-major (matrix_a: (m, k), matrix_b:
// (k, n), accumulator: (m, n)), whatever the memory layout it was loaded
// from. load_matrix_sync, store_matrix_sync and mma_sync are warp-collective:
// each is a warp round over all 32 lanes (a missing lane is a deadlock), after
// which every lane performs the operation on its own copy. Element-wise code
// over frag.x[0 .. num_elements) therefore works, provided it treats all
// elements alike, as portable wmma code must.
//
// mma_sync: d(m, n) = c(m, n) + sum over k = 0..15 of a(m, k) * b(k, n), in
// fp32 in that order; bf16 * bf16 products are exact in fp32.
#pragma once
#include <cstring>
#include <type_traits>

#include "kernels/emu/bf16.h"
#include "kernels/emu/fibers.h"

namespace knngpt::emu {

// The whole tile, row-major, in every lane.
template <typename T>
struct WmmaTile {
    using element_type = T;
    static constexpr int num_elements = 16 * 16;
    T x[num_elements];
};

template <typename T>
void load_tile(T* tile, const T* p, unsigned ldm, bool row_major) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) tile[r * 16 + c] = row_major ? p[r * ldm + c] : p[c * ldm + r];
}

inline void wmma_round(WarpOp op, const char* what, const char* file, int line) {
    warp_round(op, what, file, line, 0xFFFFFFFFu, 0);
}

}  // namespace knngpt::emu

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// Only the shapes specialised below exist; any other is an incomplete type.
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment;

template <typename Layout>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, Layout> : public knngpt::emu::WmmaTile<__nv_bfloat16> {
    static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                  "a matrix_a fragment is row_major or col_major");
};

template <typename Layout>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Layout> : public knngpt::emu::WmmaTile<__nv_bfloat16> {
    static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                  "a matrix_b fragment is row_major or col_major");
};

template <>
class fragment<accumulator, 16, 16, 16, float, void> : public knngpt::emu::WmmaTile<float> {};

template <typename Use, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p, unsigned ldm,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    knngpt::emu::wmma_round(knngpt::emu::WarpOp::wmma_load, "wmma::load_matrix_sync", file, line);
    knngpt::emu::load_tile(f.x, p, ldm, std::is_same_v<Layout, row_major>);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    knngpt::emu::wmma_round(knngpt::emu::WarpOp::wmma_load, "wmma::load_matrix_sync", file, line);
    knngpt::emu::load_tile(f.x, p, ldm, layout == mem_row_major);
}

// Every lane writes its own (identical) copy of the tile.
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    knngpt::emu::wmma_round(knngpt::emu::WarpOp::wmma_store, "wmma::store_matrix_sync", file, line);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

// Not collective in CUDA either: each lane fills its own fragment.
template <typename Use, int M, int N, int K, typename T, typename Layout, typename Value>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const Value& value) {
    const T v = T(value);
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

template <typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
    knngpt::emu::wmma_round(knngpt::emu::WarpOp::wmma_mma, "wmma::mma_sync", file, line);
    float a_tile[256], b_tile[256], d_tile[256];
    for (int i = 0; i < 256; i++) a_tile[i] = (float)a.x[i], b_tile[i] = (float)b.x[i];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float sum = c.x[m * 16 + n];
            for (int k = 0; k < 16; k++) sum += a_tile[m * 16 + k] * b_tile[k * 16 + n];
            d_tile[m * 16 + n] = sum;
        }
    std::memcpy(d.x, d_tile, sizeof d_tile);  // d may be c
}

}  // namespace nvcuda::wmma
