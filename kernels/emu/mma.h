// kernels/emu/mma.h — the register-level tensor-core instructions that
// kernels/cuda/mma.cuh wraps, for the emulator: mma.sync m16n8k16 with bf16
// operands and fp32 accumulation, and ldmatrix (.x1/.x2/.x4, with and without
// .trans). Unlike wmma's opaque fragments, these fix which lane holds which
// element (the PTX ISA's fragment layouts, below), so the lanes exchange
// registers: each call is one warp round (WarpCollective, fibers.h) in which
// the completing lane computes every lane's result from every lane's inputs.
//
// Layouts, lane = 4 g + t (g = lane / 4, t = lane % 4); a .b32 register holds
// two bf16, the lower 16 bits the element of the smaller column (or k) index:
//   A (16 x 16, row): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
//                     a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, col):  b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8):    c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
//   ldmatrix .x{1,2,4}: lanes 8 m .. 8 m + 7 give the addresses of rows 0..7 of
//     matrix m (eight bf16 each); register m of each lane receives
//     M_m[g][2t, 2t+1], or with .trans M_m[2t][g] (low) and M_m[2t+1][g] (high).
// D = C + A B is computed in fp32, k in order; bf16 products are exact in fp32.
// tests/test_cuda_mma.cpp checks these layouts against plain matrix products,
// here and, natively, on the GPU's own instructions.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/emu/bf16.h"
#include "kernels/emu/fibers.h"

namespace knngpt::emu {

inline float bf16_bits_to_float(uint32_t bits16) {
    const uint32_t bits = bits16 << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}
inline float low_bf16(uint32_t reg) { return bf16_bits_to_float(reg & 0xFFFFu); }
inline float high_bf16(uint32_t reg) { return bf16_bits_to_float(reg >> 16); }

struct MmaArgs {
    WarpCollective head;
    float* d;
    const uint32_t* a;
    const uint32_t* b;
    const float* c;
};

inline void mma_m16n8k16_complete(void* const lane_args[32]) {
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const MmaArgs& x = *static_cast<const MmaArgs*>(lane_args[lane]);
        const int g = lane / 4, t = lane % 4;
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int r = 0; r < 4; r++) {
            A[rows[r]][cols[r]] = low_bf16(x.a[r]);
            A[rows[r]][cols[r] + 1] = high_bf16(x.a[r]);
        }
        B[2 * t][g] = low_bf16(x.b[0]);
        B[2 * t + 1][g] = high_bf16(x.b[0]);
        B[2 * t + 8][g] = low_bf16(x.b[1]);
        B[2 * t + 9][g] = high_bf16(x.b[1]);
        C[g][2 * t] = x.c[0];
        C[g][2 * t + 1] = x.c[1];
        C[g + 8][2 * t] = x.c[2];
        C[g + 8][2 * t + 1] = x.c[3];
    }
    float D[16][8];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            float sum = C[m][n];
            for (int k = 0; k < 16; k++) sum += A[m][k] * B[k][n];
            D[m][n] = sum;
        }
    for (int lane = 0; lane < 32; lane++) {  // d may be c: every input is read above
        float* d = static_cast<MmaArgs*>(lane_args[lane])->d;
        const int g = lane / 4, t = lane % 4;
        d[0] = D[g][2 * t];
        d[1] = D[g][2 * t + 1];
        d[2] = D[g + 8][2 * t];
        d[3] = D[g + 8][2 * t + 1];
    }
}

// d[0..3] = c + a b (fragments as in the header)
inline void mma_m16n8k16_bf16(float* d, const uint32_t* a, const uint32_t* b, const float* c, const char* file,
                              int line) {
    MmaArgs args{{&mma_m16n8k16_complete}, d, a, b, c};
    warp_round(WarpOp::collective, "mma.sync.m16n8k16", file, line, 0xFFFFFFFFu,
               (uint64_t)reinterpret_cast<uintptr_t>(&args));
}

struct LdmatrixArgs {
    WarpCollective head;
    uint32_t* out;
    const uint16_t* row;  // this lane's row address (lanes 8 m .. 8 m + 7: matrix m)
};

template <int MATRICES, bool TRANS>
void ldmatrix_complete(void* const lane_args[32]) {
    uint32_t result[32][MATRICES];
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int m = 0; m < MATRICES; m++) {
            const auto row = [&](int r) { return static_cast<const LdmatrixArgs*>(lane_args[8 * m + r])->row; };
            uint32_t lo, hi;
            if (TRANS) {
                lo = row(2 * t)[g];
                hi = row(2 * t + 1)[g];
            } else {
                lo = row(g)[2 * t];
                hi = row(g)[2 * t + 1];
            }
            result[lane][m] = lo | hi << 16;
        }
    }
    for (int lane = 0; lane < 32; lane++)
        for (int m = 0; m < MATRICES; m++) static_cast<LdmatrixArgs*>(lane_args[lane])->out[m] = result[lane][m];
}

// out[0 .. MATRICES-1]: ldmatrix.sync.aligned.m8n8.xMATRICES[.trans] from the
// bf16 row address row (lanes 8 m .. 8 m + 7 give matrix m's rows; the others'
// addresses are not read, as on the GPU).
template <int MATRICES, bool TRANS>
void ldmatrix(uint32_t* out, const void* row, const char* file, int line) {
    static_assert(MATRICES == 1 || MATRICES == 2 || MATRICES == 4, "ldmatrix loads 1, 2 or 4 matrices");
    LdmatrixArgs args{{&ldmatrix_complete<MATRICES, TRANS>}, out, static_cast<const uint16_t*>(row)};
    warp_round(WarpOp::collective, TRANS ? "ldmatrix.trans" : "ldmatrix", file, line, 0xFFFFFFFFu,
               (uint64_t)reinterpret_cast<uintptr_t>(&args));
}

}  // namespace knngpt::emu
