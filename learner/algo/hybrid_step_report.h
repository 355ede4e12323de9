// What one HybridStep::Run measured: the optimizer's statistics, the token
// means, the distillation gate, m3_mask and the K_DR monitors. Plain values;
// the service layer turns it into the step record (learner/step_record.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "learner/algo/cross_kernel.h"
#include "learner/algo/losses.h"
#include "learner/algo/optimizer_step.h"

namespace kappa::learner {

struct TailMass {
  double mean = 0.0;
  double p95 = 0.0;
};

// The tail mass q(T) of top-k teacher rows at the response positions, from
// the float32 tail_logmass the teacher sent (1 − Σ top-k without it);
// nullopt for other rows or an empty mask. logprobs [B, L, k], response_mask
// [B, L].
std::optional<TailMass> TeacherTailMass(const TeacherRows& teacher,
                                        const torch::Tensor& response_mask);

struct HybridStepReport {
  StepStats stats;
  // Token means over the step's response positions.
  double entropy = 0.0, clip_fraction = 0.0, approx_kl = 0.0;
  double lambda = 0.0;  // λ in force for this step
  // Cheap K_DR (KdrMonitor): statistics of monitor.kdr_estimator, and that
  // estimator at every response position (histograms).
  std::optional<KdrSummary> kdr;
  std::vector<float> kdr_values;
  // The same estimator as a [B, L] float32 CPU tensor in batch row order,
  // zero off the response positions (per-row reports: subsets, the conflict
  // atlas); undefined when K_DR was not measured this step.
  torch::Tensor kdr_kernel;
  // Exact K_DR on sampled positions (when it ran this step).
  int64_t exact_positions = 0;
  std::optional<KdrSummary> kdr_exact;
  std::optional<double> agreement_logit, agreement_last_layer;
  double exact_seconds = 0.0;
  // Host wall seconds of the step's forward passes (summed over its
  // micro-batches; with the fused head, the decoder layers and the head
  // apart; the head 0 otherwise, inside `forward_layers_seconds`). The
  // backward passes and the update are in stats (StepStats).
  double forward_layers_seconds = 0.0, forward_head_seconds = 0.0;
  // Distillation gate.
  int64_t distill_positions = 0;
  int64_t gated_groups = 0;
  int64_t masked_positions = 0;  // m3_mask: positions with K_DR < 0
  int64_t demonstrations = 0;
  // Top-k teacher rows: the teacher's mass outside its k ids, 1 − Σ_S q,
  // over the response positions (what topk_reverse_kl renormalises away and
  // topk_tail_reverse_kl keeps as its tail bucket). Unset for other rows.
  std::optional<TailMass> teacher_tail_mass;
  int64_t teacher_bytes = 0;  // the batch's teacher rows (TrainBatch::teacher_bytes)
  // Training–inference mismatch (docs/algorithms.md §6.1) over the response
  // tokens of the rows sampled with the policy this step updates (on-policy
  // rows; stale ones left out), from the loss's own log π_θ(y_n) against the
  // behaviour log-probs the worker sent: mean |log π_θ − log π_behaviour|
  // and mean k3 = (r − 1) − log r, r = π_θ / π_behaviour. Unset when no
  // token entered (mismatch_tokens = 0).
  int64_t mismatch_tokens = 0;
  std::optional<double> mismatch_abs_mean;
  std::optional<double> mismatch_k3;
};

}  // namespace kappa::learner
