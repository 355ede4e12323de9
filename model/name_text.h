// How model/'s error messages write shapes and name lists (private to
// model/): "[896, 151936]" and "a, b, c".
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kappa::model::internal {

inline std::string ShapeText(c10::ArrayRef<int64_t> sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

inline std::string JoinNames(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& name : names) s += (s.empty() ? "" : ", ") + name;
  return s;
}

}  // namespace kappa::model::internal
