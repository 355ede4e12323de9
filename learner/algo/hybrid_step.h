// One learner step of the hybrid objective with its monitors and balancing:
//   forward → per-position ℓ_R, ℓ_D (+ L_SFT)
//   → distillation gate (none | all | RSTG)
//   → cheap K_DR (logit, last_layer) from closed-form logit gradients
//   → m3_mask weights → aggregate → exact K_DR on sampled positions (opt-in)
//   → separate backward passes, m3_project / m3_norm / λ (m3_adapt) → AdamW.
// With micro_batch_sequences the gate is decided over the whole batch first,
// then each length-bucketed micro-batch runs forward → K_DR → m3_mask →
// aggregate → backward, accumulating; the update is the whole batch's.
// libtorch only: the service layer feeds it TrainBatches and logs the report.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "learner/algo/balance.h"
#include "learner/algo/cross_kernel.h"
#include "learner/algo/distill_gate.h"
#include "learner/algo/hybrid_loss.h"
#include "learner/algo/mixed_precision.h"
#include "learner/algo/optimizer_step.h"
#include "learner/algo/train_batch.h"
#include "model/transformer.h"

namespace kappa::learner {

struct MonitorConfig {
  int64_t kappa_every = 1;     // 0: never (steps may then take one backward pass)
  int64_t kdr_every = 1;       // cheap K_DR statistics; 0: never
  KdrEstimator kdr_estimator = KdrEstimator::kLastLayer;  // the statistics' estimator
  int64_t kdr_exact_every = 0;      // opt-in
  int64_t kdr_exact_positions = 32;
  uint64_t seed = 0;                // position sampling
};

struct HybridStepConfig {
  LossConfig loss;             // includes λ (the initial λ under m3_adapt)
  double reward_weight = 1.0;  // w_R
  DistillGate gate = DistillGate::kAll;
  RstgConfig rstg;
  double sft_weight = 0.0;     // μ
  BalanceConfig balance;
  MonitorConfig monitor;
  // bf16: the forward passes run under bf16 autocast (mixed_precision.h).
  Precision precision = Precision::kFloat32;
  // > 0: gradient accumulation over micro-batches of at most this many
  // sequences, bucketed by length; the step's update is the same as the
  // whole batch's (up to rounding). 0: one forward over the whole batch.
  int64_t micro_batch_sequences = 0;
  // trainer.truncated. Not read by Run(): the caller builds the TrainBatch
  // with it (BuildTrainBatch), so it is decided with the rest of the step.
  TruncatedResponses truncated = TruncatedResponses::kKeep;
};

struct HybridStepReport {
  StepStats stats;
  double entropy = 0.0, clip_fraction = 0.0, approx_kl = 0.0;
  double lambda = 0.0;  // λ in force for this step
  std::optional<KdrSummary> kdr;  // statistics of monitor.kdr_estimator
  std::vector<float> kdr_values;  // that estimator at every response position (histograms)
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

class HybridStep {
 public:
  // Throws std::invalid_argument on inconsistent configuration.
  HybridStep(model::Decoder model, std::unique_ptr<PolicyOptimizer> optimizer,
             HybridStepConfig config);

  // One optimizer step on `batch` (any device; moved to the model's).
  HybridStepReport Run(const TrainBatch& batch);

  PolicyOptimizer& optimizer() { return *optimizer_; }
  const HybridStepConfig& config() const { return config_; }
  double lambda() const;

 private:
  // ComputeTokenTerms under the configured precision.
  TokenTerms Forward(const TrainBatch& batch);

  model::Decoder model_;
  std::unique_ptr<PolicyOptimizer> optimizer_;
  const HybridStepConfig config_;
  std::optional<LambdaController> lambda_controller_;  // m3_adapt
};

}  // namespace kappa::learner
