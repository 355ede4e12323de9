// FNV-1a 64-bit: a hash that is stable across builds, processes and
// platforms (unlike std::hash), for cache keys and seeds derived from names.
// Header-only and dependency-free (the base floor), the project's one FNV-1a.
#pragma once

#include <cstdint>
#include <string_view>

namespace kappa::base {

inline constexpr uint64_t kStableHashSeed = 0xcbf29ce484222325ULL;  // FNV-1a's offset basis

// FNV-1a of `text`, continuing from `hash` (the hash of what came before), so
// StableHash(b, StableHash(a)) == StableHash(a + b).
inline uint64_t StableHash(std::string_view text, uint64_t hash = kStableHashSeed) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijective mix of one
// 64-bit word, for seeds derived from other seeds.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace kappa::base
