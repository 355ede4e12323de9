#include "learner/algo/hybrid_loss.h"

#include <stdexcept>
#include <string>

#include "learner/algo/logprob_losses.h"

namespace kappa::learner {
namespace {

torch::Tensor DistillTokenLoss(const torch::Tensor& logprobs, const torch::Tensor& token_logprobs,
                               const TrainBatch& batch, DistillLoss kind) {
  const torch::Tensor& teacher = batch.teacher_logprobs;
  if (teacher.dim() == 3) {
    if (teacher.sizes() != logprobs.sizes()) {
      throw std::invalid_argument("ComputeLossTerms: teacher log-probs " +
                                  c10::str(teacher.sizes()) + " do not match student logits " +
                                  c10::str(logprobs.sizes()));
    }
    switch (kind) {
      case DistillLoss::kReverseKl:
        return ReverseKlFromLogProbs(logprobs, teacher);
      case DistillLoss::kForwardKl:
        return ForwardKlFromLogProbs(logprobs, teacher);
      case DistillLoss::kSampledReverseKl:
        return SampledReverseKlTokenLoss(token_logprobs,
                                         GatherTokenLogProbs(teacher, batch.target_tokens));
    }
  }
  if (teacher.dim() == 2 && kind == DistillLoss::kSampledReverseKl) {
    return SampledReverseKlTokenLoss(token_logprobs, teacher);
  }
  throw std::invalid_argument(
      "ComputeLossTerms: teacher log-probs of shape " + c10::str(teacher.sizes()) +
      " cannot feed this distillation loss (reverse_kl and forward_kl need the full "
      "vocabulary [B, L, V]; sampled_reverse_kl takes [B, L] or [B, L, V])");
}

}  // namespace

LossTerms ComputeLossTerms(model::Decoder& model, const TrainBatch& batch_in,
                           const LossConfig& config) {
  if (!(config.temperature > 0)) {
    throw std::invalid_argument("ComputeLossTerms: temperature must be > 0, got " +
                                std::to_string(config.temperature));
  }
  const auto params = model->parameters();
  if (params.empty()) throw std::invalid_argument("ComputeLossTerms: model has no parameters");
  const TrainBatch batch = batch_in.To(params.front().device());
  const torch::Tensor& mask = batch.response_mask;

  LossTerms terms;
  terms.logits = model->Forward(batch.input_tokens, batch.attention_mask).logits;
  const torch::Tensor scaled =
      config.temperature == 1.0 ? terms.logits : terms.logits / config.temperature;
  // The one [B, L, V] log_softmax that every term below shares.
  const torch::Tensor logprobs = StableLogSoftmax(scaled);
  const torch::Tensor token_logprobs = GatherTokenLogProbs(logprobs, batch.target_tokens);

  terms.reward_loss = Aggregate(
      PpoTokenLoss(token_logprobs, batch.old_logprobs, batch.advantages, config.ppo), mask,
      config.aggregation);
  if (batch.teacher_logprobs.defined()) {
    terms.distill_loss = Aggregate(
        DistillTokenLoss(logprobs, token_logprobs, batch, config.distill), mask,
        config.aggregation);
  } else {
    terms.distill_loss = torch::zeros({}, logprobs.options());
  }

  torch::NoGradGuard no_grad;
  const torch::Tensor lp = logprobs.detach();
  const torch::Tensor log_ratio =
      (token_logprobs.detach() - batch.old_logprobs).clamp(-20.0, 20.0);
  const torch::Tensor ratio = log_ratio.exp();
  const torch::Tensor& adv = batch.advantages;
  const torch::Tensor clipped =
      ((-adv * ratio.clamp(1.0 - config.ppo.clip_low, 1.0 + config.ppo.clip_high)) >
       (-adv * ratio)).to(mask.scalar_type());
  const torch::Tensor k3 = (ratio - 1.0) - log_ratio;
  const torch::Tensor stats =
      torch::stack({Aggregate(EntropyFromLogProbs(lp), mask, Aggregation::kTokenMean),
                    Aggregate(clipped, mask, Aggregation::kTokenMean),
                    Aggregate(k3, mask, Aggregation::kTokenMean)})
          .to(torch::kCPU, torch::kFloat64);
  const double* s = stats.data_ptr<double>();
  terms.entropy = s[0];
  terms.clip_fraction = s[1];
  terms.approx_kl = s[2];
  return terms;
}

}  // namespace kappa::learner
