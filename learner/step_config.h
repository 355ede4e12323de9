// The algorithm's step configuration (learner/algo/hybrid_step.h) from the
// run configuration: the one place config names become algorithm enums, so
// a bad name is an INVALID_ARGUMENT naming the key before training starts.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "learner/algo/alarms.h"
#include "learner/algo/hybrid_step.h"
#include "learner/algo/lr_schedule.h"
#include "services/config.h"
#include "tasks/answer_corruption.h"

namespace kappa::learner {

// The trainer and m3 keys as a step configuration; INVALID_ARGUMENT naming
// the key (or the pair of keys) that is out of range, trainer's
// max_nonfinite_steps included.
absl::StatusOr<HybridStepConfig> MakeHybridStepConfig(const services::Config& config);
AlarmConfig MakeAlarmConfig(const services::Config& config);
// trainer.lr, warmup_steps, lr_schedule, min_lr_ratio, steps; INVALID_ARGUMENT
// naming the key that is out of range.
absl::StatusOr<LearningRateSchedule> MakeLearningRateSchedule(const services::Config& config);
// trainer.lambda (the peak), lambda_schedule, lambda_warmup_steps,
// lambda_min_ratio, steps: nullopt for `constant` (λ fixed, or m3_adapt's);
// INVALID_ARGUMENT naming the key out of range, or lambda_warmup_steps
// without `cosine`.
absl::StatusOr<std::optional<LearningRateSchedule>> MakeLambdaSchedule(
    const services::Config& config);
// The subset one bootstrapped model answers wrongly on purpose, whose
// accuracy and K_DR the learner reports apart: teacher.bootstrap.corrupt (a
// teacher wrong there: teacher and reward disagree on it) or
// student.bootstrap.corrupt (a student wrong there and a clean teacher: they
// agree, the control for the first); nullopt when both are empty.
// INVALID_ARGUMENT naming the key for an unknown rule, or both keys when
// both are set. (ValidateStepConfig also refuses a rule beside a configured
// checkpoint of its role, which the bootstrap, and so the rule, never
// touches.)
absl::StatusOr<std::optional<tasks::AnswerCorruption>> StudiedCorruption(
    const services::Config& config);

// Everything the learner checks of the training configuration at start-up:
// the step configuration, the learning-rate schedule, the corruption rule, the alarm and
// m3_adapt bounds and student.lora.
absl::Status ValidateStepConfig(const services::Config& config);

}  // namespace kappa::learner
