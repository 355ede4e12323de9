// ASCII whitespace helpers shared by the reward functions (tasks/answer.cc,
// tasks/math_answer.cc): a response's final answer is found and compared on
// ASCII whitespace only, whatever Unicode spaces it holds.
#pragma once

#include <string_view>

namespace kappa::tasks {

// ' ', '\t', '\n', '\r', '\v', '\f'.
inline bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// `text` without leading and trailing ASCII whitespace.
inline std::string_view TrimAsciiSpace(std::string_view text) {
  while (!text.empty() && IsAsciiSpace(text.front())) text.remove_prefix(1);
  while (!text.empty() && IsAsciiSpace(text.back())) text.remove_suffix(1);
  return text;
}

}  // namespace kappa::tasks
