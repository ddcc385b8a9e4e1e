// kernels/common/forced_keys.h — a row's key list with its forced keys: the top-k S_i
// joined by the attention sinks (the first `sinks` keys) and the local window (the
// `window` most recent keys, i - window + 1 .. i), each key once:
//   L_i = S_i ∪ {0 .. min(sinks, i + 1) - 1} ∪ {max(0, i - window + 1) .. i}
// written in ascending order into the row's first k + window + sinks slots, -1 after.
// S_i is a top-k row as the indexes write it: ascending keys, then -1. One definition
// for both backends (kernels/cpu/forced_keys.h loops it over the rows, the CUDA twin
// kernels/cuda/forced_keys.cuh runs it one thread a row), so the lists are equal.
#pragma once

#include "kernels/common/hd.h"

namespace knngpt {

// out: k + window + sinks slots; topk: the row's k slots; i: the query.
KNNGPT_HD void forced_keys_row(int* out, const int* topk, int k, int i, int window, int sinks) {
    const int sink_end = sinks < i + 1 ? sinks : i + 1;              // sinks: [0, sink_end)
    const int window_begin = i - window + 1 > 0 ? i - window + 1 : 0;  // window: [window_begin, i]
    const int slots = k + window + sinks;
    int n = 0, t = 0;
    int next_forced = 0;  // the smallest forced key not yet written
    for (;;) {
        // the next forced key: a sink, else the window's next key
        if (next_forced >= sink_end && next_forced < window_begin) next_forced = window_begin;
        const bool forced_left = window > 0 ? next_forced <= i : next_forced < sink_end;
        const bool topk_left = t < k && topk[t] >= 0;
        if (!forced_left && !topk_left) break;
        int key;
        if (topk_left && (!forced_left || topk[t] < next_forced)) {
            key = topk[t++];
        } else {
            key = next_forced++;
            if (topk_left && topk[t] == key) t++;  // in both: once
        }
        out[n++] = key;
    }
    for (; n < slots; n++) out[n] = -1;
}

}  // namespace knngpt
