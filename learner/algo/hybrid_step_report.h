// What one HybridStep::Run measured: the optimizer's statistics, the token
// means, the distillation gate, m3_mask and the K_DR monitors. Plain values;
// the service layer turns it into the step record (learner/step_record.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "learner/algo/cross_kernel.h"
#include "learner/algo/optimizer_step.h"

namespace kappa::learner {

struct HybridStepReport {
  StepStats stats;
  // Token means over the step's response positions.
  double entropy = 0.0, clip_fraction = 0.0, approx_kl = 0.0;
  double lambda = 0.0;  // λ in force for this step
  // Cheap K_DR (KdrMonitor): statistics of monitor.kdr_estimator, and that
  // estimator at every response position (histograms).
  std::optional<KdrSummary> kdr;
  std::vector<float> kdr_values;
  // Exact K_DR on sampled positions (when it ran this step).
  int64_t exact_positions = 0;
  std::optional<KdrSummary> kdr_exact;
  std::optional<double> agreement_logit, agreement_last_layer;
  double exact_seconds = 0.0;
  // Distillation gate.
  int64_t distill_positions = 0;
  int64_t gated_groups = 0;
  int64_t masked_positions = 0;  // m3_mask: positions with K_DR < 0
  int64_t demonstrations = 0;
};

}  // namespace kappa::learner
