// model/backend.h — chooses the kernel set the model is compiled against.
//
// model/ calls every op as `ops::name(...)`; `ops` is the namespace of the
// backend chosen at compile time. The CPU build (train_gpt_cpu) uses
// kernels/cpu; the CUDA build defines KNNGPT_CUDA and points `ops` at
// kernels/cuda instead, with the same function names and argument order.
#pragma once

#if defined(KNNGPT_CUDA)
#include "kernels/cuda/backend.cuh"
namespace knngpt { namespace ops = knngpt::cuda; }
#else
#include "kernels/cpu/backend.h"
namespace knngpt { namespace ops = knngpt::cpu; }
#endif
