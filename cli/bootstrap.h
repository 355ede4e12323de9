// `kappa run`'s warm starts: the teacher and student checkpoints the services
// load, trained once by SFT and cached under data_dir. The cache directory is
// keyed by a hash of everything that determines the weights (task, seeds,
// the role's shape and SFT settings), so changing any of them retrains while
// an unchanged config reuses the cached checkpoint.
#pragma once

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "learner/sft_warm_start.h"
#include "services/config.h"

namespace kappa::cli {

// 16 hex digits (FNV-1a 64) of the settings that determine the role's SFT
// checkpoint; stable across builds and machines.
std::string BootstrapKey(const services::Config& config, learner::Role role);
// <data_dir>/<role>-<key>
std::string BootstrapDir(const services::Config& config, learner::Role role);

// The checkpoint directory the role's service should load:
//  * the configured <role>.checkpoint when set (FAILED_PRECONDITION if it
//    holds no checkpoint: an explicit path is never trained into);
//  * else the cached bootstrap dir, trained now by RunSft if missing.
// Says what it does on `log`.
absl::StatusOr<std::string> EnsureBootstrapCheckpoint(const services::Config& config,
                                                      learner::Role role, std::ostream& log);

}  // namespace kappa::cli
