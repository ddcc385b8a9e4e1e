// model/checksum.h — the 64-bit checksum of checkpoint files: XXH64 (seed 0),
// the xxHash family's 64-bit hash, written here from its published
// definition and checked against the `xxhsum -H1` program (tests/test_reliability.cpp).
//
// Why this hash: it reads 32 bytes a round in four independent 64-bit lanes
// (multiply, rotate, multiply), so it runs at memory speed on one core, far
// faster than the disk the checkpoint goes to (tools/bench_checkpoint.cpp
// measures both), and any flipped bit changes the result.
//
// Definition (all arithmetic mod 2^64, little-endian words):
//   round(acc, w) = rotl(acc + w·P2, 31)·P1
//   n >= 32: lanes v1..v4 = seed+P1+P2, seed+P2, seed, seed−P1; each 32-byte
//            stripe updates v_i = round(v_i, word_i); then
//            h = rotl(v1,1) + rotl(v2,7) + rotl(v3,12) + rotl(v4,18), and for each
//            lane h = (h ^ round(0, v_i))·P1 + P4
//   n < 32:  h = seed + P5
//   h += n; the rest: each 8-byte word h = rotl(h ^ round(0, w), 27)·P1 + P4,
//   a 4-byte word h = rotl(h ^ w·P1, 23)·P2 + P3, each byte h = rotl(h ^ b·P5, 11)·P1;
//   finally h ^= h>>33, h *= P2, h ^= h>>29, h *= P3, h ^= h>>32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace knngpt {

class Xxh64 {
  public:
    // Adds `bytes` bytes; the result is that of hashing all the pieces back to back.
    void update(const void* data, size_t bytes) {
        if (bytes == 0) return;  // (data may then be null, which memcpy may not be given)
        const unsigned char* p = static_cast<const unsigned char*>(data);
        total_ += bytes;
        if (buffered_ > 0) {  // complete a stripe left over from the last piece
            const size_t take = bytes < 32 - buffered_ ? bytes : 32 - buffered_;
            std::memcpy(buffer_ + buffered_, p, take);
            buffered_ += take;
            p += take;
            bytes -= take;
            if (buffered_ < 32) return;
            stripe(buffer_);
            buffered_ = 0;
        }
        for (; bytes >= 32; p += 32, bytes -= 32) stripe(p);
        std::memcpy(buffer_, p, bytes);
        buffered_ = bytes;
    }

    uint64_t digest() const {
        uint64_t h = total_ >= 32 ? merged_lanes() : kP5;  // seed 0
        h += total_;
        const unsigned char* p = buffer_;
        size_t n = buffered_;
        for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round(0, word64(p)), 27) * kP1 + kP4;
        if (n >= 4) {
            uint32_t w;
            std::memcpy(&w, p, 4);
            h = rotl(h ^ ((uint64_t)w * kP1), 23) * kP2 + kP3;
            p += 4;
            n -= 4;
        }
        for (; n > 0; p++, n--) h = rotl(h ^ ((uint64_t)*p * kP5), 11) * kP1;
        h ^= h >> 33;
        h *= kP2;
        h ^= h >> 29;
        h *= kP3;
        h ^= h >> 32;
        return h;
    }

  private:
    static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull,
                              kP4 = 0x85EBCA77C2B2AE63ull, kP5 = 0x27D4EB2F165667C5ull;
    uint64_t v_[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
    uint64_t total_ = 0;
    unsigned char buffer_[32];
    size_t buffered_ = 0;

    static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
    static uint64_t round(uint64_t acc, uint64_t w) { return rotl(acc + w * kP2, 31) * kP1; }
    static uint64_t word64(const unsigned char* p) {
        uint64_t w;
        std::memcpy(&w, p, 8);  // little endian, as every platform we build for
        return w;
    }
    void stripe(const unsigned char* p) {
        for (int i = 0; i < 4; i++) v_[i] = round(v_[i], word64(p + 8 * i));
    }
    uint64_t merged_lanes() const {
        uint64_t h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
        for (uint64_t v : v_) h = (h ^ round(0, v)) * kP1 + kP4;
        return h;
    }
};

inline uint64_t xxh64(const void* data, size_t bytes) {
    Xxh64 h;
    h.update(data, bytes);
    return h.digest();
}

}  // namespace knngpt
