// The checks of the rollout.* sampling and engine keys, in one place: the
// worker runs them at start-up (exit 2) and `kappa run` before it starts any
// process (learner::ValidateStepConfig), so a typo is refused by name
// before anything is sampled.
#pragma once

#include "absl/status/status.h"
#include "services/config.h"

namespace kappa::rollout {

// INVALID_ARGUMENT naming the first bad key among rollout.engine,
// rollout.max_batch_rows, rollout.max_sequence_tokens, rollout.temperature,
// rollout.top_p, rollout.top_k, rollout.min_p, rollout.weight_transport and
// learner.weight_group_workers; else OK.
absl::Status ValidateRolloutSettings(const services::Config& config);

}  // namespace kappa::rollout
