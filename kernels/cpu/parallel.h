// kernels/cpu/parallel.h — when an op's loop is worth a parallel region.
//
// A parallel region costs a fork and a barrier: a few microseconds on idle cores, but a
// scheduler slice (milliseconds) when another process holds the core a team thread waits
// on. Ops whose work is below kMinParallelWork floats (element-wise: elements touched;
// attention: multiply-adds) run on the calling thread: `#pragma omp parallel for
// if (parallel_pays(work))`. Every op here gives each output element to one iteration,
// so its bits do not depend on whether it ran in parallel. The threshold sends sampling's
// one-row forwards (T <= 64 rows of C = 128: 8K floats) to one thread and keeps a training
// batch's ops parallel (the baby config's smallest is 98K floats); the baby config's idle
// step time did not change (train/README.md, "On shared cores").
#pragma once

#include <cstddef>

namespace knngpt::cpu {

inline constexpr size_t kMinParallelWork = size_t{1} << 14;

inline bool parallel_pays(size_t work) { return work >= kMinParallelWork; }

}  // namespace knngpt::cpu
