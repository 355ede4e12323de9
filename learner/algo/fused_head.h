// The chunked vocabulary head fused with the step's losses (issue 53 item
// 2; docs/algorithms.md §2.4 "Fused"): one pass over the vocabulary per
// chunk of positions computes the terms, both closed-form logit gradients,
// the cheap K_DR and m3_mask's weights, and turns the weighted gradients
// into ∂/∂h and ∂/∂W right there, as fused linear-cross-entropy kernels do.
// The backward then only scales what the forward stored: no second pass
// over V, no recomputed logits, no recomputed teacher head.
//
// The losses are known in the forward because each is a weighted sum of
// per-position terms whose weights do not depend on the parameters:
//   L_R = Σ_n a_R(n) m_R(n) ℓ_R(n),   L_D = Σ_n a_D(n) m_D(n) ℓ_D(n),
// a = the aggregation's weights (AggregationWeights) times the gate's, m =
// m3_mask's weights from K_DR(n) (1 where the mask is off), held constant
// as the step holds them. g_R(n) and g_D(n) are logit_gradients.h's, so
//   ∂L_R/∂z_n = a_R m_R g_R(n),  ∂L_R/∂h_n = (∂L_R/∂z_n) W,  ∂L_R/∂W = Σ_n (∂L_R/∂z_n)ᵀ h_n,
// and the same for L_D. The price is memory: ∂/∂W of each loss, [V, D]
// float32, lives from the forward to the backward (none for a frozen
// head, student.lora).
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "learner/algo/balance.h"
#include "learner/algo/cross_kernel.h"
#include "learner/algo/losses.h"

namespace kappa::learner {

struct FusedHeadInputs {
  torch::Tensor hidden;                    // [M, D] with graph: the response positions' head inputs
  torch::Tensor weight;                    // [V, D] with graph, or frozen (no ∂/∂W)
  torch::Tensor targets;                   // [M] int64 in [0, V)
  torch::Tensor old_logprobs, advantages;  // [M] the PPO term's
  torch::Tensor reward_weights;            // [M] a_R(n)
  TeacherRows teacher;                     // [M, ...] or undefined: no L_D
  torch::Tensor distill_weights;           // [M] a_D(n), with teacher rows
  DistillLoss distill = DistillLoss::kReverseKl;
  PpoConfig ppo;
  double temperature = 1.0;
  int64_t chunk_positions = 1024;  // > 0
  // m3_mask: which term its weights multiply, from which K_DR estimator
  // (logit or last_layer; BalanceConfig's), at which temperature.
  bool mask = false;
  BalanceConfig::MaskTarget mask_target = BalanceConfig::MaskTarget::kReward;
  KdrEstimator mask_estimator = KdrEstimator::kLogit;
  double mask_temperature = 0.0;
  // A plain step's one combined backward (PolicyOptimizer::PlainWeights):
  // with `combine`, the forward stores a single gradient, that of
  // combine_reward · L_R + combine_distill · L_D, which
  // FusedHeadOutputs::combined_loss carries; L_R and L_D are then values
  // without graph. Per chunk that is one ∂/∂z, so two gradient GEMMs in
  // all instead of two per loss.
  bool combine = false;
  double combine_reward = 0.0, combine_distill = 0.0;
};

struct FusedHeadOutputs {
  torch::Tensor reward_loss;   // scalar L_R, with graph
  torch::Tensor distill_loss;  // scalar L_D, with graph; undefined without teacher rows
  // With FusedHeadInputs::combine: the scalar combine_reward · L_R +
  // combine_distill · L_D, with graph (reward_loss, distill_loss without).
  torch::Tensor combined_loss;
  // [M], no graph: log π_θ(y_n), ℓ_R(n), ℓ_D(n) (undefined without teacher
  // rows), H(p_n), the logit K_DR g_R(n)·g_D(n) (undefined without teacher
  // rows) and m3_mask's weights (undefined with the mask off).
  torch::Tensor token_logprobs, reward, distill, entropy, logit_kernel, mask_weights;
};

// The losses and per-position values above, p = softmax(h Wᵀ / τ) in
// float32 at least, the products under the caller's autocast state (as the
// unfused head's). Throws std::invalid_argument on mismatched shapes, τ <= 0,
// chunk_positions <= 0, or teacher rows the loss cannot read.
FusedHeadOutputs ComputeFusedHead(const FusedHeadInputs& in);

}  // namespace kappa::learner
