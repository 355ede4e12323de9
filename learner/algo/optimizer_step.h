// One policy update from separately formed losses. Measuring (κ) or
// balancing (M3) steps backward L_R, L_D and L_SFT separately and combine
// them per a GradientPlan (the naive plan gives exactly ∇(w_R L_R + λ L_D +
// μ L_SFT)); plain steps backward the weighted sum once. Then clip, AdamW.
#pragma once

#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/collectives.h"
#include "learner/algo/balance.h"
#include "learner/algo/hybrid_loss.h"
#include "learner/algo/lr_schedule.h"
#include "learner/algo/sharded_adamw.h"
#include "model/transformer.h"

namespace kappa::learner {

struct StepStats {
  double reward_loss = 0.0;
  double distill_loss = 0.0;
  double sft_loss = 0.0;
  double grad_norm = 0.0;          // ‖g‖ of the combined gradient before clipping
  double lr = 0.0;                 // learning rate used by this step
  // Only when the step measured the signals apart (`separate`):
  bool measured = false;
  double reward_grad_norm = 0.0;   // ‖w_R ∇L_R‖ before any projection
  double distill_grad_norm = 0.0;  // ‖∇L_D‖ (unscaled by λ); 0 without a distill graph
  double grad_cosine = 0.0;        // cos(∇L_R, ∇L_D); 0 when either is zero
  double balanced_reward_grad_norm = 0.0;  // ‖g_R′‖ after m3_project
  double distill_scale = 0.0;      // the coefficient applied to ∇L_D (λ or m3_norm's s)
  bool projected = false;          // m3_project changed g_R this step
  // Empty when the update was applied. Otherwise the first of reward_loss,
  // distill_loss, sft_loss, grad_norm (in that order) that was NaN or ±inf:
  // the step was skipped, nothing applied (PolicyOptimizer::FinishStep).
  std::string nonfinite_term;
  bool skipped() const { return !nonfinite_term.empty(); }
  // Host wall seconds of the step's backward passes, summed over its
  // micro-batches (L_R, L_D, L_SFT apart when measured; one combined pass
  // is counted as L_R's), and of FinishStep (combine, clip, AdamW). On
  // CUDA, work is asynchronous: a phase holds what it waited for.
  double backward_seconds[3] = {0.0, 0.0, 0.0};
  double update_seconds = 0.0;
  // κ = ‖∇L_R‖ / ‖∇L_D‖ (docs/algorithms.md §3.1, with the reward weight w_R as part of
  // L_R); absent when not measured or ‖∇L_D‖ = 0.
  std::optional<double> kappa() const {
    if (!measured || !(distill_grad_norm > 0)) return std::nullopt;
    return reward_grad_norm / distill_grad_norm;
  }
  // The ratio the update applied: ‖g_R′‖ / ‖s ∇L_D‖ (κ/λ for naive mixing,
  // κ_target under m3_norm). Magnitude drowning is about this one: a small λ
  // drowns the distillation signal whatever the raw κ.
  std::optional<double> kappa_effective() const {
    if (!measured || !(distill_grad_norm > 0) || !(distill_scale > 0)) return std::nullopt;
    return balanced_reward_grad_norm / (distill_scale * distill_grad_norm);
  }
};

class PolicyOptimizer {
 public:
  // max_grad_norm <= 0 disables clipping. Step k (0-based, counted across a
  // resume: Save/Load keep the counter) applies the rate schedule.At(k).
  PolicyOptimizer(model::Decoder model, const LearningRateSchedule& schedule, double weight_decay,
                  double max_grad_norm);
  // A constant rate `lr` after a linear warm-up over `warmup_steps`.
  PolicyOptimizer(model::Decoder model, double lr, double weight_decay, double max_grad_norm,
                  int64_t warmup_steps = 0);

  // Data parallel: from now on each Step sums the ranks' gradients before
  // anything reads them (norms, κ, M3, clipping), so every rank applies the
  // same update: that of one step over all ranks' batches together. Starts
  // by broadcasting rank 0's parameters. Not owned; null: one process.
  void set_collectives(dist::Collectives* collectives);

  // learner.shard. From now on this rank holds and updates only its share
  // of AdamW's state (sharded_adamw.h) and, after each update, all-gathers
  // the parameters over the collectives.
  //  kOptimizer: everything before the update (the summed gradient, κ, M3,
  //    the clip) is as unsharded.
  //  kGradients: after each backward pass (each signal, each micro-batch)
  //    the gradient is reduce-scattered, and the rank keeps only its
  //    segment of each signal's sum; backward writes into one full-size
  //    buffer however many signals the step measures. Every global
  //    quantity (norms, cosine, κ, m3_project, m3_norm, the clip, the
  //    non-finite check) comes from per-segment float64 partial sums summed
  //    over the ranks (CombineGradients' sum_over_shards).
  // REQUIRES: before the first step and before Load; set_collectives with
  // a group of `world_size` ranks, this one `rank`, before the first step.
  void ShardState(ShardStage stage, int rank, int world_size);
  // The elements whose AdamW state this rank holds; nullopt unsharded.
  std::optional<ShardRange> optimizer_shard() const {
    return sharded_ ? std::optional<ShardRange>(sharded_->range()) : std::nullopt;
  }
  bool gradients_sharded() const { return sharded_ && shard_stage_ == ShardStage::kGradients; }

  // separate = false with a plan that neither projects nor normalizes takes
  // one backward pass of the weighted sum (no κ); otherwise three.
  StepStats Step(const LossTerms& terms, const GradientPlan& plan, bool separate);

  // The same step accumulated over micro-batches, whose graphs need not
  // coexist: BeginStep with what the whole batch's means are taken over (its
  // reward, distill and SFT counts on this rank, as LossTerms' counts would
  // give), then AccumulateStep once per micro-batch (backward now; the
  // graph can go), then FinishStep. Each micro-batch's mean is weighted by
  // its count over the total, so the update is that of one Step on the whole
  // batch. Step(terms, …) is exactly these three calls.
  // A BeginStep abandons any step left open (one whose micro-batch threw).
  // `micro_batches`: how many AccumulateStep calls this rank will make.
  // Under sharded gradients each one reduces over the ranks, so the ranks
  // agree here on the most any of them makes, and FinishStep pads this
  // rank's with empty reductions (collective: every rank calls BeginStep).
  void BeginStep(const GradientPlan& plan, bool separate, const torch::Tensor& reward_count,
                 const torch::Tensor& distill_count, const torch::Tensor& sft_count,
                 int64_t micro_batches = 1);
  // REQUIRES: a step open (BeginStep). Runs the backward pass(es) now.
  void AccumulateStep(const LossTerms& micro_batch);
  // REQUIRES: a step open. Combines, clips and applies the update; closes the step.
  // A non-finite step is skipped: when a loss term or the combined gradient's
  // norm is NaN or ±inf, the parameters, the AdamW moments and step() stay
  // bitwise as they were and the stats name the term (StepStats::skipped).
  // Data parallel: the terms and the norm are the ranks' sums, so every rank
  // skips the same steps.
  StepStats FinishStep();

  // The weights of one micro-batch's L_R and L_D in the open step's one
  // combined backward: the plan's w_R and λ (or s), each times the
  // micro-batch's share c / C of its term's count over the step (every
  // rank's). What a fused head folds into its one stored gradient
  // (LossTerms::combined_loss). REQUIRES: a step open that is not measured
  // (std::logic_error otherwise).
  std::pair<double, double> PlainWeights(const torch::Tensor& reward_count,
                                         const torch::Tensor& distill_count) const;
  // The naive step L_R + λ L_D, measured.
  StepStats Step(const LossTerms& terms, double lambda);

  // Optimizer state (AdamW moments) plus the step counter, for --resume.
  // Save writes `path` atomically (temporary file, then rename). Sharded,
  // each rank writes its own shard; Load takes the same shard back, or its
  // share of an unsharded run's state, and refuses a shard of another
  // layout, or a shard where this optimizer is unsharded (runtime_error).
  void Save(const std::string& path) const;
  void Load(const std::string& path);
  // Resuming at another world size: `paths` are every rank's optimizer
  // state of one checkpoint of the earlier run, in any order. A sharded
  // set is resharded: this rank takes its share of it (or, unsharded, the
  // whole state assembled from it); an unsharded run's state (each of its
  // ranks held all of it) is read from the first file as Load reads it.
  // Then the step counter is the set's. Throws std::runtime_error naming
  // the file, or what the set lacks (a rank's shard, one layout).
  // REQUIRES: as Load.
  void LoadResharded(const std::vector<std::string>& paths);

  torch::optim::AdamW& optimizer() { return optimizer_; }
  // The trainable parameters this optimizer steps (requires_grad, one dtype and device).
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  int64_t step() const { return step_; }

 private:
  // FinishStep's work: combine the pending step's gradients, clip, AdamW.
  StepStats CombineAndApply();
  // Clips the gradients in .grad to max_grad_norm_ given their norm, then AdamW.
  void ClipAndApply(double grad_norm, StepStats* stats);
  // Load's sharded half: this rank's shard, or its share of unsharded state.
  void LoadShard(torch::serialize::InputArchive& archive);
  // LoadResharded's unsharded end: every parameter's AdamW state cut out of
  // the whole flat moments (parameter order).
  void SetUnshardedMoments(const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq,
                           int64_t adam_step);
  // Gradient storage: each parameter's .grad is a view into one flat buffer
  // per signal, so backward accumulates straight into it and the norms, dot
  // products and combinations of the step are single ops on flat vectors.
  struct FlatGradient {
    torch::Tensor flat;                // [number of trainable elements]
    std::vector<torch::Tensor> views;  // one per parameter, shaped like it
  };
  FlatGradient MakeFlatGradient() const;
  // Points every parameter's .grad at `buffer` (zeroed first if `zero`).
  void AttachGradients(FlatGradient& buffer, bool zero);
  // Signal k's (0 L_R, 1 L_D, 2 L_SFT; the plain step's one weighted sum
  // is 0's) backward of `loss` (undefined: none on this micro-batch),
  // keeping the graph if `retain_graph`. Unsharded: accumulates into the
  // signal's buffer. Sharded gradients: into the zeroed backward buffer,
  // reduced over the ranks into the signal's segment (ReduceIntoSegment)
  // when some rank has the signal this step, even where `loss` is absent.
  void BackwardSignal(int k, const torch::Tensor& loss, bool retain_graph);
  // Sharded gradients: reduce-scatters the backward buffer and adds this
  // rank's segment of the sum to signal k's. Collective.
  void ReduceIntoSegment(int k);
  // Sharded gradients: the empty reductions that bring this rank's count
  // up to the step's most (BeginStep's micro_batches). Collective.
  void PadReductions();
  // REQUIRES: sharded; throws std::logic_error unless the collectives are
  // the shard's group (its size, this rank).
  void CheckShardCollectives() const;
  // The summed gradient the update applies, once combined: the reward
  // buffer, or (sharded gradients) this rank's segment of it.
  torch::Tensor& UpdateGradient();

  // The step between BeginStep and FinishStep.
  struct PendingStep {
    bool open = false;
    GradientPlan plan;
    bool measured = false;       // one backward per signal, into its own buffer
    torch::Tensor totals;        // [C_R, C_D, C_S], float64 on the device: over every rank
    torch::Tensor loss_sums;     // [s_R, s_D, s_S]: Σ mean · count over micro-batches
    bool any_distill = false;    // a distillation graph on some micro-batch of this rank
    bool any_sft = false;
    bool started[3] = {false, false, false};       // signal k's buffer holds this step's sum
    double backward_seconds[3] = {0.0, 0.0, 0.0};  // StepStats::backward_seconds
    // Data parallel: whether some rank has term k (L_R, L_D, L_SFT) this
    // step, from the summed counts: what every rank sums or reduces.
    bool anywhere[3] = {false, false, false};
    // Sharded gradients: the reductions made and to make, per signal.
    int64_t rounds_done = 0, rounds_total = 0;
  };
  // Sharded gradients: whether signal k is reduce-scattered this step (the
  // same on every rank): L_R's always, the others when measured apart and
  // some rank has them.
  bool Reduces(int k) const { return k == 0 || (pending_.measured && pending_.anywhere[k]); }

  model::Decoder model_;
  std::vector<torch::Tensor> params_;
  PendingStep pending_;
  dist::Collectives* collectives_ = nullptr;
  FlatGradient reward_grad_, distill_grad_, sft_grad_;  // unsharded gradients, per signal
  // Sharded gradients: what every backward pass writes into (full size,
  // padded), and, during a step, this rank's segment of each signal's sum
  // over the ranks (the last one reduced may be the buffer's own segment).
  FlatGradient backward_buffer_;
  torch::Tensor segments_[3];
  torch::optim::AdamW optimizer_;          // unsharded: its state; sharded: its options only
  std::unique_ptr<ShardedAdamW> sharded_;  // learner.shard: optimizer or gradients
  ShardStage shard_stage_ = ShardStage::kOptimizer;
  LearningRateSchedule schedule_;
  double max_grad_norm_;
  int64_t step_ = 0;
};

}  // namespace kappa::learner
