#include "verifier/code_tasks.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tasks/answer.h"

namespace kappa::verifier {

absl::StatusOr<CodeTasks> CodeTasks::Load(const std::string& paths,
                                          const tasks::JsonlOptions& options, bool all_are_code) {
  CodeTasks loaded;
  tasks::JsonlOptions code_options = options;
  code_options.code_tasks = true;
  for (absl::string_view piece : absl::StrSplit(paths, ',', absl::SkipEmpty())) {
    const std::string path(piece);
    absl::StatusOr<std::unique_ptr<tasks::Dataset>> dataset =
        tasks::LoadJsonlDataset(path, code_options);
    if (!dataset.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--code-tasks ", path, ": ", dataset.status().message()));
    }
    for (size_t i = 0; i < (*dataset)->size(); ++i) {
      const tasks::Example& example = (*dataset)->at(i);
      if (!all_are_code && !tasks::IsCodeTask(example.task)) continue;
      if (!loaded.tests_.emplace(example.id, example.answer).second) {
        return absl::InvalidArgumentError(absl::StrCat("--code-tasks ", path, ": example id '",
                                                       example.id, "' is in an earlier file too"));
      }
    }
  }
  if (loaded.tests_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--code-tasks ", paths, ": no example of the \"code\" task family"));
  }
  return loaded;
}

const std::string* CodeTasks::TestsOf(std::string_view id) const {
  const auto it = tests_.find(id);
  return it == tests_.end() ? nullptr : &it->second;
}

}  // namespace kappa::verifier
