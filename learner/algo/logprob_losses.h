// The full-vocabulary terms of losses.h computed from log-probabilities that
// the caller already holds, so one log_softmax over [B, T, V] can feed the
// PPO ratio, the distillation KL and the entropy of the same forward pass.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace kappa::learner {

// student_logprobs, teacher_logprobs: [B, T, V]; results [B, T].
torch::Tensor ReverseKlFromLogProbs(const torch::Tensor& student_logprobs,
                                    const torch::Tensor& teacher_logprobs);
torch::Tensor ForwardKlFromLogProbs(const torch::Tensor& student_logprobs,
                                    const torch::Tensor& teacher_logprobs);
// KL(p̃ ‖ q̃) with both distributions restricted to the teacher's top-k
// tokens at each position and renormalised there (docs/algorithms.md §2.2).
torch::Tensor TopkReverseKlFromLogProbs(const torch::Tensor& student_logprobs,
                                        const torch::Tensor& teacher_logprobs, int64_t k);
// The teacher's top-k token ids per position, [B, T, min(k, V)].
torch::Tensor TopkIndices(const torch::Tensor& teacher_logprobs, int64_t k);
// log of the distribution restricted to `indices` and renormalised: [..., k].
torch::Tensor RenormalizedOn(const torch::Tensor& logprobs, const torch::Tensor& indices);
torch::Tensor EntropyFromLogProbs(const torch::Tensor& logprobs);
// logprobs [B, T, V], targets [B, T] int64 -> [B, T].
torch::Tensor GatherTokenLogProbs(const torch::Tensor& logprobs, const torch::Tensor& targets);

// log_softmax over the last dimension, in float32 at least: half-precision
// logits lose too much in the normalizer.
torch::Tensor StableLogSoftmax(const torch::Tensor& logits);

}  // namespace kappa::learner
