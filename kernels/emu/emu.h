// kernels/emu/emu.h — a CPU emulator of the CUDA execution model, so that the
// kernels of kernels/cuda compile with g++ -DKNNGPT_CUDA_EMU and run, and are
// tested, on machines without a GPU. Kernel files include it through
// kernels/cuda/common.cuh, never directly.
//
//   types.h       __global__/__device__/__shared__..., dim3, float4, warpSize
//   bf16.h        __nv_bfloat16 and its round-to-nearest-even conversions
//   runtime.h     cudaMalloc/cudaMemcpy/streams/events/errors on host memory
//   fibers.h      the execution model: blocks one after another, threads as
//                 fibers, barriers, warp rounds, deadlock reports, launches
//   intrinsics.h  __syncthreads, __shfl_*_sync, votes, atomics, fast math
//   wmma.h        nvcuda::wmma bf16 16x16x16 with fp32 accumulation
//   mma.h         mma.sync m16n8k16 (bf16, fp32 accumulation) and ldmatrix, with
//                 the PTX ISA's register layouts (kernels/cuda/mma.cuh wraps them)
//
// What the emulator checks and a GPU does not: divergent __syncthreads, warp
// primitives whose mask names an exited, missing or elsewhere-waiting lane,
// shuffles that read a lane outside their mask, copies whose device side is
// not inside a cudaMalloc, dynamic shared memory read before written (it
// starts as NaN / -1). What it cannot check: data races between threads
// (fibers never interleave between barriers), timing, and kernels that spin
// waiting on another thread or block (they hang: blocks run sequentially, and
// a fiber only yields at a barrier or warp primitive).
#pragma once

#include "kernels/emu/types.h"
#include "kernels/emu/bf16.h"
#include "kernels/emu/runtime.h"
#include "kernels/emu/fibers.h"
#include "kernels/emu/intrinsics.h"
#include "kernels/emu/wmma.h"
#include "kernels/emu/mma.h"
