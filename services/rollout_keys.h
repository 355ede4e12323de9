// The bounds of the rollout.* sampling and engine keys, in one place: the
// worker checks them at start-up (exit 2) and `kappa run` before it starts
// any process (learner::ValidateStepConfig), so a bad value is refused by
// name before anything is sampled. (Named choices such as
// rollout.weight_transport are checked when the configuration loads.)
#pragma once

#include "absl/status/status.h"
#include "services/config.h"

namespace kappa::services {

// INVALID_ARGUMENT naming the first bad key among rollout.max_batch_rows,
// rollout.max_sequence_tokens, rollout.temperature, rollout.top_p,
// rollout.top_k, rollout.min_p and learner.weight_group_workers; else OK.
absl::Status ValidateRolloutKeys(const Config& config);

}  // namespace kappa::services
