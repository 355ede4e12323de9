// The tests of the code tasks a verifier was started with (--code-tasks):
// the verifier runs these, looked up by the item's example_id, instead of
// trusting tests a caller sends (docs/security.md, "The `code` reward").
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "tasks/dataset.h"

namespace kappa::verifier {

class CodeTasks {
 public:
  // Reads each comma-separated JSONL file of `paths` as the learner does
  // (tasks::LoadJsonlDataset with `options`, the config's task.* keys) and
  // keeps the examples of the "code" family, or every example when
  // `all_are_code` (verifier.reward: code), by id. INVALID_ARGUMENT naming
  // --code-tasks and the file: a load error, an id in two files, or no code
  // example at all.
  static absl::StatusOr<CodeTasks> Load(const std::string& paths,
                                        const tasks::JsonlOptions& options, bool all_are_code);

  // The tests of example `id`, or null when it is not loaded.
  const std::string* TestsOf(std::string_view id) const;
  size_t size() const { return tests_.size(); }

  // For tests: adds example `id` with `tests`.
  void Add(std::string id, std::string tests) { tests_[std::move(id)] = std::move(tests); }

 private:
  std::map<std::string, std::string, std::less<>> tests_;
};

}  // namespace kappa::verifier
