// JSONL datasets: one {"prompt", "answer"[, "id", "task", "system"]} object per line.
#include <fstream>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tasks/answer.h"
#include "tasks/dataset.h"
#include "tasks/vector_dataset.h"

namespace kappa::tasks {
namespace {

bool IsBlank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n\v\f") == std::string::npos;
}

// Reads a string member; absent is allowed only when `required` is false.
absl::Status ReadString(const nlohmann::json& object, const char* key, bool required,
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

absl::Status ParseExample(const std::string& line, size_t index, Example* example) {
  nlohmann::json object = nlohmann::json::parse(line, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a JSON object, got ", object.type_name()));
  }
  example->id = absl::StrCat("jsonl-", index);
  for (absl::Status status : {ReadString(object, "prompt", true, &example->prompt),
                              ReadString(object, "answer", true, &example->answer),
                              ReadString(object, "id", false, &example->id),
                              ReadString(object, "task", false, &example->task),
                              ReadString(object, "system", false, &example->system)}) {
    if (!status.ok()) return status;
  }
  if (example->task.empty()) example->task = "arithmetic";
  if (absl::Status status = ValidateReference(example->task, example->answer); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("\"answer\": ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadJsonlDataset(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<Example> examples;
  std::unordered_set<std::string> ids;
  std::string line;
  for (size_t line_number = 1; std::getline(in, line); ++line_number) {
    if (IsBlank(line)) continue;
    Example example;
    absl::Status status = ParseExample(line, examples.size(), &example);
    if (status.ok() && !ids.insert(example.id).second) {
      status = absl::InvalidArgumentError(absl::StrCat("duplicate id '", example.id, "'"));
    }
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": ", status.message()));
    }
    examples.push_back(std::move(example));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return std::unique_ptr<Dataset>(new VectorDataset(std::move(examples)));
}

}  // namespace kappa::tasks
