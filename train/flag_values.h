// train/flag_values.h — a flag's value as a number: the whole text must parse,
// else one line naming the flag (std::runtime_error, which the trainer prints
// through one_line).
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace knngpt {

inline long parse_flag_long(const std::string& flag, const char* s) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(s, &end, 10);
    if (!*s || *end || errno) throw std::runtime_error(flag + ": expected an integer, got '" + s + "'");
    return v;
}

inline float parse_flag_float(const std::string& flag, const char* s) {
    char* end = nullptr;
    errno = 0;
    const float v = std::strtof(s, &end);
    if (!*s || *end || errno || !std::isfinite(v)) throw std::runtime_error(flag + ": expected a number, got '" + s + "'");
    return v;
}

// An error message as one printable line: errors quote the flags and values
// they refuse, which may hold any bytes; control characters become \xNN.
inline std::string one_line(const std::string& message) {
    std::string line;
    for (unsigned char c : message) {
        if (c >= 0x20 && c != 0x7f) {
            line += (char)c;
            continue;
        }
        char escaped[8];
        std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
        line += escaped;
    }
    return line;
}

}  // namespace knngpt
