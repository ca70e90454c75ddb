// XXH64 (Yann Collet's xxHash, 64-bit variant), written out here rather than taken as a
// dependency: shard checksums and tokenizer fingerprints need a fast, stable, well-specified
// hash, and ~60 lines are cheaper than a package. Output equals the reference XXH64
// (XXH64("", 0) = 0xef46db3751d8e999), so shards can be checked with any xxhash tool.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kiln::data {

namespace detail {
constexpr uint64_t kP1 = 11400714785074694791ULL, kP2 = 14029467366897019727ULL, kP3 = 1609587929392839161ULL,
                   kP4 = 9650029242287828579ULL, kP5 = 2870177450012600261ULL;
inline uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
inline uint64_t read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // kiln targets little-endian machines only (docs/data.md)
  return v;
}
inline uint32_t read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round(uint64_t acc, uint64_t input) {
  return rotl(acc + input * kP2, 31) * kP1;
}
inline uint64_t merge_round(uint64_t acc, uint64_t val) {
  return (acc ^ round(0, val)) * kP1 + kP4;
}
}  // namespace detail

inline uint64_t xxh64(const void* data, size_t len, uint64_t seed = 0) {
  using namespace detail;
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    const unsigned char* const limit = end - 32;
    do {
      v1 = round(v1, read64(p));
      v2 = round(v2, read64(p + 8));
      v3 = round(v3, read64(p + 16));
      v4 = round(v4, read64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge_round(h, v1);
    h = merge_round(h, v2);
    h = merge_round(h, v3);
    h = merge_round(h, v4);
  } else {
    h = seed + kP5;
  }
  h += static_cast<uint64_t>(len);
  while (p + 8 <= end) {
    h = rotl(h ^ round(0, read64(p)), 27) * kP1 + kP4;
    p += 8;
  }
  if (p + 4 <= end) {
    h = rotl(h ^ (static_cast<uint64_t>(read32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
  }
  while (p < end) {
    h = rotl(h ^ (*p * kP5), 11) * kP1;
    ++p;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

inline uint64_t xxh64(std::string_view s, uint64_t seed = 0) {
  return xxh64(s.data(), s.size(), seed);
}

// 16 lowercase hex digits, the form written into metadata files.
std::string hex64(uint64_t value);

}  // namespace kiln::data
