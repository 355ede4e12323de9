#include "tasks/from_config.h"

#include <iostream>

#include "absl/strings/str_cat.h"

namespace kappa::tasks {

namespace {

absl::StatusOr<std::unique_ptr<Dataset>> MakeArithmetic(const services::Config& config,
                                                        Split split) {
  const services::Config::Task& task = config.task;
  ArithmeticSpec spec;
  spec.min_digits = static_cast<int>(task.min_digits);
  spec.max_digits = static_cast<int>(task.max_digits);
  spec.operators.assign(task.operators.begin(), task.operators.end());
  spec.seed = config.seed;
  spec.train_size = static_cast<size_t>(task.train_size);
  spec.heldout_size = static_cast<size_t>(task.heldout_size);
  spec.heldout_draw = task.heldout_draw == services::HeldOutDraw::kInterleaved
                          ? ArithmeticSpec::HeldOutDraw::kInterleaved
                          : ArithmeticSpec::HeldOutDraw::kFirst;
  return MakeArithmeticDataset(spec, split);
}

absl::StatusOr<std::unique_ptr<Dataset>> LoadJsonl(const services::Config::Task& task,
                                                   Split split) {
  const std::string& path = split == Split::kTrain ? task.train_path : task.heldout_path;
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.", split == Split::kTrain ? "train_path" : "heldout_path",
                     ": required when task.kind is jsonl"));
  }
  const JsonlOptions options = JsonlOptionsFromConfig(task);
  if (absl::Status status = ValidateJsonlOptions(options); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("task.", status.message()));
  }
  absl::StatusOr<std::unique_ptr<Dataset>> dataset = LoadJsonlDataset(path, options);
  if (dataset.ok() && (*dataset)->skipped_lines() > 0) {
    // The process's log (kappa run keeps each process's stderr).
    std::cerr << path << ": skipped " << (*dataset)->skipped_lines()
              << " malformed line(s) (task.skip_bad_lines), loaded " << (*dataset)->size()
              << "; the first: " << (*dataset)->first_skipped_error() << "\n";
  }
  return dataset;
}

}  // namespace

JsonlOptions JsonlOptionsFromConfig(const services::Config::Task& task) {
  JsonlOptions options;
  options.prompt_key = task.prompt_key;
  options.messages_key = task.messages_key;
  options.answer_key = task.answer_key;
  options.format = task.format;
  options.family = task.family;
  options.skip_bad_lines = task.skip_bad_lines;
  return options;
}

absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const services::Config& config, Split split) {
  switch (config.task.kind) {
    case services::TaskKind::kArithmetic:
      return MakeArithmetic(config, split);
    case services::TaskKind::kJsonl:
      return LoadJsonl(config.task, split);
  }
  return absl::InternalError("unreachable");
}

}  // namespace kappa::tasks
