#include "tasks/answer.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kappa::tasks {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string_view Trim(std::string_view text) {
  while (!text.empty() && IsSpace(text.front())) text.remove_prefix(1);
  while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
  return text;
}

std::string_view LastToken(std::string_view text) {
  text = Trim(text);
  size_t start = text.size();
  while (start > 0 && !IsSpace(text[start - 1])) --start;
  return text.substr(start);
}

// Canonical integer text of `token` if it is entirely [+-]?[0-9]+.
std::optional<std::string> CanonicalInteger(std::string_view token) {
  bool negative = false;
  if (!token.empty() && (token.front() == '+' || token.front() == '-')) {
    negative = token.front() == '-';
    token.remove_prefix(1);
  }
  if (token.empty()) return std::nullopt;
  for (char c : token) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  while (token.size() > 1 && token.front() == '0') token.remove_prefix(1);
  if (token == "0") return std::string("0");  // "-0" and "+0" are 0.
  return negative ? absl::StrCat("-", std::string(token)) : std::string(token);
}

}  // namespace

std::optional<std::string> ParseFinalAnswer(std::string_view response) {
  return CanonicalInteger(LastToken(response));
}

absl::Status ValidateTask(std::string_view task) {
  if (task.empty() || task == "arithmetic") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown task '", std::string(task), "' (known: arithmetic)"));
}

absl::Status ValidateReference(std::string_view task, std::string_view reference) {
  if (absl::Status status = ValidateTask(task); !status.ok()) return status;
  // The reference is produced by a dataset, so it must be exactly one integer:
  // "4 6" would otherwise silently mean 6.
  const std::string_view trimmed = Trim(reference);
  if (LastToken(trimmed) != trimmed || !CanonicalInteger(trimmed).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(reference), "' is not an integer answer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> ExactAnswerReward(std::string_view task, std::string_view reference,
                                        std::string_view response) {
  if (absl::Status status = ValidateReference(task, reference); !status.ok()) return status;
  const std::optional<std::string> expected = CanonicalInteger(Trim(reference));
  const std::optional<std::string> got = ParseFinalAnswer(response);
  return got.has_value() && *got == *expected ? 1.0f : 0.0f;
}

}  // namespace kappa::tasks
