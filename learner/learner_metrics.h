// The learner's Prometheus metrics (docs/metrics.md): what a training step
// measured (κ, gradient norms, K_DR, losses, reward, alarms), throughput and
// the group buffer, exported through the process's metrics::Registry.
#pragma once

#include <cstdint>
#include <string>

#include "learner/algo/alarms.h"
#include "learner/coordinator.h"
#include "learner/step_record.h"
#include "services/metrics.h"

namespace kappa::learner {

class LearnerMetrics {
 public:
  explicit LearnerMetrics(services::metrics::Registry& registry);

  // The step's gauges, histograms and counters (docs/metrics.md).
  void RecordStep(const StepRecord& step);

  // The group traffic (accepted, dropped, buffered) as of now. Called at
  // every scrape (a collect hook), so starvation shows while no step runs.
  void RecordCoordinator(const CoordinatorCounters& counters);
  // Groups the service refused as malformed (LearnerService counters), as
  // kappa_learner_groups_dropped_total{reason="invalid"}.
  void RecordInvalidGroups(int64_t total);
  // The same groups by reason (LearnerService counters), as
  // kappa_learner_groups_refused_total{reason}: malformed, positions,
  // prompt, policy_version.
  struct GroupRefusals {
    int64_t malformed = 0;
    int64_t positions = 0;
    int64_t prompt = 0;
    int64_t policy_version = 0;
  };
  void RecordRefusedGroups(const GroupRefusals& refused);
  // One buffered group the step could not build a batch from
  // (kappa_learner_groups_refused_total{reason="batch"}).
  void RecordUnbatchableGroup();
  // WatchPolicy traffic totals (LearnerService counters): data bytes sent
  // per encoding and the bytes the delta and bfloat16 encodings saved.
  struct PolicyTraffic {
    int64_t versions_full = 0, versions_delta = 0;
    int64_t bytes_full = 0, bytes_delta = 0;
    int64_t saved_delta = 0, saved_bfloat16 = 0;
    // The same-host weight group (learner/weight_broadcaster.h): versions
    // every member received, their bytes (once), seconds in the broadcast.
    int64_t group_versions = 0, group_bytes = 0;
    double group_seconds = 0;
  };
  void RecordPolicyTraffic(const PolicyTraffic& traffic);
  // A write to the run directory that failed: `what` is "checkpoint" (the
  // previous checkpoint stays latest) or "metrics_log" (the record waits).
  void RecordWriteFailure(const std::string& what);
  // A training step skipped, not applied: `reason` is "nonfinite" (a loss
  // term or the gradient norm was NaN or ±inf), as
  // kappa_learner_steps_skipped_total{reason}.
  void RecordSkippedStep(const std::string& reason);

 private:
  services::metrics::Registry& registry_;
};

}  // namespace kappa::learner
