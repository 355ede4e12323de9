// The learner's Prometheus metrics (docs/metrics.md): what a training step
// measured (κ, gradient norms, K_DR, losses, reward, alarms), throughput and
// the group buffer, exported through the process's metrics::Registry.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "learner/algo/alarms.h"
#include "learner/algo/hybrid_step.h"
#include "learner/coordinator.h"
#include "services/metrics.h"

namespace kappa::learner {

struct StepObservationForMetrics {
  int64_t step = 0;
  int64_t policy_version = 0;
  double reward_mean = 0.0;
  double truncated_fraction = 0.0;  // responses that hit their token budget
  int64_t tokens = 0;
  double step_seconds = 0.0;
  std::vector<int64_t> staleness;  // per consumed group, in policy versions
  std::optional<double> eval_accuracy;
};

class LearnerMetrics {
 public:
  explicit LearnerMetrics(services::metrics::Registry& registry);

  void RecordStep(const StepObservationForMetrics& step, const HybridStepReport& report,
                  const std::vector<AlarmEvent>& events, const AlarmMonitor& alarms);

  // The group traffic (accepted, dropped, buffered) as of now. Called at
  // every scrape (a collect hook), so starvation shows while no step runs.
  void RecordCoordinator(const CoordinatorCounters& counters);
  // Groups the service refused as malformed (LearnerService counters), as
  // kappa_learner_groups_dropped_total{reason="invalid"}.
  void RecordInvalidGroups(int64_t total);

 private:
  services::metrics::Registry& registry_;
};

}  // namespace kappa::learner
