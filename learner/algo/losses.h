// The two training signals of docs/algorithms.md §2 as pure tensor functions, so the
// learner can form L_R and L_D separately (separate backward passes for κ and
// K_DR build on exactly these). All per-position tensors are aligned with
// the *target* tokens: position t predicts tokens[:, t + 1].
#pragma once

#include <torch/types.h>

#include <string>

#include "learner/algo/teacher_head.h"

namespace kappa::learner {

enum class Aggregation { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSum };
enum class DistillLoss {
  kReverseKl,         // KL(p ‖ q) over the full vocabulary
  kForwardKl,         // KL(q ‖ p) over the full vocabulary
  kSampledReverseKl,  // the sampled token's log-ratio (on-policy distillation)
  kTopkReverseKl,     // KL on the teacher's top-k, both renormalised there
  kTopkTailReverseKl  // KL over the top-k ids plus one bucket for the rest
};

// Parses "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum";
// throws std::invalid_argument listing the allowed values.
Aggregation ParseAggregation(const std::string& name);
// "reverse_kl" | "forward_kl" | "sampled_reverse_kl" | "topk_reverse_kl" |
// "topk_tail_reverse_kl".
DistillLoss ParseDistillLoss(const std::string& name);
// Whether the loss reads only the teacher's top-k ids and log-probs (the
// compact TOPK rows), not its full distribution.
inline bool IsTopkLoss(DistillLoss loss) {
  return loss == DistillLoss::kTopkReverseKl || loss == DistillLoss::kTopkTailReverseKl;
}

// The teacher's log-probs at each position in the form the teacher server
// sent them (kappa.v1.ScoreForm), never densified:
//   full     logprobs [..., V]
//   sampled  logprobs [...], the sampled token's log q(y)
//   top-k    logprobs [..., k] of topk_ids [..., k], the teacher's k most
//            likely tokens (distinct per position), and tail_logmass [...]
//            (float32), log q of the ids outside them, computed by the
//            teacher (undefined: rebuilt from the k values, TeacherTailLogMass)
//   hidden   hidden [..., D_t], the teacher's final-normed hidden states, and
//            head, its output head: exactly the full rows, rebuilt a chunk
//            of positions at a time (FullLogProbs); logprobs undefined
struct TeacherRows {
  torch::Tensor logprobs;
  torch::Tensor topk_ids;  // int64; defined exactly in the top-k form
  torch::Tensor tail_logmass = {};
  torch::Tensor hidden = {};  // defined exactly in the hidden form
  TeacherHead head = {};      // the hidden form's head

  bool defined() const { return logprobs.defined() || hidden.defined(); }
  bool topk() const { return topk_ids.defined(); }
  bool hidden_form() const { return hidden.defined(); }
  // REQUIRES: defined(). Full rows have one more dimension than the targets;
  // hidden rows are full rows.
  bool full(const torch::Tensor& targets) const {
    return hidden_form() || (!topk() && logprobs.dim() == targets.dim() + 1);
  }
  // log q [..., V] of full or hidden rows: `logprobs`, or the head applied
  // to `hidden` ([rows, V] for the rows held: narrow first).
  // REQUIRES: full rows (std::invalid_argument otherwise).
  torch::Tensor FullLogProbs() const;
  // max_v log q [...] (full, top-k or hidden rows) and log q(targets) [...]
  // (full, sampled or hidden rows), hidden rows a bounded block at a time.
  // std::invalid_argument for a form that does not hold the value.
  torch::Tensor MaxLogProb() const;
  torch::Tensor TargetLogProbs(const torch::Tensor& targets) const;
  // [B, L, ...] → [B·L, ...]. REQUIRES: the batch form (sampled rows [B, L]).
  TeacherRows Flatten() const;
  // Rows [start, start + n) along dimension 0.
  TeacherRows Narrow(int64_t start, int64_t n) const;
  // Rows `rows` (int64 indices) along dimension 0.
  TeacherRows Select(const torch::Tensor& rows) const;
};

// agg over valid positions. per_position, mask: [B, T]; mask is 1.0 at valid
// response positions, 0.0 elsewhere. token-mean: sum / #valid tokens;
// seq-mean-token-mean: mean over sequences (with >= 1 valid token) of the
// per-sequence token mean; seq-mean-token-sum: mean over sequences of the
// per-sequence sum. `count` (optional) receives what the mean was taken over
// — valid tokens, or valid sequences for the seq-mean forms — unclamped and
// without graph: a data-parallel step needs it to weigh ranks (an empty mask
// gives a 0 loss and a 0 count).
torch::Tensor Aggregate(const torch::Tensor& per_position, const torch::Tensor& mask,
                        Aggregation agg, torch::Tensor* count = nullptr);

// The weights w [B, T] with Aggregate(x, mask, agg) = Σ w ⊙ x for every x
// (Aggregate is linear in x): its gradient, taken once with autograd so the
// two cannot drift apart. What the fused head (fused_head.h) weighs each
// position's term by.
torch::Tensor AggregationWeights(const torch::Tensor& mask, Aggregation agg);

// trainer.advantage_std: the standard deviation of a group's G rewards the
// GRPO advantage divides by.
enum class AdvantageStd {
  kPopulation,  // ddof 0: sqrt(Σ (r − mean)² / G) (the default)
  kSample,      // ddof 1: sqrt(Σ (r − mean)² / (G − 1)), as verl, TRL and OpenRLHF
};
// "population" | "sample"; throws std::invalid_argument listing them.
AdvantageStd ParseAdvantageStd(const std::string& name);

// A_i = (r_i - mean_j r_j) / (std_j r_j + eps) per group, std as `std_kind`
// says (norm_std=false: no division). rewards: [num_groups, G] with G > 0
// (std::invalid_argument otherwise); result float32 [num_groups, G],
// computed in float64. A group whose rewards are all equal (whatever the
// value, e.g. 0.7 seven times; a group of one) has no signal: its advantages
// are exactly 0, never the rounding error of its mean divided by eps.
torch::Tensor GrpoAdvantages(const torch::Tensor& rewards, bool norm_std,
                             AdvantageStd std_kind = AdvantageStd::kPopulation, double eps = 1e-6);

struct PpoConfig {
  double clip_low = 0.2;    // ε_low
  double clip_high = 0.28;  // ε_high
  double dual_clip = 3.0;   // c > 1; <= 0 disables the dual clip
};

// Per-token ℓ_R(n) = -min(ρ Â, clip(ρ, 1-ε_low, 1+ε_high) Â), with the
// log-ratio clamped to ±20 before exp and, for Â < 0, the loss capped at
// -c·Â (dual clip). logp_new, logp_old, advantages: [B, T].
torch::Tensor PpoTokenLoss(const torch::Tensor& logp_new, const torch::Tensor& logp_old,
                           const torch::Tensor& advantages, const PpoConfig& config);

// KL(p ‖ q) per position: Σ_v p (log p − log q). student_logits [B, T, V]
// (raw logits; softmax taken here), teacher_logprobs [B, T, V] (log q).
torch::Tensor ReverseKlTokenLoss(const torch::Tensor& student_logits,
                                 const torch::Tensor& teacher_logprobs);
// KL(q ‖ p) per position. A token the teacher gives no mass (log q = −inf)
// contributes 0, by the convention 0 · log 0 = 0 (not 0 · ∞ = NaN).
torch::Tensor ForwardKlTokenLoss(const torch::Tensor& student_logits,
                                 const torch::Tensor& teacher_logprobs);
// ℓ_D(n) = sg(log p(y_n) − log q(y_n)) · log p(y_n); inputs [B, T].
torch::Tensor SampledReverseKlTokenLoss(const torch::Tensor& student_token_logprobs,
                                        const torch::Tensor& teacher_token_logprobs);

// The logits of the ids the distributions compare, [..., vocab_limit]: a
// view of the first vocab_limit columns of logits [..., rows]. The rows above
// are padded embedding rows no token has; dropping them is giving them -inf
// logits, so every softmax over the result puts no mass there (and autograd
// gives them no gradient). vocab_limit 0 or the row count: `logits` itself.
// Throws std::invalid_argument for a limit outside [0, rows].
torch::Tensor VocabLogits(const torch::Tensor& logits, int64_t vocab_limit);

// Log-probs of `targets` [B, T] under logits [B, T, V] (log_softmax + gather).
torch::Tensor TokenLogProbs(const torch::Tensor& logits, const torch::Tensor& targets);
// Entropy H(p_n) per position, [B, T].
torch::Tensor TokenEntropy(const torch::Tensor& logits);

}  // namespace kappa::learner
