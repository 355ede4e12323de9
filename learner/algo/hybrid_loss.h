// The two losses of one training batch from a single forward pass: the GRPO
// reward loss L_R and the teacher distillation loss L_D, kept apart so the
// caller can backward them separately (κ, balancing) or together (naive).
#pragma once

#include <torch/torch.h>

#include "learner/algo/losses.h"
#include "learner/algo/train_batch.h"
#include "model/transformer.h"

namespace kappa::learner {

struct LossConfig {
  Aggregation aggregation = Aggregation::kTokenMean;
  PpoConfig ppo;
  DistillLoss distill = DistillLoss::kReverseKl;
  double lambda = 1.0;
  // Student log-probs are taken under softmax(logits / temperature), the
  // distribution the rollout sampled from (so the PPO ratio is 1 on-policy).
  double temperature = 1.0;
};

struct LossTerms {
  // Scalars with graph. distill_loss is a graph-less zero when the batch has
  // no teacher log-probs (check requires_grad() before backward).
  torch::Tensor reward_loss;
  torch::Tensor distill_loss;
  torch::Tensor logits;  // [B, L, V] raw model logits, with graph
  // Over response tokens (token mean), without graph.
  double entropy = 0.0;        // H(p_n) under the temperature
  double clip_fraction = 0.0;  // share of tokens where the PPO clip is active
  double approx_kl = 0.0;      // k3 estimate of KL(π_old ‖ π_θ)
};

// Runs the model once on `batch` (moved to the model's device) and computes
// L_R = agg(PpoTokenLoss) and L_D = agg(distillation per-token loss).
// Full-vocabulary teacher log-probs support every DistillLoss; sampled-token
// teacher log-probs ([B, L]) only kSampledReverseKl (std::invalid_argument
// otherwise, and on a teacher vocabulary that differs from the model's).
LossTerms ComputeLossTerms(model::Decoder& model, const TrainBatch& batch,
                           const LossConfig& config);

}  // namespace kappa::learner
