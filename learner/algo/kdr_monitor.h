// The K_DR monitors of one learner step (docs/algorithms.md §3.2).
//
// Cheap estimators, at every response position, from the closed-form logit
// gradients of the unweighted per-position terms ℓ_R(n), ℓ_D(n):
//   logit       K(n) = g_R(n)·g_D(n)
//   last_layer  K(n) = ‖h_n‖² g_R(n)·g_D(n)
// and the exact kernel ⟨∇_θ ℓ_R(n), ∇_θ ℓ_D(n)⟩ on a few sampled positions,
// by two backward passes per position (opt-in: monitor.kdr_exact_every).
//
// Protocol, one monitor per step: Observe each micro-batch after its forward
// (the kernels are also what m3_mask reads), then Summarize, then
// MeasureExact at the same parameters (before the optimizer update).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>

#include "learner/algo/cross_kernel.h"
#include "learner/algo/hybrid_loss.h"
#include "learner/algo/hybrid_step_report.h"
#include "learner/algo/train_batch.h"

namespace kappa::learner {

struct MonitorConfig {
  int64_t kappa_every = 1;  // 0: never (steps may then take one backward pass)
  int64_t kdr_every = 1;    // cheap K_DR statistics; 0: never
  KdrEstimator kdr_estimator = KdrEstimator::kLastLayer;  // the statistics' estimator
  int64_t kdr_exact_every = 0;                            // opt-in
  int64_t kdr_exact_positions = 32;
  uint64_t seed = 0;  // position sampling
};

// Whether a monitor with period `every` runs at 1-based `step`.
inline bool Due(int64_t every, int64_t step) { return every > 0 && step % every == 0; }

// Both cheap estimators at one micro-batch's positions, [b, l], zero outside
// its response positions.
struct CheapKernels {
  torch::Tensor logit;
  torch::Tensor last_layer;

  const torch::Tensor& Of(KdrEstimator estimator) const {
    return estimator == KdrEstimator::kLogit ? logit : last_layer;
  }
};

class KdrMonitor {
 public:
  // The monitors due at 1-based `step` of a batch with `response_mask`
  // [B, L]. `kernels_for_mask`: m3_mask reads the cheap kernels this step.
  // Without distillation nothing is due.
  KdrMonitor(const MonitorConfig& monitor, const LossConfig& loss, int64_t step, bool has_distill,
             bool kernels_for_mask, const torch::Tensor& response_mask);

  // Whether micro-batches are to be observed (statistics, m3_mask or exact
  // K_DR's sign agreement need the cheap kernels).
  bool observing() const { return logit_.defined(); }
  bool exact_due() const { return exact_due_; }

  // The cheap kernels of one micro-batch from its forward, without graph;
  // also written into this monitor's whole-batch kernels at its rows.
  // REQUIRES: observing() (else std::logic_error); `tokens` is the forward
  // of `part.batch`: its token log-probs shaped like the part's response
  // mask (else std::invalid_argument).
  CheapKernels Observe(const MicroBatch& part, const TokenTerms& tokens);
  // Observe for a forward that computed the logit kernel itself (the fused
  // head): `logit_kernel` [b, L] of part's rows (0 off the response), and
  // `hidden` [b, L, D] the head's input for the last_layer estimator.
  // REQUIRES: observing() (std::logic_error otherwise).
  CheapKernels Record(const MicroBatch& part, const torch::Tensor& logit_kernel,
                      const torch::Tensor& hidden);

  // report->kdr and kdr_values, from the whole batch, when the statistics
  // are due. REQUIRES (when due): every micro-batch observed, i.e. Observe
  // has seen every row of the batch (else std::logic_error).
  void Summarize(HybridStepReport* report) const;

  // Exact K_DR at monitor.kdr_exact_positions sampled response positions of
  // `batch`: `forward` (with graph) of the sampled rows alone, then
  // ExactCrossKernel through `params`. Fills report->exact_positions,
  // kdr_exact, agreement_logit/last_layer (against the observed cheap
  // kernels) and exact_seconds. Uses autograd::grad: .grad is left as it is.
  // REQUIRES: exact_due() and every micro-batch observed (else
  // std::logic_error). The parameters must still be those the micro-batches
  // were observed at: the caller's to keep (HybridStep measures before the
  // update), since the monitor sees them first here.
  void MeasureExact(const TrainBatch& batch, const std::vector<torch::Tensor>& params,
                    const std::function<TokenTerms(const TrainBatch&)>& forward,
                    HybridStepReport* report) const;

 private:
  // g_R(n)·g_D(n) at every position of `sub`, [b, l], without graph.
  torch::Tensor LogitKernel(const TokenTerms& tokens, const TrainBatch& sub,
                            const torch::Tensor& coefficient) const;
  // Throws std::logic_error naming `what` unless Observe has seen every row
  // of the batch.
  void CheckAllObserved(const char* what) const;

  const MonitorConfig monitor_;
  const LossConfig loss_;
  const int64_t step_;
  const torch::Tensor response_mask_;  // [B, L]
  const bool statistics_due_;
  const bool exact_due_;
  torch::Tensor logit_, last_layer_;  // [B, L] over the whole batch; undefined: not observing
  int64_t observed_rows_ = 0;         // rows of the batch Observe has seen
};

}  // namespace kappa::learner
