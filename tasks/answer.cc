#include "tasks/answer.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "tasks/ascii_text.h"
#include "tasks/math_answer.h"

namespace kappa::tasks {
namespace {

std::string_view LastToken(std::string_view text) {
  text = TrimAsciiSpace(text);
  size_t start = text.size();
  while (start > 0 && !IsAsciiSpace(text[start - 1])) --start;
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
  if (task.empty() || task == "arithmetic" || IsMathTask(task)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("unknown task '", std::string(task),
                                                 "' (known: arithmetic, math, math_strict)"));
}

absl::Status ValidateReference(std::string_view task, std::string_view reference) {
  if (absl::Status status = ValidateTask(task); !status.ok()) return status;
  if (IsMathTask(task)) {
    // An empty reference would score every response 0.
    if (NormalizeMathAnswer(MathReferenceAnswer(reference)).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", std::string(reference), "' has no math answer"));
    }
    return absl::OkStatus();
  }
  // The reference is produced by a dataset, so it must be exactly one integer:
  // "4 6" would otherwise silently mean 6.
  const std::string_view trimmed = TrimAsciiSpace(reference);
  if (LastToken(trimmed) != trimmed || !CanonicalInteger(trimmed).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(reference), "' is not an integer answer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> ExactAnswerReward(std::string_view task, std::string_view reference,
                                        std::string_view response) {
  if (absl::Status status = ValidateReference(task, reference); !status.ok()) return status;
  if (IsMathTask(task)) return MathReward(reference, response, task == kMathStrictTask);
  const std::optional<std::string> expected = CanonicalInteger(TrimAsciiSpace(reference));
  const std::optional<std::string> got = ParseFinalAnswer(response);
  return got.has_value() && *got == *expected ? 1.0f : 0.0f;
}

absl::StatusOr<std::optional<std::string_view>> RewardFamily(std::string_view reward) {
  if (reward.empty() || reward == "task") return std::optional<std::string_view>();
  if (reward == "exact") return std::optional<std::string_view>("arithmetic");
  for (std::string_view family : {kMathTask, kMathStrictTask, kCodeTask}) {
    if (reward == family) return std::optional<std::string_view>(family);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown reward '", std::string(reward),
                                                 "' (known: ", std::string(kRewardNames), ")"));
}

std::string_view ExtractPythonCode(std::string_view response) {
  // Fences open at the start of a line: "```" then the info string up to the
  // end of the line.
  size_t line_start = 0;
  while (line_start < response.size()) {
    size_t line_end = response.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = response.size();
    const std::string_view line = response.substr(line_start, line_end - line_start);
    if (line.substr(0, 3) == "```") {
      std::string info(TrimAsciiSpace(line.substr(3)));
      for (char& c : info) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
      if (info == "python" || info == "python3" || info == "py") {
        const size_t body = std::min(line_end + 1, response.size());
        // The closing fence is a line starting with ``` (after the body).
        size_t close = body;
        while (close < response.size()) {
          if (response.substr(close, 3) == "```") return response.substr(body, close - body);
          const size_t next = response.find('\n', close);
          if (next == std::string_view::npos) break;
          close = next + 1;
        }
        return response.substr(body);
      }
    }
    line_start = line_end + 1;
  }
  return response;
}

}  // namespace kappa::tasks
