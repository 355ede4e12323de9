#include "learner/algo/hybrid_loss.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "learner/algo/fused_token_terms.h"
#include "learner/algo/logprob_losses.h"
#include "learner/algo/sft.h"

namespace kappa::learner {
namespace {

torch::Tensor DistillTokenLoss(const torch::Tensor& logprobs, const torch::Tensor& token_logprobs,
                               const TrainBatch& batch, const LossConfig& config) {
  const torch::Tensor& teacher = batch.teacher_logprobs;
  if (teacher.dim() == 3) {
    if (teacher.sizes() != logprobs.sizes()) {
      throw std::invalid_argument("ComputeLossTerms: teacher log-probs " +
                                  c10::str(teacher.sizes()) + " do not match student logits " +
                                  c10::str(logprobs.sizes()));
    }
    switch (config.distill) {
      case DistillLoss::kReverseKl:
        return ReverseKlFromLogProbs(logprobs, teacher);
      case DistillLoss::kForwardKl:
        return ForwardKlFromLogProbs(logprobs, teacher);
      case DistillLoss::kSampledReverseKl:
        return SampledReverseKlTokenLoss(token_logprobs,
                                         GatherTokenLogProbs(teacher, batch.target_tokens));
      case DistillLoss::kTopkReverseKl:
        return TopkReverseKlFromLogProbs(logprobs, teacher, config.distill_topk);
    }
  }
  if (teacher.dim() == 2 && config.distill == DistillLoss::kSampledReverseKl) {
    return SampledReverseKlTokenLoss(token_logprobs, teacher);
  }
  throw std::invalid_argument(
      "ComputeLossTerms: teacher log-probs of shape " + c10::str(teacher.sizes()) +
      " cannot feed this distillation loss (reverse_kl, forward_kl and topk_reverse_kl need "
      "the full vocabulary [B, L, V]; sampled_reverse_kl takes [B, L] or [B, L, V])");
}

// Every other distillation form (and no teacher): one shared log_softmax
// with graph, then the terms from it.
void UnfusedTerms(const TrainBatch& batch, const LossConfig& config, TokenTerms* out) {
  TokenTerms& terms = *out;
  const torch::Tensor scaled =
      config.temperature == 1.0 ? terms.logits : terms.logits / config.temperature;
  // The one [B, L, V] log_softmax that every term below shares.
  terms.logprobs = StableLogSoftmax(scaled);
  terms.token_logprobs = GatherTokenLogProbs(terms.logprobs, batch.target_tokens);
  terms.reward =
      PpoTokenLoss(terms.token_logprobs, batch.old_logprobs, batch.advantages, config.ppo);
  if (batch.teacher_logprobs.defined()) {
    terms.distill = DistillTokenLoss(terms.logprobs, terms.token_logprobs, batch, config);
  }
  {
    torch::NoGradGuard no_grad;
    terms.entropy = EntropyFromLogProbs(terms.logprobs.detach());
  }
}

}  // namespace

TokenTerms ComputeTokenTerms(model::Decoder& model, const TrainBatch& batch,
                             const LossConfig& config) {
  if (!(config.temperature > 0)) {
    throw std::invalid_argument("ComputeLossTerms: temperature must be > 0, got " +
                                std::to_string(config.temperature));
  }
  TokenTerms terms;
  const model::ForwardOutput out = model->Forward(batch.input_tokens, batch.attention_mask);
  terms.logits = VocabLogits(out.logits, config.vocab_limit);
  terms.hidden = out.hidden;
  const torch::Tensor& teacher = batch.teacher_logprobs;
  if (teacher.defined() && teacher.dim() == 3 && config.distill == DistillLoss::kReverseKl) {
    // The default loss: one fused node for log p(y), the reverse KL and the
    // entropy, keeping one [B, L, V] (the log-probs, no graph) for both the
    // L_R and the L_D backward passes.
    if (teacher.sizes() != terms.logits.sizes()) {
      throw std::invalid_argument("ComputeLossTerms: teacher log-probs " +
                                  c10::str(teacher.sizes()) + " do not match student logits " +
                                  c10::str(terms.logits.sizes()));
    }
    FusedTokenTerms fused =
        ComputeFusedTokenTerms(terms.logits, batch.target_tokens, teacher, config.temperature);
    terms.logprobs = std::move(fused.logprobs);
    terms.token_logprobs = std::move(fused.token_logprobs);
    terms.distill = std::move(fused.reverse_kl);
    terms.entropy = std::move(fused.entropy);
    terms.reward =
        PpoTokenLoss(terms.token_logprobs, batch.old_logprobs, batch.advantages, config.ppo);
  } else {
    UnfusedTerms(batch, config, &terms);
  }
  if (batch.sft_input_tokens.defined()) {
    const torch::Tensor sft_logits =
        VocabLogits(model->Forward(batch.sft_input_tokens, batch.sft_attention_mask).logits,
                    config.vocab_limit);
    terms.sft_nll =
        SftNll(sft_logits, batch.sft_target_tokens, batch.sft_mask, &terms.sft_count);
  }
  return terms;
}

LossTerms AggregateTerms(const TokenTerms& tokens, const TrainBatch& batch,
                         const LossConfig& config, const TermWeights& weights) {
  const torch::Tensor& mask = batch.response_mask;
  LossTerms terms;
  terms.logits = tokens.logits;
  const torch::Tensor zero = torch::zeros({}, tokens.logprobs.options());
  terms.reward_loss = Aggregate(
      weights.reward.defined() ? tokens.reward * weights.reward : tokens.reward, mask,
      config.aggregation, &terms.reward_count);
  if (tokens.distill.defined() && !weights.no_distill) {
    const torch::Tensor& distill_mask =
        weights.distill_mask.defined() ? weights.distill_mask : mask;
    terms.distill_loss = Aggregate(
        weights.distill.defined() ? tokens.distill * weights.distill : tokens.distill,
        distill_mask, config.aggregation, &terms.distill_count);
  } else {
    terms.distill_loss = zero;
    terms.distill_count = zero;
  }
  terms.sft_loss = tokens.sft_nll.defined() ? tokens.sft_nll : zero;
  terms.sft_count = tokens.sft_nll.defined() ? tokens.sft_count : zero;

  torch::NoGradGuard no_grad;
  const torch::Tensor log_ratio =
      (tokens.token_logprobs.detach() - batch.old_logprobs).clamp(-20.0, 20.0);
  const torch::Tensor ratio = log_ratio.exp();
  const torch::Tensor& adv = batch.advantages;
  const torch::Tensor clipped =
      ((-adv * ratio.clamp(1.0 - config.ppo.clip_low, 1.0 + config.ppo.clip_high)) >
       (-adv * ratio)).to(mask.scalar_type());
  const torch::Tensor k3 = (ratio - 1.0) - log_ratio;
  const torch::Tensor stats =
      torch::stack({Aggregate(tokens.entropy, mask, Aggregation::kTokenMean),
                    Aggregate(clipped, mask, Aggregation::kTokenMean),
                    Aggregate(k3, mask, Aggregation::kTokenMean)})
          .to(torch::kCPU, torch::kFloat64);
  const double* s = stats.data_ptr<double>();
  terms.entropy = s[0];
  terms.clip_fraction = s[1];
  terms.approx_kl = s[2];
  return terms;
}

LossTerms ComputeLossTerms(model::Decoder& model, const TrainBatch& batch_in,
                           const LossConfig& config) {
  const auto params = model->parameters();
  if (params.empty()) throw std::invalid_argument("ComputeLossTerms: model has no parameters");
  const TrainBatch batch = batch_in.To(params.front().device());
  return AggregateTerms(ComputeTokenTerms(model, batch, config), batch, config);
}

}  // namespace kappa::learner
