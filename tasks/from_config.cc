#include "tasks/from_config.h"

#include "absl/strings/str_cat.h"

namespace kappa::tasks {

absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const services::Config& config,
                                                     Split split) {
  const services::Config::Task& task = config.task;
  if (task.kind == "arithmetic") {
    ArithmeticSpec spec;
    spec.min_digits = static_cast<int>(task.min_digits);
    spec.max_digits = static_cast<int>(task.max_digits);
    spec.operators.assign(task.operators.begin(), task.operators.end());
    spec.seed = config.seed;
    spec.train_size = static_cast<size_t>(task.train_size);
    spec.heldout_size = static_cast<size_t>(task.heldout_size);
    return MakeArithmeticDataset(spec, split);
  }
  if (task.kind == "jsonl") {
    const std::string& path = split == Split::kTrain ? task.train_path : task.heldout_path;
    if (path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task.", split == Split::kTrain ? "train_path" : "heldout_path",
          ": required when task.kind is jsonl"));
    }
    return LoadJsonlDataset(path);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("task.kind: unknown kind '", task.kind, "' (expected arithmetic or jsonl)"));
}

}  // namespace kappa::tasks
