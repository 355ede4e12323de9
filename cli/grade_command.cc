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
    "usage: kappa grade --reward math|math_strict|exact|task < lines.jsonl\n"
    "  stdin: one {\"response\": ..., \"answer\": ...} per line (task: also \"task\", the\n"
    "  line's family, default arithmetic); stdout: its reward, 1 or 0\n";

constexpr const char* kNoCode =
    "runs Python tests in the verifier's code sandbox, which kappa grade does not; score "
    "code with kappa-verifier";

// The --reward value, as verifier.reward reads it (tasks::RewardFamily): the
// task family every line is graded as, or nullopt for each line's own;
// nullopt (after printing why) for a bad command line.
std::optional<std::optional<std::string_view>> ParseReward(const std::vector<std::string>& args) {
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
  absl::StatusOr<std::optional<std::string_view>> family = std::optional<std::string_view>();
  if (error.empty()) family = tasks::RewardFamily(*reward);
  if (error.empty() && !family.ok()) error = std::string(family.status().message());
  if (error.empty() && family->has_value() && tasks::IsCodeTask(**family)) {
    error = absl::StrCat("reward 'code' ", kNoCode);
  }
  if (error.empty()) return *family;
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

// --reward task: the line's "task" member, "" (arithmetic) when absent.
std::string TaskMember(const nlohmann::json& line) {
  if (!line.is_object() || !line.contains("task")) return "";
  const std::string task = StringMember(line, "task");
  if (tasks::IsCodeTask(task)) {
    throw std::invalid_argument(absl::StrCat("\"task\": code ", kNoCode));
  }
  if (absl::Status status = tasks::ValidateTask(task); !status.ok()) {
    throw std::invalid_argument(absl::StrCat("\"task\": ", status.message()));
  }
  return task;
}

}  // namespace

int GradeCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out) {
  const std::optional<std::optional<std::string_view>> reward = ParseReward(args);
  if (!reward) return 2;
  return ForEachJsonLine("grade", in, out, [&](const nlohmann::json& line) -> std::string {
    const std::string response = StringMember(line, "response");
    const std::string answer = StringMember(line, "answer");
    const std::string task = reward->has_value() ? std::string(**reward) : TaskMember(line);
    const absl::StatusOr<float> score = tasks::ExactAnswerReward(task, answer, response);
    if (!score.ok()) {
      throw std::invalid_argument(absl::StrCat("\"answer\": ", score.status().message()));
    }
    return *score == 1.0f ? "1" : "0";
  });
}

}  // namespace kappa::cli
