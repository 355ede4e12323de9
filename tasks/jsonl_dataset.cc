// JSONL datasets: one {"prompt", "answer"[, "id", "task", "system"]} object per
// line, the prompt and answer members renamed by JsonlOptions (GSM8K, MATH).
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tasks/answer.h"
#include "tasks/dataset.h"
#include "tasks/math_answer.h"

namespace kappa::tasks {
namespace {

bool IsBlank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n\v\f") == std::string::npos;
}

// Reads a string member; absent is allowed only when `required` is false.
absl::Status ReadString(const nlohmann::json& object, const std::string& key, bool required,
                        std::string* out) {
  auto it = object.find(key);
  if (it == object.end()) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("missing \"", key, "\""));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", key, "\" must be a string, got ", it->type_name()));
  }
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// The options with the format's keys and family filled in.
struct Layout {
  std::string prompt_key;
  std::string messages_key;
  std::string answer_key;
  std::string family;
  bool boxed_reference = false;  // The reference is the answer's last \boxed{} content.
  bool code_tasks = false;       // JsonlOptions::code_tasks
};

Layout LayoutOf(const JsonlOptions& options) {
  const JsonlOptions defaults;
  Layout layout;
  layout.prompt_key = options.prompt_key;
  layout.messages_key = options.messages_key;
  layout.answer_key = options.answer_key;
  layout.family = options.family;
  layout.code_tasks = options.code_tasks;
  auto preset = [&](const char* prompt_key, const char* answer_key) {
    if (layout.prompt_key == defaults.prompt_key) layout.prompt_key = prompt_key;
    if (layout.answer_key == defaults.answer_key) layout.answer_key = answer_key;
    if (layout.family.empty()) layout.family = std::string(kMathTask);
  };
  if (options.format == "gsm8k") preset("question", "answer");
  if (options.format == "math") {
    preset("problem", "solution");
    layout.boxed_reference = true;
  }
  if (layout.family.empty()) layout.family = "arithmetic";
  return layout;
}

// The messages member: the last user message's content is the prompt, a
// leading system message's content the system prompt.
absl::Status ReadMessages(const nlohmann::json& object, const std::string& key, Example* example) {
  auto it = object.find(key);
  if (it == object.end()) return absl::InvalidArgumentError(absl::StrCat("missing \"", key, "\""));
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", key, "\" must be a list of messages, got ", it->type_name()));
  }
  std::optional<std::string> prompt;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& message = (*it)[i];
    const std::string where = absl::StrCat("\"", key, "\"[", i, "]");
    if (!message.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " must be an object, got ", message.type_name()));
    }
    std::string role, content;
    for (absl::Status status : {ReadString(message, "role", true, &role),
                                ReadString(message, "content", true, &content)}) {
      if (!status.ok())
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", status.message()));
    }
    if (role == "system" && i == 0) example->system = content;
    if (role == "user") prompt = content;
  }
  if (!prompt.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" has no user message"));
  }
  example->prompt = *prompt;
  return absl::OkStatus();
}

absl::Status ParseExample(const std::string& line, const Layout& layout, size_t index,
                          Example* example) {
  nlohmann::json object = nlohmann::json::parse(line, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a JSON object, got ", object.type_name()));
  }
  example->id = absl::StrCat("jsonl-", index);
  std::string system;  // The line's "system"; a leading system message wins.
  for (absl::Status status :
       {layout.messages_key.empty() ? ReadString(object, layout.prompt_key, true, &example->prompt)
                                    : ReadMessages(object, layout.messages_key, example),
        ReadString(object, layout.answer_key, true, &example->answer),
        ReadString(object, "id", false, &example->id),
        ReadString(object, "task", false, &example->task),
        ReadString(object, "system", false, &system)}) {
    if (!status.ok()) return status;
  }
  if (example->system.empty()) example->system = std::move(system);
  if (layout.boxed_reference) {
    std::optional<std::string> boxed = LastBoxedAnswer(example->answer);
    if (!boxed.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", layout.answer_key, "\" has no \\boxed{} answer"));
    }
    example->answer = *std::move(boxed);
  }
  if (object.find("task") == object.end()) example->task = layout.family;
  if (example->task.empty()) example->task = "arithmetic";
  if (layout.code_tasks && IsCodeTask(example->task)) {
    if (example->answer.find_first_not_of(" \t\r\n") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", layout.answer_key, "\": code tests are empty"));
    }
    return absl::OkStatus();
  }
  if (absl::Status status = ValidateReference(example->task, example->answer); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", layout.answer_key, "\": ", status.message()));
  }
  return absl::OkStatus();
}

class JsonlDataset final : public Dataset {
 public:
  JsonlDataset(std::vector<Example> examples, size_t skipped, std::string first_skipped_error)
      : examples_(std::move(examples)),
        skipped_(skipped),
        first_skipped_error_(std::move(first_skipped_error)) {}
  size_t size() const override { return examples_.size(); }
  const Example& at(size_t index) const override { return examples_.at(index); }
  size_t skipped_lines() const override { return skipped_; }
  std::string first_skipped_error() const override { return first_skipped_error_; }

 private:
  std::vector<Example> examples_;
  size_t skipped_;
  std::string first_skipped_error_;
};

}  // namespace

absl::Status ValidateJsonlOptions(const JsonlOptions& options) {
  if (!options.format.empty() && options.format != "gsm8k" && options.format != "math") {
    return absl::InvalidArgumentError(
        absl::StrCat("format: unknown format '", options.format, "' (expected gsm8k or math)"));
  }
  if (absl::Status status = ValidateTask(options.family); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("family: ", status.message()));
  }
  if (options.messages_key.empty() && options.prompt_key.empty()) {
    return absl::InvalidArgumentError("prompt_key: empty (and no messages_key)");
  }
  if (options.answer_key.empty()) return absl::InvalidArgumentError("answer_key: empty");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> LoadJsonlDataset(const std::string& path,
                                                          const JsonlOptions& options) {
  if (absl::Status status = ValidateJsonlOptions(options); !status.ok()) return status;
  const Layout layout = LayoutOf(options);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<Example> examples;
  std::unordered_set<std::string> ids;
  size_t skipped = 0;
  std::string first_skipped_error;
  std::string line;
  for (size_t line_number = 1; std::getline(in, line); ++line_number) {
    if (IsBlank(line)) continue;
    Example example;
    absl::Status status = ParseExample(line, layout, examples.size(), &example);
    if (status.ok() && ids.count(example.id) != 0) {
      status = absl::InvalidArgumentError(absl::StrCat("duplicate id '", example.id, "'"));
    }
    if (!status.ok()) {
      std::string error = absl::StrCat(path, ":", line_number, ": ", status.message());
      if (!options.skip_bad_lines) return absl::InvalidArgumentError(error);
      if (skipped++ == 0) first_skipped_error = std::move(error);
      continue;
    }
    ids.insert(example.id);
    examples.push_back(std::move(example));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  if (examples.empty() && skipped > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": every non-blank line (", skipped,
                     ") is malformed (skip_bad_lines); the first: ", first_skipped_error));
  }
  return std::unique_ptr<Dataset>(
      new JsonlDataset(std::move(examples), skipped, std::move(first_skipped_error)));
}

}  // namespace kappa::tasks
