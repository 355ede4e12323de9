#include "learner/algo/hybrid_loss.h"

#include <torch/torch.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "learner/algo/fused_token_terms.h"
#include "learner/algo/logprob_losses.h"
#include "learner/algo/sft.h"

namespace kappa::learner {
namespace {

// The output projection's rows of the ids p_n is over (LossConfig::vocab_limit).
torch::Tensor OutputWeightRows(model::Decoder& model, const LossConfig& config) {
  const torch::Tensor weight = model->OutputWeight();
  const int64_t rows = weight.size(0);
  if (config.vocab_limit < 0 || config.vocab_limit > rows) {
    throw std::invalid_argument("vocab_limit " + std::to_string(config.vocab_limit) +
                                " is outside [0, " + std::to_string(rows) +
                                "] (the model's vocabulary rows)");
  }
  return config.vocab_limit == 0 ? weight : weight.narrow(0, 0, config.vocab_limit);
}

// The flat [B·L, D] hidden states at `positions`, with graph.
torch::Tensor HiddenAt(const torch::Tensor& hidden, const torch::Tensor& positions) {
  return hidden.reshape({-1, hidden.size(-1)}).index_select(0, positions);
}

// The chunked head's inputs at the response positions `positions` (flat
// indices into [B·L]) of `batch`, from hidden [B, L, D] and `weight` as
// given (with graph for the loss, detached for the K_DR recomputation).
VocabHeadInputs ResponseHeadInputs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& positions, const TrainBatch& batch,
                                   const LossConfig& config) {
  VocabHeadInputs in;
  in.hidden = HiddenAt(hidden, positions);
  in.weight = weight;
  in.targets = batch.target_tokens.reshape({-1}).index_select(0, positions);
  in.teacher = batch.teacher().Flatten().Select(positions);
  in.distill = config.distill;
  in.temperature = config.temperature;
  in.chunk_positions = config.vocab_chunk_positions;
  return in;
}

// L_SFT of the demonstration rows through the chunked head: the mean NLL
// over their teacher response tokens, as SftNll.
void ChunkedSftNll(model::Decoder& model, const TrainBatch& batch, const LossConfig& config,
                   TokenTerms* terms) {
  const model::ForwardOutput out =
      model->ForwardHidden(batch.sft_input_tokens, batch.sft_attention_mask);
  const torch::Tensor positions = batch.sft_mask.reshape({-1}).nonzero().squeeze(-1);
  VocabHeadInputs in;
  in.hidden = HiddenAt(out.hidden, positions);
  in.weight = OutputWeightRows(model, config);
  in.targets = batch.sft_target_tokens.reshape({-1}).index_select(0, positions);
  in.chunk_positions = config.vocab_chunk_positions;
  const torch::Tensor logprobs = ComputeVocabHeadTerms(in).token_logprobs;
  const torch::Tensor weight =
      batch.sft_mask.reshape({-1}).index_select(0, positions).to(logprobs.scalar_type());
  const torch::Tensor tokens = weight.sum();
  terms->sft_count = tokens.detach();
  terms->sft_nll = -(logprobs * weight).sum() / tokens.clamp_min(1);
}

// The chunked vocabulary head (vocab_head.h) at the response positions of
// `batch`: no [B, L, V] tensor exists.
void ChunkedTerms(const model::ForwardOutput& out, model::Decoder& model, const TrainBatch& batch,
                  const LossConfig& config, TokenTerms* terms) {
  terms->hidden = out.hidden;
  terms->output_weight = OutputWeightRows(model, config);
  terms->head_positions = batch.response_mask.reshape({-1}).nonzero().squeeze(-1);
  terms->head_autocast = model::AutocastState::Current(out.hidden.device().type());
  const VocabHeadTerms head = ComputeVocabHeadTerms(
      ResponseHeadInputs(out.hidden, terms->output_weight, terms->head_positions, batch, config));
  // Back to [B, L], zero outside the response positions.
  const auto scatter = [&](const torch::Tensor& values) {
    return torch::zeros({batch.response_mask.numel()}, values.options())
        .index_put({terms->head_positions}, values)
        .view(batch.response_mask.sizes());
  };
  terms->token_logprobs = scatter(head.token_logprobs);
  terms->reward =
      PpoTokenLoss(terms->token_logprobs, batch.old_logprobs, batch.advantages, config.ppo);
  if (head.distill.defined()) terms->distill = scatter(head.distill);
  terms->entropy = scatter(head.entropy);
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
    terms.distill = DistillTermFromLogProbs(terms.logprobs, terms.token_logprobs, batch.teacher(),
                                            batch.target_tokens, config.distill);
  }
  {
    torch::NoGradGuard no_grad;
    terms.entropy = EntropyFromLogProbs(terms.logprobs.detach());
  }
}

}  // namespace

torch::Tensor DistillTermFromLogProbs(const torch::Tensor& logprobs,
                                      const torch::Tensor& token_logprobs,
                                      const TeacherRows& teacher, const torch::Tensor& targets,
                                      DistillLoss kind) {
  const torch::Tensor& q = teacher.logprobs;
  if (teacher.topk() && IsTopkLoss(kind)) {
    const torch::Tensor set_logprobs = logprobs.gather(-1, teacher.topk_ids);
    return kind == DistillLoss::kTopkReverseKl
               ? TopkReverseKl(set_logprobs, q.to(set_logprobs.scalar_type()))
               : TopkTailReverseKl(set_logprobs, q.to(set_logprobs.scalar_type()),
                                   teacher.tail_logmass);
  }
  if (!teacher.topk() && teacher.full(targets) && !IsTopkLoss(kind)) {
    const torch::Tensor full = teacher.FullLogProbs();
    if (full.sizes() != logprobs.sizes()) {
      throw std::invalid_argument("ComputeLossTerms: teacher log-probs " + c10::str(full.sizes()) +
                                  " do not match student logits " + c10::str(logprobs.sizes()));
    }
    switch (kind) {
      case DistillLoss::kReverseKl:
        return ReverseKlFromLogProbs(logprobs, full.to(logprobs.scalar_type()));
      case DistillLoss::kForwardKl:
        return ForwardKlFromLogProbs(logprobs, full.to(logprobs.scalar_type()));
      default:
        return SampledReverseKlTokenLoss(token_logprobs, GatherTokenLogProbs(full, targets));
    }
  }
  if (!teacher.topk() && q.defined() && q.dim() == targets.dim() &&
      kind == DistillLoss::kSampledReverseKl) {
    return SampledReverseKlTokenLoss(token_logprobs, q);
  }
  throw std::invalid_argument(
      "ComputeLossTerms: teacher log-probs of shape " +
      (teacher.hidden_form() ? c10::str(teacher.hidden.sizes()) + " (hidden)"
                             : c10::str(q.sizes())) +
      (teacher.topk() ? " (top-k rows)" : "") +
      " cannot feed this distillation loss (reverse_kl and forward_kl need the full "
      "vocabulary [B, L, V]; the top-k losses top-k rows; sampled_reverse_kl takes [B, L] or "
      "[B, L, V])");
}

TokenTerms ComputeTokenTerms(model::Decoder& model, const TrainBatch& batch,
                             const LossConfig& config) {
  if (!(config.temperature > 0)) {
    throw std::invalid_argument("ComputeLossTerms: temperature must be > 0, got " +
                                std::to_string(config.temperature));
  }
  TokenTerms terms;
  if (batch.teacher_hidden.defined() && config.vocab_chunk_positions <= 0) {
    throw std::invalid_argument(
        "teacher hidden rows (teacher.rows: hidden) need the chunked vocabulary head: set "
        "trainer.vocab_chunk_positions > 0");
  }
  if (config.vocab_chunk_positions > 0) {
    ChunkedTerms(model->ForwardHidden(batch.input_tokens, batch.attention_mask), model, batch,
                 config, &terms);
    if (batch.sft_input_tokens.defined()) ChunkedSftNll(model, batch, config, &terms);
    return terms;
  }
  const model::ForwardOutput out = model->Forward(batch.input_tokens, batch.attention_mask);
  terms.logits = VocabLogits(out.logits, config.vocab_limit);
  terms.hidden = out.hidden;
  const torch::Tensor& teacher = batch.teacher_logprobs;
  if (teacher.defined() && !batch.teacher_topk_ids.defined() && teacher.dim() == 3 &&
      config.distill == DistillLoss::kReverseKl) {
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
    terms.sft_nll = SftNll(sft_logits, batch.sft_target_tokens, batch.sft_mask, &terms.sft_count);
  }
  return terms;
}

VocabHeadInputs HeadInputs(const TokenTerms& tokens, const TrainBatch& batch,
                           const LossConfig& config) {
  VocabHeadInputs in = ResponseHeadInputs(tokens.hidden.detach(), tokens.output_weight.detach(),
                                          tokens.head_positions, batch, config);
  in.autocast = tokens.head_autocast;
  return in;
}

LossTerms AggregateTerms(const TokenTerms& tokens, const TrainBatch& batch,
                         const LossConfig& config, const TermWeights& weights) {
  const torch::Tensor& mask = batch.response_mask;
  LossTerms terms;
  terms.logits = tokens.logits;
  const torch::Tensor zero = torch::zeros({}, tokens.token_logprobs.options());
  terms.reward_loss =
      Aggregate(weights.reward.defined() ? tokens.reward * weights.reward : tokens.reward, mask,
                config.aggregation, &terms.reward_count);
  if (tokens.distill.defined() && !weights.no_distill) {
    const torch::Tensor& distill_mask =
        weights.distill_mask.defined() ? weights.distill_mask : mask;
    terms.distill_loss =
        Aggregate(weights.distill.defined() ? tokens.distill * weights.distill : tokens.distill,
                  distill_mask, config.aggregation, &terms.distill_count);
  } else {
    terms.distill_loss = zero;
    terms.distill_count = zero;
  }
  terms.sft_loss = tokens.sft_nll.defined() ? tokens.sft_nll : zero;
  terms.sft_count = tokens.sft_nll.defined() ? tokens.sft_count : zero;
  AddDiagnostics(tokens, batch, config, &terms);
  return terms;
}

void AddDiagnostics(const TokenTerms& tokens, const TrainBatch& batch, const LossConfig& config,
                    LossTerms* terms_out) {
  LossTerms& terms = *terms_out;
  const torch::Tensor& mask = batch.response_mask;
  torch::NoGradGuard no_grad;
  const torch::Tensor log_ratio =
      (tokens.token_logprobs.detach() - batch.old_logprobs).clamp(-20.0, 20.0);
  const torch::Tensor ratio = log_ratio.exp();
  const torch::Tensor& adv = batch.advantages;
  const torch::Tensor clipped =
      ((-adv * ratio.clamp(1.0 - config.ppo.clip_low, 1.0 + config.ppo.clip_high)) > (-adv * ratio))
          .to(mask.scalar_type());
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
}

std::pair<torch::Tensor, torch::Tensor> TermCounts(const TrainBatch& batch,
                                                   const LossConfig& config,
                                                   const TermWeights& weights) {
  const torch::Tensor& response = batch.response_mask;
  const torch::Tensor zeros = torch::zeros_like(response);
  torch::Tensor reward_count, distill_count;
  Aggregate(zeros, response, config.aggregation, &reward_count);
  if (batch.teacher().defined() && !weights.no_distill) {
    Aggregate(zeros, weights.distill_mask.defined() ? weights.distill_mask : response,
              config.aggregation, &distill_count);
  } else {
    distill_count = torch::zeros({}, response.options());
  }
  return {reward_count, distill_count};
}

FusedStepTerms ComputeFusedStepTerms(model::Decoder& model, const TrainBatch& batch,
                                     const LossConfig& config, const TermWeights& weights,
                                     const FusedMask& mask,
                                     const std::optional<FusedCombine>& combine) {
  if (config.vocab_chunk_positions <= 0) {
    throw std::invalid_argument(
        "ComputeFusedStepTerms: the fused head needs trainer.vocab_chunk_positions > 0");
  }
  const auto start = std::chrono::steady_clock::now();
  const model::ForwardOutput out = model->ForwardHidden(batch.input_tokens, batch.attention_mask);
  const auto layers_done = std::chrono::steady_clock::now();
  const torch::Tensor& response = batch.response_mask;
  const torch::Tensor positions = response.reshape({-1}).nonzero().squeeze(-1);
  auto at = [&](const torch::Tensor& t) { return t.reshape({-1}).index_select(0, positions); };
  // Teacher rows give ℓ_D and K_DR; the gate decides whether L_D trains.
  const bool distill = batch.teacher().defined();
  const bool distill_trains = distill && !weights.no_distill;
  const torch::Tensor& distill_mask =
      weights.distill_mask.defined() ? weights.distill_mask : response;

  FusedHeadInputs in;
  in.hidden = HiddenAt(out.hidden, positions);
  in.weight = OutputWeightRows(model, config);
  in.targets = at(batch.target_tokens);
  in.old_logprobs = at(batch.old_logprobs);
  in.advantages = at(batch.advantages);
  in.reward_weights = at(AggregationWeights(response, config.aggregation));
  if (distill) {
    in.teacher = batch.teacher().Flatten().Select(positions);
    torch::Tensor distill_weights = AggregationWeights(distill_mask, config.aggregation);
    if (weights.distill.defined()) distill_weights = distill_weights * weights.distill;
    in.distill_weights = at(distill_trains ? distill_weights : torch::zeros_like(distill_weights));
  }
  in.distill = config.distill;
  in.ppo = config.ppo;
  in.temperature = config.temperature;
  in.chunk_positions = config.vocab_chunk_positions;
  in.mask = distill && mask.on;
  in.mask_target = mask.target;
  in.mask_estimator = mask.estimator;
  in.mask_temperature = mask.temperature;
  if (combine.has_value()) {
    in.combine = true;
    in.combine_reward = combine->reward;
    in.combine_distill = distill_trains ? combine->distill : 0.0;
  }
  const FusedHeadOutputs head = ComputeFusedHead(in);
  const auto head_done = std::chrono::steady_clock::now();

  // Back to [B, L], zero outside the response positions, no graph.
  const auto scatter = [&](const torch::Tensor& values) {
    return torch::zeros({response.numel()}, values.options())
        .index_put({positions}, values)
        .view(response.sizes());
  };
  FusedStepTerms step;
  step.layers_seconds = std::chrono::duration<double>(layers_done - start).count();
  step.head_seconds = std::chrono::duration<double>(head_done - layers_done).count();
  TokenTerms& tokens = step.tokens;
  tokens.hidden = out.hidden;
  tokens.head_positions = positions;
  tokens.token_logprobs = scatter(head.token_logprobs);
  tokens.reward = scatter(head.reward);
  tokens.entropy = scatter(head.entropy);
  if (batch.sft_input_tokens.defined()) ChunkedSftNll(model, batch, config, &tokens);

  LossTerms& terms = step.terms;
  const torch::Tensor zero = torch::zeros({}, head.token_logprobs.options());
  terms.reward_loss = head.reward_loss;
  terms.combined_loss = head.combined_loss;
  terms.combined_distill = combine.has_value() && distill_trains;
  std::tie(terms.reward_count, terms.distill_count) = TermCounts(batch, config, weights);
  if (distill) {
    tokens.distill = scatter(head.distill);
    step.logit_kernel = scatter(head.logit_kernel);
    if (head.mask_weights.defined()) step.mask_weights = scatter(head.mask_weights);
  }
  terms.distill_loss = distill_trains ? head.distill_loss : zero;
  terms.sft_loss = tokens.sft_nll.defined() ? tokens.sft_nll : zero;
  terms.sft_count = tokens.sft_nll.defined() ? tokens.sft_count : zero;
  AddDiagnostics(tokens, batch, config, &terms);
  return step;
}

torch::Tensor InferenceMismatchSums(const torch::Tensor& token_logprobs,
                                    const torch::Tensor& behaviour_logprobs,
                                    const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  const torch::Tensor d =
      token_logprobs.detach().to(torch::kFloat64) - behaviour_logprobs.to(torch::kFloat64);
  const torch::Tensor clamped = d.clamp(-20.0, 20.0);
  const torch::Tensor k3 = (clamped.exp() - 1.0) - clamped;
  // Padding positions may hold anything: select, not multiply (0 · inf).
  const torch::Tensor in = mask.detach() > 0;
  const torch::Tensor zero = torch::zeros({}, d.options());
  return torch::stack({torch::where(in, d.abs(), zero).sum(), torch::where(in, k3, zero).sum(),
                       in.to(torch::kFloat64).sum()});
}

LossTerms ComputeLossTerms(model::Decoder& model, const TrainBatch& batch_in,
                           const LossConfig& config) {
  const auto params = model->parameters();
  if (params.empty()) throw std::invalid_argument("ComputeLossTerms: model has no parameters");
  const TrainBatch batch = batch_in.To(params.front().device());
  return AggregateTerms(ComputeTokenTerms(model, batch, config), batch, config);
}

}  // namespace kappa::learner
