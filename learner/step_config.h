// The algorithm's step configuration (learner/algo/hybrid_step.h) from the
// run configuration: the one place config names become algorithm enums, so
// a bad name is an INVALID_ARGUMENT naming the key before training starts.
#pragma once

#include "absl/status/statusor.h"
#include "learner/algo/alarms.h"
#include "learner/algo/hybrid_step.h"
#include "services/config.h"

namespace kappa::learner {

absl::StatusOr<HybridStepConfig> MakeHybridStepConfig(const services::Config& config);
AlarmConfig MakeAlarmConfig(const services::Config& config);

// Everything the learner checks of the training configuration at start-up:
// the step configuration and the alarm and m3_adapt bounds.
absl::Status ValidateStepConfig(const services::Config& config);

}  // namespace kappa::learner
