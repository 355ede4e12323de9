#include "cli/grade_command.h"

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "cli/line_commands.h"
#include "tasks/answer.h"

namespace kappa::cli {
namespace {

constexpr const char* kUsage =
    "usage: kappa grade --reward math|math_strict|exact < lines.jsonl\n"
    "  stdin: one {\"response\": ..., \"answer\": ...} per line; stdout: its reward, 1 or 0\n";

// The task family each --reward grades as.
std::optional<std::string_view> TaskOf(const std::string& reward) {
  if (reward == "math") return tasks::kMathTask;
  if (reward == "math_strict") return tasks::kMathStrictTask;
  if (reward == "exact") return std::string_view("arithmetic");
  return std::nullopt;
}

// The --reward value; nullopt (after printing why) for anything else.
std::optional<std::string> ParseReward(const std::vector<std::string>& args) {
  std::optional<std::string> reward;
  std::string error;
  for (size_t i = 0; i < args.size() && error.empty(); ++i) {
    if (args[i] == "--reward" && i + 1 < args.size()) {
      reward = args[++i];
    } else if (args[i].rfind("--reward=", 0) == 0) {
      reward = args[i].substr(9);
    } else {
      error = args[i] == "--reward" ? "flag --reward needs a value"
                                    : absl::StrCat("unexpected argument '", args[i], "'");
    }
  }
  if (error.empty() && !reward.has_value()) error = "--reward is required";
  if (error.empty() && !TaskOf(*reward).has_value()) {
    error = absl::StrCat("unknown reward '", *reward, "' (known: math, math_strict, exact)");
  }
  if (error.empty()) return reward;
  std::cerr << "kappa grade: " << error << "\n" << kUsage;
  return std::nullopt;
}

std::string StringMember(const nlohmann::json& line, const char* key) {
  if (!line.is_object()) {
    throw std::invalid_argument(absl::StrCat(
        "expected a JSON object {\"response\": ..., \"answer\": ...}, got ", line.type_name()));
  }
  const auto it = line.find(key);
  if (it == line.end()) throw std::invalid_argument(absl::StrCat("missing \"", key, "\""));
  if (!it->is_string()) {
    throw std::invalid_argument(
        absl::StrCat("\"", key, "\" must be a string, got ", it->type_name()));
  }
  return it->get<std::string>();
}

}  // namespace

int GradeCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out) {
  const std::optional<std::string> reward = ParseReward(args);
  if (!reward) return 2;
  const std::string_view task = *TaskOf(*reward);
  return ForEachJsonLine("grade", in, out, [&](const nlohmann::json& line) -> std::string {
    const std::string response = StringMember(line, "response");
    const std::string answer = StringMember(line, "answer");
    const absl::StatusOr<float> score = tasks::ExactAnswerReward(task, answer, response);
    if (!score.ok()) {
      throw std::invalid_argument(absl::StrCat("\"answer\": ", score.status().message()));
    }
    return *score == 1.0f ? "1" : "0";
  });
}

}  // namespace kappa::cli
