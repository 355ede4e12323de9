// One learner step of the hybrid objective (docs/algorithms.md §1.1):
//   gate        D: the positions L_D trains on (none | all | RSTG), over the
//               whole batch, before any backward
//   plan        g = w_R g_R′ + s g_D + μ g_SFT, each mean over the whole batch
//   per micro-batch (length-bucketed when micro_batch_sequences > 0):
//     forward   ℓ_R(n), ℓ_D(n) (+ L_SFT)
//     K_DR      cheap kernels (logit, last_layer) from closed-form logit gradients
//     m3_mask   weight 0 (or σ(K/τ)) on one term where K_DR(n) < 0
//     backward  one per signal (separate) or one of the weighted sum
//   K_DR        summary; exact K_DR on sampled positions (opt-in), at the same θ
//   mismatch    |log π_θ − log π_behaviour| and k3 on the on-policy rows, from
//               the same forwards (before the update)
//   update      m3_project, m3_norm or λ, clipping, AdamW; then m3_adapt's λ
// The update is the whole batch's however it is split.
// libtorch only: the service layer feeds it TrainBatches and logs the report.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "learner/algo/balance.h"
#include "learner/algo/cross_kernel.h"
#include "learner/algo/distill_gate.h"
#include "learner/algo/hybrid_loss.h"
#include "learner/algo/hybrid_step_report.h"
#include "learner/algo/kdr_monitor.h"
#include "learner/algo/lr_schedule.h"
#include "learner/algo/mixed_precision.h"
#include "learner/algo/optimizer_step.h"
#include "learner/algo/train_batch.h"
#include "model/transformer.h"

namespace kappa::learner {

struct HybridStepConfig {
  LossConfig loss;             // includes λ (the initial λ under m3_adapt)
  // trainer.lambda_schedule: λ_t = lambda_schedule->At(t) for the 0-based
  // step t, the shape of the learning rate's schedule with λ as its peak
  // (loss.lambda is ignored then). Unset: λ = loss.lambda (or m3_adapt's).
  std::optional<LearningRateSchedule> lambda_schedule;
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
  // trainer.advantage_std, for BuildTrainBatch too; not read by Run().
  AdvantageStd advantage_std = AdvantageStd::kPopulation;
};

// The on-policy rows of a batch built by BuildTrainBatch from groups sampled
// with `group_versions` (one per group, in batch order; G rows each): [B]
// float32, 1 where the group's version is `current_version`, the version the
// step is about to update, 0 for stale groups.
torch::Tensor OnPolicyRows(const std::vector<int64_t>& group_versions, int64_t group_size,
                           int64_t current_version);

// The one check of a step configuration's consistency, made by HybridStep's
// constructor and by the learner's start-up checks (learner/step_config.h):
// throws std::invalid_argument naming the keys for settings that contradict
// each other (an exact K_DR estimator where only the cheap ones run, λ moved
// by both a schedule and m3_adapt, CheckRstgConfig's pairs).
void ValidateHybridStepConfig(const HybridStepConfig& config);

class HybridStep {
 public:
  // Throws std::invalid_argument on inconsistent configuration
  // (ValidateHybridStepConfig).
  HybridStep(model::Decoder model, std::unique_ptr<PolicyOptimizer> optimizer,
             HybridStepConfig config);

  // One optimizer step on `batch` (any device; moved to the model's).
  // Mutates the model's parameters, the optimizer state and λ (m3_adapt).
  // `on_policy_rows` ([B], nonzero: sampled with the current version, as
  // OnPolicyRows gives) picks the rows the training–inference mismatch is
  // measured on; undefined: every row. Throws std::invalid_argument when it
  // does not have B elements.
  HybridStepReport Run(const TrainBatch& batch, const torch::Tensor& on_policy_rows = {});

  PolicyOptimizer& optimizer() { return *optimizer_; }
  const HybridStepConfig& config() const { return config_; }
  // λ of the step Run makes next: m3_adapt's, the schedule's, or loss.lambda.
  double lambda() const;
  // m3_adapt's λ controller (its state goes into checkpoints); null when the
  // balancing has no m3_adapt.
  LambdaController* lambda_controller() {
    return lambda_controller_ ? &*lambda_controller_ : nullptr;
  }

 private:
  // The distillation gate's decision for one batch.
  struct Gate {
    bool scored = false;         // the batch has teacher log-probs and the gate is not none
    DistillSelection selection;  // defined when scored

    // Scored, and some position selected: L_D has a backward.
    bool trains() const { return selection.selected_positions > 0; }
  };

  // Token-weighted means of per-micro-batch statistics (entropy, clipping,
  // approximate KL), so a split batch reports what the whole batch would.
  struct TokenMeans {
    double entropy = 0, clip_fraction = 0, approx_kl = 0, tokens = 0;

    void Add(const LossTerms& terms, double response_tokens);
    void WriteTo(HybridStepReport* report) const;
  };

  // Sums of the training–inference mismatch over the micro-batches
  // (InferenceMismatchSums), kept on the device until the step ends.
  struct MismatchSums {
    torch::Tensor sums;  // [Σ |d|, Σ k3, tokens], float64

    void Add(const TokenTerms& tokens, const TrainBatch& part, const torch::Tensor& mask);
    void WriteTo(HybridStepReport* report) const;
  };

  // ComputeTokenTerms under the configured precision, raw logits dropped.
  TokenTerms Forward(const TrainBatch& batch);
  // The gate over the whole batch. RSTG ranks positions by their entropy and
  // divergence: from the forward of the single micro-batch (kept in
  // *first_forward for its backward; null: not kept), or from a no-graph
  // forward of each.
  Gate DecideGate(const TrainBatch& batch, const std::vector<MicroBatch>& micro,
                  std::optional<TokenTerms>* first_forward);
  // Opens the optimizer step: the plan and what the whole batch's means are
  // taken over (reward, distill and SFT counts), and how many micro-batches
  // will accumulate into it.
  void BeginStep(const TrainBatch& batch, const Gate& gate, int64_t step, double lambda,
                 int64_t micro_batches);
  // One micro-batch from its forward: K_DR, m3_mask, aggregate, backward.
  // Adds its token means to *means, its mismatch over the positions where
  // `mismatch_mask` (the whole batch's [B, L]) is 1 to *mismatch and its
  // masked positions to *report.
  void AccumulateMicroBatch(const MicroBatch& part, const TokenTerms& tokens, const Gate& gate,
                            const torch::Tensor& mismatch_mask, KdrMonitor& kdr, TokenMeans* means,
                            MismatchSums* mismatch, HybridStepReport* report);
  // The same through the fused head (fused()): its own forward under the
  // configured precision gives the losses with m3_mask applied and the
  // logit K_DR the monitor records.
  // On a plain step (`separate` false) the head precombines L_R and L_D
  // with the optimizer's weights (PolicyOptimizer::PlainWeights).
  void AccumulateFusedMicroBatch(const MicroBatch& part, const Gate& gate, bool separate,
                                 const torch::Tensor& mismatch_mask, KdrMonitor& kdr,
                                 TokenMeans* means, MismatchSums* mismatch,
                                 HybridStepReport* report);
  // What both end with: the mismatch and token means of the micro-batch,
  // then its backward into the optimizer's step.
  void Accumulate(const MicroBatch& part, const TokenTerms& tokens, const LossTerms& terms,
                  const torch::Tensor& mismatch_mask, TokenMeans* means, MismatchSums* mismatch);
  // The gate's distillation weights and mask for one micro-batch.
  static TermWeights GateWeights(const MicroBatch& part, const Gate& gate);
  // Whether the step at `step` takes ∇L_R and ∇L_D apart: κ is due, or the
  // balancing needs them (m3_project, m3_norm, m3_adapt).
  bool SeparateGradients(int64_t step) const;
  // Whether the training forward runs the fused head: chunks and
  // loss.fused_head. It then makes fewer passes over V than the recomputing
  // node on every step: with the two gradients apart, one logits GEMM and
  // two per loss against one, a K_DR pass and three per backward; on a plain
  // step, one and two for the precombined loss against one and three.
  bool Fuses() const { return config_.loss.vocab_chunk_positions > 0 && config_.loss.fused_head; }

  model::Decoder model_;
  std::unique_ptr<PolicyOptimizer> optimizer_;
  const HybridStepConfig config_;
  std::optional<LambdaController> lambda_controller_;  // m3_adapt
};

}  // namespace kappa::learner
