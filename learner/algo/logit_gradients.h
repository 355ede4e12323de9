// Closed-form logit gradients of the per-position loss terms (docs/algorithms.md §2.3):
// g_R(n) = ∂ℓ_R(n)/∂z_n and g_D(n) = ∂ℓ_D(n)/∂z_n. They are what the cheap
// K_DR estimators multiply, so they must equal autograd's (tested), including
// the temperature the losses are taken under: log p = log_softmax(z / τ), so
// every gradient with respect to the raw logits z carries a factor 1/τ.
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "learner/algo/losses.h"

namespace kappa::learner {

// c_n = ∂ℓ_R(n)/∂log π_θ(y_n) of the PPO term: −Â_n ρ_n where the unclipped
// branch is active, 0 where the clip, the dual-clip cap or the ±20 log-ratio
// clamp holds the loss constant. On policy (ρ = 1) this is −Â_n.
// All inputs [B, T].
torch::Tensor RewardLogProbCoefficient(const torch::Tensor& logp_new, const torch::Tensor& logp_old,
                                       const torch::Tensor& advantages, const PpoConfig& config);

// g_R(n) = c_n (e_{y_n} − p_n) / τ. logprobs [B, T, V] = log_softmax(z / τ),
// targets [B, T] = y_n, coefficient [B, T] = c_n.
torch::Tensor RewardLogitGradient(const torch::Tensor& logprobs, const torch::Tensor& targets,
                                  const torch::Tensor& coefficient, double temperature);

// g_D(n) for the selected distillation loss, [B, T, V]:
//   reverse_kl:           p ⊙ (log p − log q − KL(p‖q)) / τ
//   forward_kl:           (p − q) / τ
//   sampled_reverse_kl:   k1 (e_y − p) / τ, k1 = log p(y) − log q(y) (held constant)
//   topk_reverse_kl:      the reverse-KL form on the teacher's k ids with both
//                         distributions renormalised there, 0 off the set
//   topk_tail_reverse_kl: p_u (r_b(u) − KL_tail) / τ, where b(u) is u's own
//                         bucket for u in the set and the tail bucket else,
//                         r_b = log p_b − log q_b (exact where both tails
//                         lie above kTailFloor)
// logprobs [B, T, V] = log_softmax(z / τ). teacher: full or top-k rows, or
// sampled ones (sampled_reverse_kl only; std::invalid_argument otherwise).
torch::Tensor DistillLogitGradient(const torch::Tensor& logprobs, const TeacherRows& teacher,
                                   const torch::Tensor& targets, DistillLoss kind,
                                   double temperature);

}  // namespace kappa::learner
