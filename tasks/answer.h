// The reward function for exact-answer tasks (used by the verifier service
// and by the learner's held-out evaluation, so both agree by construction).
//
// Parsing rules for "arithmetic":
//  * the final answer is the last whitespace-separated token of the response;
//  * it must match [+-]?[0-9]+ entirely (no other characters, no decimals);
//  * it is compared to the reference as an integer: leading zeros and a '+'
//    sign are ignored, "-0" equals "0";
//  * an empty response, or one whose last token is not an integer, gets 0.
//
// "math" and "math_strict" (strict: the answer must be boxed) are graded by
// MathReward, whose rules are in tasks/math_answer.h; their reference must
// hold an answer (not empty once cut at its last "####" and normalized).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kappa::tasks {

// The canonical integer text of the final answer ("007" -> "7", "-0" -> "0"),
// or nullopt if the response has none. Arbitrary length (no overflow).
std::optional<std::string> ParseFinalAnswer(std::string_view response);

// 1.0 if the response's final answer equals the reference, else 0.0.
// INVALID_ARGUMENT when the reference itself is not a valid answer or the
// task family is unknown ("" means "arithmetic").
// OK for "", "arithmetic", "math" and "math_strict"; INVALID_ARGUMENT
// "unknown task 'x' ..." otherwise.
absl::Status ValidateTask(std::string_view task);
// ValidateTask, then: for arithmetic the reference must be exactly one integer
// token (surrounding whitespace allowed); for math it must hold an answer.
// Messages carry no field name, so callers can prefix their own
// ("items[3].reference_answer: ...").
absl::Status ValidateReference(std::string_view task, std::string_view reference);

absl::StatusOr<float> ExactAnswerReward(std::string_view task, std::string_view reference,
                                        std::string_view response);

inline constexpr std::string_view kMathTask = "math";
inline constexpr std::string_view kMathStrictTask = "math_strict";
inline bool IsMathTask(std::string_view task) {
  return task == kMathTask || task == kMathStrictTask;
}

// The "code" task family is not an exact-answer task: the reference is Python
// test code and the response a Python solution, and the reward comes from
// running both in the verifier's sandbox (verifier/code_reward.h). The
// functions above do not accept it.
inline constexpr std::string_view kCodeTask = "code";
inline bool IsCodeTask(std::string_view task) { return task == kCodeTask; }

// The reward names that the config key `verifier.reward` and `kappa grade
// --reward` accept: "" and "task" (each item is scored by its own task
// family), "exact" (the arithmetic reward), "math", "math_strict" and "code"
// (that family for every item, whatever its task field says).
inline constexpr std::string_view kRewardNames = "\"\" or task, exact, math, math_strict, code";

// The task family that `reward` scores every item as ("exact" ->
// "arithmetic"); nullopt for "" and "task" (each item's own family).
// INVALID_ARGUMENT "unknown reward 'x' (known: <kRewardNames>)" otherwise.
absl::StatusOr<std::optional<std::string_view>> RewardFamily(std::string_view reward);

// The solution inside a model response: the body of the first fenced block
// whose info string is python, python3 or py (any case; an unclosed fence runs
// to the end), else the whole response.
std::string_view ExtractPythonCode(std::string_view response);

}  // namespace kappa::tasks
