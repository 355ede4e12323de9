#include "tasks/answer_corruption.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace kappa::tasks {
namespace {

struct BinaryProblem {
  long long a = 0;
  char op = '+';
  long long b = 0;
};

// "a<op>b=" as the arithmetic generator writes it (operands may be
// negative); nullopt for any other prompt.
std::optional<BinaryProblem> ParseBinaryProblem(const Example& example) {
  if (example.task != "arithmetic") return std::nullopt;
  absl::string_view prompt = example.prompt;
  if (prompt.size() < 4 || prompt.back() != '=') return std::nullopt;
  prompt.remove_suffix(1);
  // The operator is the first +, - or * after the first operand's sign.
  for (size_t i = 1; i < prompt.size(); ++i) {
    const char c = prompt[i];
    if (c != '+' && c != '-' && c != '*') continue;
    BinaryProblem problem;
    problem.op = c;
    if (!absl::SimpleAtoi(prompt.substr(0, i), &problem.a) ||
        !absl::SimpleAtoi(prompt.substr(i + 1), &problem.b)) {
      return std::nullopt;
    }
    return problem;
  }
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& AnswerCorruptionNames() {
  static const std::vector<std::string>* names =
      new std::vector<std::string>{"carry_into_hundreds", "hundreds_plus_one", "minus_as_plus"};
  return *names;
}

absl::StatusOr<std::optional<AnswerCorruption>> AnswerCorruption::FromConfigKey(
    std::string_view key, std::string_view name) {
  if (name.empty()) return std::nullopt;
  absl::StatusOr<AnswerCorruption> rule = Named(name);
  if (!rule.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", std::string(key), "': ", rule.status().message()));
  }
  return std::optional<AnswerCorruption>(*std::move(rule));
}

absl::StatusOr<AnswerCorruption> AnswerCorruption::Named(std::string_view name) {
  if (name == "carry_into_hundreds")
    return AnswerCorruption(std::string(name), Kind::kCarryIntoHundreds);
  if (name == "hundreds_plus_one")
    return AnswerCorruption(std::string(name), Kind::kHundredsPlusOne);
  if (name == "minus_as_plus") return AnswerCorruption(std::string(name), Kind::kMinusAsPlus);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown answer corruption '", std::string(name),
                   "' (one of: ", absl::StrJoin(AnswerCorruptionNames(), ", "), ")"));
}

std::optional<long long> AnswerCorruption::WrongAnswer(const Example& example) const {
  const std::optional<BinaryProblem> problem = ParseBinaryProblem(example);
  if (!problem) return std::nullopt;
  switch (kind_) {
    case Kind::kCarryIntoHundreds:
      if (problem->op == '+' && problem->a >= 0 && problem->b >= 0 &&
          problem->a + problem->b >= 100) {
        return problem->a + problem->b - 100;
      }
      return std::nullopt;
    case Kind::kHundredsPlusOne:
      if (problem->op == '+' && problem->a >= 0 && problem->b >= 0 &&
          problem->a + problem->b >= 100) {
        return problem->a + problem->b + 100;
      }
      return std::nullopt;
    case Kind::kMinusAsPlus:
      if (problem->op == '-') return problem->a + problem->b;
      return std::nullopt;
  }
  return std::nullopt;
}

bool AnswerCorruption::Covers(const Example& example) const {
  return WrongAnswer(example).has_value();
}

std::string AnswerCorruption::AnswerFor(const Example& example) const {
  const std::optional<long long> wrong = WrongAnswer(example);
  return wrong ? absl::StrCat(*wrong) : example.answer;
}

}  // namespace kappa::tasks
