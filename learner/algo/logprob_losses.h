// The full-vocabulary terms of losses.h computed from log-probabilities that
// the caller already holds, so one log_softmax over [B, T, V] can feed the
// PPO ratio, the distillation KL and the entropy of the same forward pass.
#pragma once

#include <torch/torch.h>

namespace kappa::learner {

// student_logprobs, teacher_logprobs: [B, T, V]; results [B, T].
torch::Tensor ReverseKlFromLogProbs(const torch::Tensor& student_logprobs,
                                    const torch::Tensor& teacher_logprobs);
torch::Tensor ForwardKlFromLogProbs(const torch::Tensor& student_logprobs,
                                    const torch::Tensor& teacher_logprobs);
torch::Tensor EntropyFromLogProbs(const torch::Tensor& logprobs);
// logprobs [B, T, V], targets [B, T] int64 -> [B, T].
torch::Tensor GatherTokenLogProbs(const torch::Tensor& logprobs, const torch::Tensor& targets);

// log_softmax over the last dimension, in float32 at least: half-precision
// logits lose too much in the normalizer.
torch::Tensor StableLogSoftmax(const torch::Tensor& logits);

}  // namespace kappa::learner
