// kernels/cuda/launch_text.h — the kernel a launch(...) names. The launch
// macro of common.cuh passes its whole argument list as text (#__VA_ARGS__):
//   "attention_kernel<Tiles<64>, 2>, grid, block, smem, stream, q, k, v"
// whose first top-level item is the kernel's expression, template arguments
// included. Plain C++ (no CUDA): the nvcc build names the kernel in a launch
// error with it, the CPU emulator (kernels/emu) in its deadlock reports.
#pragma once

#include <string>

namespace knngpt::cuda {

// The launch text up to its first comma outside (), <> and [], trimmed;
// "?" when that is empty.
inline std::string kernel_expression(const char* launch_text) {
    std::string name;
    int depth = 0;
    for (const char* c = launch_text; *c && !(*c == ',' && depth == 0); c++) {
        if (*c == '(' || *c == '<' || *c == '[') depth++;
        if (*c == ')' || *c == '>' || *c == ']') depth--;
        name += *c;
    }
    const size_t first = name.find_first_not_of(" \t\n"), last = name.find_last_not_of(" \t\n");
    return first == std::string::npos ? std::string("?") : name.substr(first, last - first + 1);
}

}  // namespace knngpt::cuda
