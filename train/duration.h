// train/duration.h — a duration as the trainer and its tools print it: 42s, 3m07s, 1h05m.
#pragma once
#include <cstdio>
#include <string>

namespace knngpt {

inline std::string format_duration(double seconds) {
    char buf[64];
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s % 3600) / 60);
    else if (s >= 60) snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
    else snprintf(buf, sizeof(buf), "%lds", s);
    return buf;
}

}  // namespace knngpt
