// Supervised fine-tuning on (prompt, answer) pairs: `kappa sft`, the demo's
// bootstrap of a student that can already follow the task format, and the
// NLL term RSTG adds for verified teacher answers.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.h"

namespace kappa::learner {

struct SftExample {
  std::vector<int64_t> prompt_tokens;  // BOS + prompt
  std::vector<int64_t> answer_tokens;  // answer + EOS
  // Relative chance of being drawn into a minibatch; > 0. Two examples with
  // one prompt and weights f and 1 − f teach that prompt's answers in that
  // mixture (bootstrap.corrupt_fraction).
  double weight = 1.0;
};

struct SftOptions {
  int64_t steps = 100;
  int64_t batch_size = 32;
  double lr = 1e-3;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;  // linear warmup, then cosine decay to 0 at `steps`
  double max_grad_norm = 1.0;  // <= 0 disables clipping
  uint64_t seed = 0;           // minibatch sampling (with replacement, by SftExample::weight)
  std::function<void(int64_t step, double loss)> on_step;  // optional
  // Optional: called after each step (after on_step) with the count of steps
  // done; true ends training there, before `steps` (an early stop at a
  // target accuracy). The learning-rate schedule stays the one over `steps`.
  std::function<bool(int64_t steps_done)> stop_after;
};

// Mean NLL over positions where mask > 0. logits [B, T, V], targets [B, T]
// int64, mask [B, T]. A scalar with graph.
// `count` (optional): the target tokens averaged over (see Aggregate).
torch::Tensor SftNll(const torch::Tensor& logits, const torch::Tensor& targets,
                     const torch::Tensor& mask, torch::Tensor* count = nullptr);

// Trains `model` in place with AdamW on the NLL of the answer tokens only
// (prompt tokens are context, not targets). Returns the loss of the last
// step. Throws std::invalid_argument on empty examples, prompts or answers,
// or sequences longer than the model's max_position_embeddings. Stops early
// when options.stop_after says so.
double SftTrain(model::Decoder& model, const std::vector<SftExample>& examples,
                const SftOptions& options);

// Learning rate at `step` (0-based) of `total_steps`: linear warmup over
// `warmup_steps`, then cosine decay from `lr` to 0.
double WarmupCosineLr(double lr, int64_t step, int64_t warmup_steps, int64_t total_steps);

}  // namespace kappa::learner
