// One training step's results, built once per step by the trainer loop and
// handed to its sinks: the alarms (ObservationOf), metrics.jsonl (ToJson),
// Prometheus (LearnerMetrics::RecordStep) and the log line.
//
// Adding a field: a member here, its key in learner/metrics_schema.h and
// docs/metrics.md, and the sinks that show it.
#pragma once

#include <array>
#include <cstdint>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "learner/algo/alarms.h"
#include "learner/algo/hybrid_step_report.h"
#include "learner/coordinator.h"
#include "learner/corrupted_subset.h"

namespace kappa::learner {

struct StepRecord {
  int64_t step = 0;            // the step just taken, 1-based
  int64_t policy_version = 0;  // published after it

  // The batch.
  double reward_mean = 0.0;
  double truncated_fraction = 0.0;  // responses that hit their token budget without a stop
  int64_t samples = 0;
  int64_t tokens = 0;              // response tokens
  std::vector<int64_t> staleness;  // per group: policy versions between sampling and this step
  // Which leases and policy versions fed this step, so tests and reports can
  // check that no group is consumed twice and that workers sample fresh weights.
  std::vector<std::string> lease_ids;
  std::vector<int64_t> group_versions;
  CoordinatorCounters counters;  // after the batch was taken

  // Time.
  double step_seconds = 0.0;      // the training step itself
  double interval_seconds = 0.0;  // since the previous step ended
  double elapsed_seconds = 0.0;   // since the run (or this resume) started

  // The algorithm: losses, κ, K_DR, gate, balancing.
  HybridStepReport report;

  // The alarms: what fired at this step, and every kind's state after it.
  std::vector<AlarmEvent> alarm_events;
  std::array<bool, std::size(kAllAlarmKinds)> alarm_active{};

  std::optional<double> eval_accuracy;  // on evaluation steps

  // With teacher.bootstrap.corrupt (learner/corrupted_subset.h), by subset
  // name (the rule's and "rest"): K_DR on the step's rows of each subset,
  // and on evaluation steps the held-out accuracy of each. Empty otherwise.
  std::map<std::string, SubsetKdr> kdr_by_subset;
  std::map<std::string, double> eval_accuracy_by_subset;

  double samples_per_second() const;
  double staleness_mean() const;
};

// What the alarm monitor sees of a step.
StepObservation ObservationOf(const StepRecord& record);

// The metrics.jsonl line (keys: learner/metrics_schema.h). Absent
// measurements are JSON null (κ on a step that did not measure it), never 0.
nlohmann::json ToJson(const StepRecord& record);

// The line of an evaluation outside a training step (step 0, before training).
nlohmann::json EvaluationJson(int64_t step, int64_t policy_version, double eval_accuracy,
                              const std::map<std::string, double>& accuracy_by_subset = {});

}  // namespace kappa::learner
