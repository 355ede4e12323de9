// The training-dynamics fields of one metrics.jsonl line: κ and the gradient
// norms, K_DR statistics, balancing and gating, and the alarms.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "learner/algo/alarms.h"
#include "learner/algo/hybrid_step.h"

namespace kappa::learner {

// Adds the report's fields to `record`. Absent measurements are JSON null
// (κ on a step that did not measure it), never 0.
void AddStepReport(const HybridStepReport& report, nlohmann::json& record);

// "alarms": the events of this step (omitted when none); "alarm_active": the
// 0/1 state of every alarm kind.
void AddAlarms(const std::vector<AlarmEvent>& events, const AlarmMonitor& monitor,
               nlohmann::json& record);

// What the alarm monitor sees of a step.
StepObservation ObservationOf(int64_t step, const HybridStepReport& report, double reward_mean,
                              bool has_distill);

}  // namespace kappa::learner
