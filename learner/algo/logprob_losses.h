// The full-vocabulary terms of losses.h computed from log-probabilities that
// the caller already holds, so one log_softmax over [B, T, V] can feed the
// PPO ratio, the distillation KL and the entropy of the same forward pass.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace kappa::learner {

// student_logprobs, teacher_logprobs: [B, T, V]; results [B, T]. In the
// forward KL Σ_v q (log q − log p), an id with log q = −inf contributes 0
// (0 · log 0 = 0), and nothing to the gradient.
torch::Tensor ReverseKlFromLogProbs(const torch::Tensor& student_logprobs,
                                    const torch::Tensor& teacher_logprobs);
torch::Tensor ForwardKlFromLogProbs(const torch::Tensor& student_logprobs,
                                    const torch::Tensor& teacher_logprobs);
// The top-k losses read the student's log-probs at the teacher's k ids,
// set_logprobs = log p gathered at topk_ids, [..., k], and the teacher's
// there, [..., k] (TeacherRows in the top-k form; docs/algorithms.md §2.2).

// KL(p̃ ‖ q̃) with both distributions restricted to the k ids and
// renormalised there. A per-position constant added to either side cancels.
torch::Tensor TopkReverseKl(const torch::Tensor& student_set_logprobs,
                            const torch::Tensor& teacher_set_logprobs);
// KL over k + 1 buckets, the k ids and one tail bucket holding the rest of
// each distribution (p_T = 1 − Σ_S p; q_T as TeacherTailLogMass gives it):
//   Σ_{v∈S} p_v (log p_v − log q_v) + p_T (log p_T − log q_T).
// The student's side must be exact log-probs (normalised over the whole
// vocabulary). teacher_tail_logmass [...]: the teacher's log q_T as it sent
// it (TeacherRows::tail_logmass), or undefined.
torch::Tensor TopkTailReverseKl(const torch::Tensor& student_set_logprobs,
                                const torch::Tensor& teacher_set_logprobs,
                                const torch::Tensor& teacher_tail_logmass = {});
// log of the mass outside the set, log(1 − Σ exp(set_logprobs)), [...]. The
// mass is floored at kTailFloor: a teacher whose k log-probs round to a sum
// of 1 or more (bfloat16 rows) has an empty tail, not a negative one.
inline constexpr double kTailFloor = 1e-12;
torch::Tensor TailLogMass(const torch::Tensor& set_logprobs);
// The teacher's log q_T in the dtype of its set log-probs: `sent` (the
// float32 value the teacher computed over the ids outside its top-k) as it
// is, in log space however small, except that an empty tail (k = V, −inf on
// the wire) takes log kTailFloor, the student's floor, so it stays finite; undefined `sent`:
// TailLogMass(teacher_set_logprobs), which on a peaked bfloat16 row is off by many nats
// (docs/algorithms.md §2.4), so the learner's service path always has `sent`.
torch::Tensor TeacherTailLogMass(const torch::Tensor& teacher_set_logprobs,
                                 const torch::Tensor& sent);
// set_logprobs − logsumexp(set_logprobs): the distribution restricted to the
// set and renormalised there, [..., k].
torch::Tensor Renormalized(const torch::Tensor& set_logprobs);
torch::Tensor EntropyFromLogProbs(const torch::Tensor& logprobs);
// logprobs [B, T, V], targets [B, T] int64 -> [B, T].
torch::Tensor GatherTokenLogProbs(const torch::Tensor& logprobs, const torch::Tensor& targets);

// log_softmax over the last dimension, in float32 at least: half-precision
// logits lose too much in the normalizer.
torch::Tensor StableLogSoftmax(const torch::Tensor& logits);

}  // namespace kappa::learner
