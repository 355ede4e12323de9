#include "learner/algo/losses.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "learner/algo/logprob_losses.h"

namespace kappa::learner {
namespace {

// Beyond ±20 the ratio is e^20 ≈ 5e8: the sample is useless for the update
// and exp would overflow in half precision.
constexpr double kMaxLogRatio = 20.0;

void CheckSameShape(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  if (a.sizes() != b.sizes()) {
    throw std::invalid_argument(std::string(what) + ": shape mismatch " +
                                c10::str(a.sizes()) + " vs " + c10::str(b.sizes()));
  }
}

}  // namespace

Aggregation ParseAggregation(const std::string& name) {
  if (name == "token-mean") return Aggregation::kTokenMean;
  if (name == "seq-mean-token-mean") return Aggregation::kSeqMeanTokenMean;
  if (name == "seq-mean-token-sum") return Aggregation::kSeqMeanTokenSum;
  throw std::invalid_argument("unknown loss aggregation '" + name +
                              "' (allowed: token-mean, seq-mean-token-mean, "
                              "seq-mean-token-sum)");
}

DistillLoss ParseDistillLoss(const std::string& name) {
  if (name == "reverse_kl") return DistillLoss::kReverseKl;
  if (name == "forward_kl") return DistillLoss::kForwardKl;
  if (name == "sampled_reverse_kl") return DistillLoss::kSampledReverseKl;
  if (name == "topk_reverse_kl") return DistillLoss::kTopkReverseKl;
  if (name == "topk_tail_reverse_kl") return DistillLoss::kTopkTailReverseKl;
  throw std::invalid_argument("unknown distillation loss '" + name +
                              "' (allowed: reverse_kl, forward_kl, sampled_reverse_kl, "
                              "topk_reverse_kl, topk_tail_reverse_kl)");
}

namespace {

// `rows` with each of its tensors replaced by fn(tensor); the head is kept.
template <typename Fn>
TeacherRows MapRows(const TeacherRows& rows, Fn fn) {
  if (!rows.defined()) return rows;
  TeacherRows out;
  out.head = rows.head;
  for (auto [from, to] :
       {std::pair{&rows.logprobs, &out.logprobs}, std::pair{&rows.topk_ids, &out.topk_ids},
        std::pair{&rows.tail_logmass, &out.tail_logmass}, std::pair{&rows.hidden, &out.hidden}}) {
    if (from->defined()) *to = fn(*from);
  }
  return out;
}

}  // namespace

torch::Tensor TeacherRows::FullLogProbs() const {
  if (hidden_form()) return head.LogProbs(hidden);
  if (!defined() || topk() || logprobs.dim() < 2) {
    throw std::invalid_argument("TeacherRows::FullLogProbs: needs full or hidden rows, got " +
                                (defined() ? c10::str(logprobs.sizes()) : std::string("none")) +
                                (topk() ? " (top-k)" : ""));
  }
  return logprobs;
}

torch::Tensor TeacherRows::MaxLogProb() const {
  if (hidden_form()) return head.MaxLogProb(hidden);
  if (!defined() || logprobs.dim() < 2) {
    throw std::invalid_argument(
        "TeacherRows::MaxLogProb: needs full, top-k or hidden rows (sampled rows hold only the "
        "sampled token)");
  }
  return std::get<0>(logprobs.max(-1));  // the top-1 is among the top-k
}

torch::Tensor TeacherRows::TargetLogProbs(const torch::Tensor& targets) const {
  if (hidden_form()) return head.TargetLogProbs(hidden, targets);
  if (!defined() || topk()) {
    throw std::invalid_argument(
        "TeacherRows::TargetLogProbs: needs q(y) of the sampled token, which top-k rows may not "
        "hold");
  }
  return full(targets) ? GatherTokenLogProbs(logprobs, targets) : logprobs;
}

TeacherRows TeacherRows::Flatten() const {
  return MapRows(*this, [](const torch::Tensor& t) {
    // Per-position tensors ([B, L]) to [B·L]; per-id ones ([B, L, X]) to [B·L, X].
    return t.dim() == 2 ? t.reshape({-1}) : t.reshape({-1, t.size(-1)});
  });
}

TeacherRows TeacherRows::Select(const torch::Tensor& rows) const {
  return MapRows(*this, [&](const torch::Tensor& t) { return t.index_select(0, rows); });
}

TeacherRows TeacherRows::Narrow(int64_t start, int64_t n) const {
  return MapRows(*this, [&](const torch::Tensor& t) { return t.narrow(0, start, n); });
}

torch::Tensor AggregationWeights(const torch::Tensor& mask, Aggregation agg) {
  torch::AutoGradMode enable_grad(true);
  const torch::Tensor x =
      torch::zeros(mask.sizes(), mask.options().dtype(torch::kFloat32)).requires_grad_(true);
  return torch::autograd::grad({Aggregate(x, mask.detach(), agg)}, {x})[0];
}

torch::Tensor Aggregate(const torch::Tensor& per_position, const torch::Tensor& mask,
                        Aggregation agg, torch::Tensor* count) {
  CheckSameShape(per_position, mask, "Aggregate");
  if (per_position.dim() != 2) {
    throw std::invalid_argument("Aggregate: expected [B, T], got " +
                                c10::str(per_position.sizes()));
  }
  const torch::Tensor weight = mask.to(per_position.scalar_type());
  // masked_fill first: padded positions may hold inf/NaN (e.g. a KL against a
  // placeholder teacher row) and NaN * 0 would poison the sum.
  const torch::Tensor masked = per_position.masked_fill(weight == 0, 0) * weight;
  if (agg == Aggregation::kTokenMean) {
    const torch::Tensor tokens = weight.sum();
    if (count != nullptr) *count = tokens.detach();
    return masked.sum() / tokens.clamp_min(1);
  }
  const torch::Tensor seq_sum = masked.sum(1);
  const torch::Tensor seq_tokens = weight.sum(1);
  // Sequences without a valid token take no part in the mean over sequences.
  const torch::Tensor seq_valid = (seq_tokens > 0).to(per_position.scalar_type());
  const torch::Tensor per_seq = agg == Aggregation::kSeqMeanTokenMean
                                    ? seq_sum / seq_tokens.clamp_min(1)
                                    : seq_sum;
  const torch::Tensor sequences = seq_valid.sum();
  if (count != nullptr) *count = sequences.detach();
  return (per_seq * seq_valid).sum() / sequences.clamp_min(1);
}

AdvantageStd ParseAdvantageStd(const std::string& name) {
  if (name == "population") return AdvantageStd::kPopulation;
  if (name == "sample") return AdvantageStd::kSample;
  throw std::invalid_argument("unknown advantage std '" + name + "' (allowed: population, sample)");
}

torch::Tensor GrpoAdvantages(const torch::Tensor& rewards, bool norm_std, AdvantageStd std_kind,
                             double eps) {
  if (rewards.dim() != 2 || rewards.size(1) == 0) {
    throw std::invalid_argument("GrpoAdvantages: rewards must be [num_groups, G] with G > 0, got " +
                                c10::str(rewards.sizes()));
  }
  // float64: the division by std + eps amplifies the mean's rounding error.
  const torch::Tensor r = rewards.to(torch::kFloat64);
  // All rewards equal (a group of one included): exactly 0. Computed, the
  // mean's rounding error (in float32, one ulp of 0.7 × 7) over std + 1e-6
  // came out as an advantage of 0.06.
  const auto [lowest, highest] = r.aminmax(1, /*keepdim=*/true);
  const torch::Tensor tied = lowest == highest;
  torch::Tensor advantages = r - r.mean(1, /*keepdim=*/true);
  if (norm_std && rewards.size(1) > 1) {
    const bool unbiased = std_kind == AdvantageStd::kSample;
    advantages = advantages / (r.std(1, unbiased, /*keepdim=*/true) + eps);
  }
  return advantages.masked_fill(tied, 0.0).to(torch::kFloat32);
}

torch::Tensor PpoTokenLoss(const torch::Tensor& logp_new, const torch::Tensor& logp_old,
                           const torch::Tensor& advantages, const PpoConfig& config) {
  CheckSameShape(logp_new, logp_old, "PpoTokenLoss logp_old");
  CheckSameShape(logp_new, advantages, "PpoTokenLoss advantages");
  if (config.clip_low < 0 || config.clip_low >= 1 || config.clip_high < 0) {
    throw std::invalid_argument("PpoTokenLoss: need 0 <= clip_low < 1 and clip_high >= 0");
  }
  if (config.dual_clip > 0 && config.dual_clip <= 1) {
    throw std::invalid_argument("PpoTokenLoss: dual_clip must be > 1 (or <= 0 to disable), got " +
                                std::to_string(config.dual_clip));
  }
  const torch::Tensor log_ratio = (logp_new - logp_old).clamp(-kMaxLogRatio, kMaxLogRatio);
  const torch::Tensor ratio = log_ratio.exp();
  const torch::Tensor unclipped = -advantages * ratio;
  const torch::Tensor clipped =
      -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high);
  torch::Tensor loss = torch::max(unclipped, clipped);
  if (config.dual_clip > 0) {
    // With Â < 0 and ρ ≫ 1 the loss grows without bound; the dual clip caps it.
    const torch::Tensor capped = torch::min(loss, -config.dual_clip * advantages);
    loss = torch::where(advantages < 0, capped, loss);
  }
  return loss;
}

torch::Tensor ReverseKlTokenLoss(const torch::Tensor& student_logits,
                                 const torch::Tensor& teacher_logprobs) {
  CheckSameShape(student_logits, teacher_logprobs, "ReverseKlTokenLoss");
  return ReverseKlFromLogProbs(StableLogSoftmax(student_logits), teacher_logprobs);
}

torch::Tensor ForwardKlTokenLoss(const torch::Tensor& student_logits,
                                 const torch::Tensor& teacher_logprobs) {
  CheckSameShape(student_logits, teacher_logprobs, "ForwardKlTokenLoss");
  return ForwardKlFromLogProbs(StableLogSoftmax(student_logits), teacher_logprobs);
}

torch::Tensor SampledReverseKlTokenLoss(const torch::Tensor& student_token_logprobs,
                                        const torch::Tensor& teacher_token_logprobs) {
  CheckSameShape(student_token_logprobs, teacher_token_logprobs, "SampledReverseKlTokenLoss");
  const torch::Tensor k1 = (student_token_logprobs - teacher_token_logprobs).detach();
  return k1 * student_token_logprobs;
}

torch::Tensor VocabLogits(const torch::Tensor& logits, int64_t vocab_limit) {
  const int64_t rows = logits.size(-1);
  if (vocab_limit < 0 || vocab_limit > rows) {
    throw std::invalid_argument("vocab_limit " + std::to_string(vocab_limit) + " is outside [0, " +
                                std::to_string(rows) + "] (the model's vocabulary rows)");
  }
  if (vocab_limit == 0 || vocab_limit == rows) return logits;
  return logits.narrow(-1, 0, vocab_limit);
}

torch::Tensor TokenLogProbs(const torch::Tensor& logits, const torch::Tensor& targets) {
  return GatherTokenLogProbs(StableLogSoftmax(logits), targets);
}

torch::Tensor TokenEntropy(const torch::Tensor& logits) {
  return EntropyFromLogProbs(StableLogSoftmax(logits));
}

// ---- log-prob forms (logprob_losses.h) ----

torch::Tensor StableLogSoftmax(const torch::Tensor& logits) {
  const bool low_precision = logits.scalar_type() == torch::kHalf ||
                             logits.scalar_type() == torch::kBFloat16;
  return torch::log_softmax(low_precision ? logits.to(torch::kFloat32) : logits, -1);
}

torch::Tensor ReverseKlFromLogProbs(const torch::Tensor& student_logprobs,
                                    const torch::Tensor& teacher_logprobs) {
  CheckSameShape(student_logprobs, teacher_logprobs, "ReverseKl");
  return (student_logprobs.exp() * (student_logprobs - teacher_logprobs)).sum(-1);
}

torch::Tensor ForwardKlFromLogProbs(const torch::Tensor& student_logprobs,
                                    const torch::Tensor& teacher_logprobs) {
  CheckSameShape(student_logprobs, teacher_logprobs, "ForwardKl");
  const torch::Tensor terms = teacher_logprobs.exp() * (teacher_logprobs - student_logprobs);
  // 0 · log 0 = 0: an id the teacher gives no mass adds nothing (0 · ∞ is
  // NaN); masked_fill passes no gradient there, and −q = 0 would be all.
  return terms.masked_fill(teacher_logprobs == -std::numeric_limits<double>::infinity(), 0.0)
      .sum(-1);
}

torch::Tensor Renormalized(const torch::Tensor& set_logprobs) {
  return set_logprobs - set_logprobs.logsumexp(-1, /*keepdim=*/true);
}

torch::Tensor TopkReverseKl(const torch::Tensor& student_set_logprobs,
                            const torch::Tensor& teacher_set_logprobs) {
  CheckSameShape(student_set_logprobs, teacher_set_logprobs, "TopkReverseKl");
  return ReverseKlFromLogProbs(Renormalized(student_set_logprobs),
                               Renormalized(teacher_set_logprobs));
}

torch::Tensor TailLogMass(const torch::Tensor& set_logprobs) {
  // 1 − e^x for x = log Σ_S p ≤ 0, as −expm1(x): exact where the set holds
  // almost all the mass (x → 0⁻), where 1 − Σ_S p would cancel.
  return (-torch::expm1(set_logprobs.logsumexp(-1))).clamp_min(kTailFloor).log();
}

torch::Tensor TeacherTailLogMass(const torch::Tensor& teacher_set_logprobs,
                                 const torch::Tensor& sent) {
  if (!sent.defined()) return TailLogMass(teacher_set_logprobs);
  if (sent.sizes() != teacher_set_logprobs.sizes().slice(0, teacher_set_logprobs.dim() - 1)) {
    throw std::invalid_argument("TeacherTailLogMass: tail " + c10::str(sent.sizes()) +
                                " does not match the set rows " +
                                c10::str(teacher_set_logprobs.sizes()));
  }
  // In log space as sent: a tail of 1e-20 stays −46 nats, not the floor's
  // −27.6. Only an empty tail (−inf: the k ids are the whole vocabulary, so
  // the student's tail is empty too) takes the floor, where the bucket's
  // term is 0 · finite instead of 0 · ∞.
  const torch::Tensor tail = sent.to(teacher_set_logprobs.scalar_type());
  return torch::where(torch::isneginf(tail), torch::full_like(tail, std::log(kTailFloor)), tail);
}

torch::Tensor TopkTailReverseKl(const torch::Tensor& student_set_logprobs,
                                const torch::Tensor& teacher_set_logprobs,
                                const torch::Tensor& teacher_tail_logmass) {
  CheckSameShape(student_set_logprobs, teacher_set_logprobs, "TopkTailReverseKl");
  const torch::Tensor student_tail = TailLogMass(student_set_logprobs);
  const torch::Tensor teacher_tail = TeacherTailLogMass(teacher_set_logprobs, teacher_tail_logmass);
  const torch::Tensor on_set = ReverseKlFromLogProbs(student_set_logprobs, teacher_set_logprobs);
  return on_set + student_tail.exp() * (student_tail - teacher_tail);
}

torch::Tensor EntropyFromLogProbs(const torch::Tensor& logprobs) {
  return -(logprobs.exp() * logprobs).sum(-1);
}

torch::Tensor GatherTokenLogProbs(const torch::Tensor& logprobs, const torch::Tensor& targets) {
  if (logprobs.dim() != targets.dim() + 1 ||
      logprobs.sizes().slice(0, targets.dim()) != targets.sizes()) {
    throw std::invalid_argument("TokenLogProbs: logits " + c10::str(logprobs.sizes()) +
                                " do not match targets " + c10::str(targets.sizes()));
  }
  return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

}  // namespace kappa::learner
