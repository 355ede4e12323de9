// One policy update from separately formed losses: backward L_R, backward
// L_D, combine as ∇L_R + λ∇L_D (exactly the naive gradient), clip, AdamW.
// The two gradients are measured on the way (‖∇L_R‖, ‖∇L_D‖, cosine), which
// is what κ needs.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "learner/algo/hybrid_loss.h"
#include "model/transformer.h"

namespace kappa::learner {

struct StepStats {
  double reward_loss = 0.0;
  double distill_loss = 0.0;
  double grad_norm = 0.0;          // ‖∇L_R + λ∇L_D‖ before clipping
  double reward_grad_norm = 0.0;   // ‖∇L_R‖
  double distill_grad_norm = 0.0;  // ‖∇L_D‖ (unscaled by λ); 0 without a distill graph
  double grad_cosine = 0.0;        // cos(∇L_R, ∇L_D); 0 when either is zero
  double lr = 0.0;                 // learning rate used by this step
};

class PolicyOptimizer {
 public:
  // max_grad_norm <= 0 disables clipping. The learning rate ramps linearly
  // over the first `warmup_steps` steps.
  PolicyOptimizer(model::Decoder model, double lr, double weight_decay, double max_grad_norm,
                  int64_t warmup_steps = 0);

  StepStats Step(const LossTerms& terms, double lambda);

  // Optimizer state (AdamW moments) plus the step counter, for --resume.
  // Save writes `path` atomically (temporary file, then rename).
  void Save(const std::string& path) const;
  void Load(const std::string& path);

  torch::optim::AdamW& optimizer() { return optimizer_; }
  int64_t step() const { return step_; }

 private:
  double LearningRate() const;

  model::Decoder model_;
  std::vector<torch::Tensor> params_;
  torch::optim::AdamW optimizer_;
  double base_lr_;
  double max_grad_norm_;
  int64_t warmup_steps_;
  int64_t step_ = 0;
};

}  // namespace kappa::learner
