// Builds the run's train or held-out dataset from the `task:` section of the
// run configuration — the one place that maps config keys to datasets.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "services/config.h"
#include "tasks/dataset.h"

namespace kappa::tasks {

absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const services::Config& config, Split split);

// How the task.* keys read a JSONL line (prompt_key, messages_key,
// answer_key, format, family, skip_bad_lines): what MakeDataset uses, for
// other readers of the same files (the verifier's --code-tasks).
JsonlOptions JsonlOptionsFromConfig(const services::Config::Task& task);

}  // namespace kappa::tasks
