// FNV-1a 64-bit: a hash that is stable across builds, processes and
// platforms (unlike std::hash), for cache keys and seeds derived from names.
#pragma once

#include <cstdint>
#include <string_view>

namespace kappa::services {

inline uint64_t StableHash(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace kappa::services
