// runs/<name>/ for `kappa run`: config.yaml (the resolved config every
// process reads), logs/, and what the learner writes (metrics.jsonl,
// checkpoints/).
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/config.h"

namespace kappa::cli {

// Creates <runs_dir>/<name>/logs and returns the run directory (absolute).
// A fresh run (resume == false) never mixes with an older one of the same
// name: a non-empty existing directory is moved aside to
// <name>.<YYYYmmdd-HHMMSS> (said on `log`), since the learner appends to
// metrics.jsonl and resumes from checkpoints/ it finds there.
absl::StatusOr<std::string> PrepareRunDir(const services::Config& config, bool resume,
                                          std::ostream& log);

// If `dir` exists and is not empty, renames it to <dir>.<YYYYmmdd-HHMMSS>
// (with a -N suffix if that exists too) and returns the new path; returns
// an empty path when there was nothing to move. `what` names it in errors.
absl::StatusOr<std::string> MoveAsideIfNonEmpty(const std::string& dir, const std::string& what);

// Writes services::ConfigToYaml(config) to `path` atomically.
absl::Status WriteResolvedConfig(const services::Config& config, const std::string& path);


}  // namespace kappa::cli
