// kernels/common/hd.h — KNNGPT_HD marks a function that both backends compile:
// __host__ __device__ (and inlined) under nvcc, a plain inline function in the
// host build and under the CUDA emulator. Everything in kernels/common/ that a
// kernel calls is KNNGPT_HD, so the CPU and CUDA builds run one definition.
#pragma once

#if defined(__CUDACC__)
#define KNNGPT_HD __host__ __device__ __forceinline__
#else
#define KNNGPT_HD inline
#endif
