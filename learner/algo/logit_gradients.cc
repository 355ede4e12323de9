#include "learner/algo/logit_gradients.h"

#include <torch/torch.h>

#include <stdexcept>

#include "learner/algo/logprob_losses.h"

namespace kappa::learner {
namespace {

constexpr double kMaxLogRatio = 20.0;  // the clamp of PpoTokenLoss

torch::Tensor OneHot(const torch::Tensor& targets, const torch::Tensor& like) {
  return torch::zeros_like(like).scatter_(-1, targets.unsqueeze(-1), 1.0);
}

torch::Tensor ReverseKlGradient(const torch::Tensor& logp, const torch::Tensor& logq) {
  const torch::Tensor p = logp.exp();
  const torch::Tensor log_ratio = logp - logq;
  const torch::Tensor kl = (p * log_ratio).sum(-1, /*keepdim=*/true);
  return p * (log_ratio - kl);
}

}  // namespace

torch::Tensor RewardLogProbCoefficient(const torch::Tensor& logp_new, const torch::Tensor& logp_old,
                                       const torch::Tensor& advantages, const PpoConfig& config) {
  const torch::Tensor raw_log_ratio = logp_new - logp_old;
  const torch::Tensor ratio = raw_log_ratio.clamp(-kMaxLogRatio, kMaxLogRatio).exp();
  // d ρ / d log π: ρ inside the clamp, 0 where the clamp saturates.
  const torch::Tensor ratio_slope =
      torch::where(raw_log_ratio.abs() <= kMaxLogRatio, ratio, torch::zeros_like(ratio));
  const torch::Tensor unclipped = -advantages * ratio;
  const torch::Tensor clipped =
      -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high);
  const torch::Tensor in_clip_range =
      (ratio >= 1.0 - config.clip_low) & (ratio <= 1.0 + config.clip_high);
  // loss = max(unclipped, clipped): the unclipped branch carries −Â dρ; the
  // clipped one only inside the clip range, where the two coincide.
  const torch::Tensor active = (unclipped >= clipped) | in_clip_range;
  torch::Tensor coefficient = torch::where(active, -advantages * ratio_slope,
                                           torch::zeros_like(ratio));
  if (config.dual_clip > 0) {
    const torch::Tensor loss = torch::max(unclipped, clipped);
    const torch::Tensor capped = (advantages < 0) & (loss > -config.dual_clip * advantages);
    coefficient = coefficient.masked_fill(capped, 0.0);
  }
  return coefficient;
}

torch::Tensor RewardLogitGradient(const torch::Tensor& logprobs, const torch::Tensor& targets,
                                  const torch::Tensor& coefficient, double temperature) {
  const torch::Tensor p = logprobs.exp();
  return coefficient.unsqueeze(-1) * (OneHot(targets, p) - p) / temperature;
}

torch::Tensor DistillLogitGradient(const torch::Tensor& logprobs, const TeacherRows& teacher,
                                   const torch::Tensor& targets, DistillLoss kind,
                                   double temperature) {
  const torch::Tensor& q = teacher.logprobs;
  if (IsTopkLoss(kind) != teacher.topk() ||
      (kind != DistillLoss::kSampledReverseKl && !teacher.topk() && !teacher.full(targets))) {
    throw std::invalid_argument(
        "DistillLogitGradient: teacher rows " +
        c10::str(teacher.hidden_form() ? teacher.hidden.sizes() : q.sizes()) +
        (teacher.topk()          ? " (top-k)"
         : teacher.hidden_form() ? " (hidden)"
                                 : "") +
        " cannot feed this distillation loss");
  }
  switch (kind) {
    case DistillLoss::kReverseKl:
      return ReverseKlGradient(logprobs, teacher.FullLogProbs()) / temperature;
    case DistillLoss::kForwardKl:
      return (logprobs.exp() - teacher.FullLogProbs().exp()) / temperature;
    case DistillLoss::kSampledReverseKl: {
      const torch::Tensor k1 =
          GatherTokenLogProbs(logprobs, targets) - teacher.TargetLogProbs(targets);
      const torch::Tensor p = logprobs.exp();
      return k1.unsqueeze(-1) * (OneHot(targets, p) - p) / temperature;
    }
    case DistillLoss::kTopkReverseKl: {
      // The restricted student distribution is the softmax of the logits on
      // the set, so the reverse-KL form applies there unchanged.
      const torch::Tensor& ids = teacher.topk_ids;
      const torch::Tensor on_set = ReverseKlGradient(Renormalized(logprobs.gather(-1, ids)),
                                                     Renormalized(q.to(logprobs.scalar_type())));
      return torch::zeros_like(logprobs).scatter_(-1, ids, on_set) / temperature;
    }
    case DistillLoss::kTopkTailReverseKl: {
      // Buckets b: the k ids and the tail. ∂KL/∂s_u = p_u (r_b(u) − KL),
      // the +1 of ∂(P log P)/∂P cancelling because Σ_b P_b = 1.
      const torch::Tensor& ids = teacher.topk_ids;
      const torch::Tensor set_logp = logprobs.gather(-1, ids);
      const torch::Tensor set_logq = q.to(logprobs.scalar_type());
      const torch::Tensor tail_logp = TailLogMass(set_logp);
      const torch::Tensor tail_ratio =
          tail_logp - TeacherTailLogMass(set_logq, teacher.tail_logmass);
      const torch::Tensor set_ratio = set_logp - set_logq;
      const torch::Tensor kl =
          ((set_logp.exp() * set_ratio).sum(-1) + tail_logp.exp() * tail_ratio).unsqueeze(-1);
      const torch::Tensor ratio =
          tail_ratio.unsqueeze(-1).expand_as(logprobs).contiguous().scatter_(-1, ids, set_ratio);
      return logprobs.exp() * (ratio - kl) / temperature;
    }
  }
  throw std::invalid_argument("DistillLogitGradient: unknown distillation loss");
}

}  // namespace kappa::learner
