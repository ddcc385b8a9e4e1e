// kernels/common/fma_dot.h — the dot product whose every rounding is fixed, so
// that CPU and CUDA kernels that must agree bit for bit (top-k selection,
// sampling from a softmax row) compute identical scores:
//
//   acc = 0;  for d = 0..n-1:  acc = fma(a_d, b_d, acc)      (fp32, one rounding per step)
//
// fmaf is exact in both builds (hardware FMA, or a correctly rounded library
// fma where the CPU lacks one), and an explicit fma cannot be contracted or
// split differently by either compiler, as a plain `acc += a * b` can.
#pragma once
#include <cmath>

#include "kernels/common/philox.h"  // KNNGPT_HD: __host__ __device__ under nvcc

namespace knngpt {

KNNGPT_HD float fma_dot(const float* a, const float* b, int n) {
    float acc = 0.0f;
    for (int d = 0; d < n; d++) acc = fmaf(a[d], b[d], acc);
    return acc;
}

}  // namespace knngpt
