#include "learner/algo/hybrid_step.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace kappa::learner {
namespace {

// m3_mask: weights on the configured term of one micro-batch where its
// kernel K_DR(n) < 0. Returns how many response positions had K_DR < 0.
int64_t ApplyConflictMask(const BalanceConfig& balance, const CheapKernels& kernels,
                          const torch::Tensor& response_mask, TermWeights* weights) {
  const torch::Tensor& kernel = kernels.Of(balance.mask_estimator);
  const torch::Tensor w = ConflictMaskWeights(kernel, balance.mask_temperature);
  if (balance.mask_target == BalanceConfig::MaskTarget::kReward) {
    weights->reward = w;
  } else {
    weights->distill = weights->distill.defined() ? weights->distill * w : w;
  }
  return ((kernel < 0) & (response_mask > 0)).sum().item<int64_t>();
}

}  // namespace

std::optional<TailMass> TeacherTailMass(const TeacherRows& teacher,
                                        const torch::Tensor& response_mask) {
  if (!teacher.topk()) return std::nullopt;
  torch::NoGradGuard no_grad;
  // The teacher's own float32 tail when it sent one (the service path
  // always does): 1 − Σ top-k cancels on a peaked bfloat16 row.
  const torch::Tensor tail_mass = teacher.tail_logmass.defined()
                                      ? teacher.tail_logmass.to(torch::kFloat64).exp()
                                      : 1.0 - teacher.logprobs.to(torch::kFloat64).exp().sum(-1);
  const torch::Tensor tail = tail_mass.clamp(0.0, 1.0).masked_select(response_mask > 0);
  if (tail.numel() == 0) return std::nullopt;
  TailMass mass;
  mass.mean = tail.mean().item<double>();
  mass.p95 = tail.quantile(0.95).item<double>();
  return mass;
}

torch::Tensor OnPolicyRows(const std::vector<int64_t>& group_versions, int64_t group_size,
                           int64_t current_version) {
  if (group_size < 0) throw std::invalid_argument("OnPolicyRows: negative group size");
  std::vector<float> rows;
  rows.reserve(group_versions.size() * static_cast<size_t>(group_size));
  for (int64_t version : group_versions) {
    rows.insert(rows.end(), static_cast<size_t>(group_size),
                version == current_version ? 1.0f : 0.0f);
  }
  return torch::tensor(rows, torch::kFloat32);
}

void ValidateHybridStepConfig(const HybridStepConfig& config) {
  if (config.monitor.kdr_estimator == KdrEstimator::kExact) {
    throw std::invalid_argument(
        "monitor.kdr_estimator must be last_layer or logit (exact runs on sampled positions "
        "via monitor.kdr_exact_every)");
  }
  if (config.balance.mask && config.balance.mask_estimator == KdrEstimator::kExact) {
    throw std::invalid_argument("m3.mask_estimator must be logit or last_layer");
  }
  if (config.balance.adapt && config.lambda_schedule) {
    throw std::invalid_argument(
        "trainer.lambda_schedule (cosine) and trainer.balance (m3_adapt) both move lambda; pick "
        "one");
  }
  CheckRstgConfig(config.rstg);
}

HybridStep::HybridStep(model::Decoder model, std::unique_ptr<PolicyOptimizer> optimizer,
                       HybridStepConfig config)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), config_(std::move(config)) {
  ValidateHybridStepConfig(config_);
  // Every backward through this step's forward runs into the optimizer's
  // attached dense .grad views, so the token lookup's gradient may be sparse:
  // no dense [V, d] copy of it, nor of its sum with the tied head's.
  model_->SetSparseEmbeddingGradient(true);
  if (config_.balance.adapt) {
    lambda_controller_.emplace(config_.loss.lambda, config_.balance.kappa_target,
                               config_.balance.adapt_config);
  }
}

double HybridStep::lambda() const {
  if (lambda_controller_) return lambda_controller_->lambda();
  // The step Run makes next is the optimizer's step() (0-based).
  if (config_.lambda_schedule) return config_.lambda_schedule->At(optimizer_->step());
  return config_.loss.lambda;
}

void HybridStep::TokenMeans::Add(const LossTerms& terms, double response_tokens) {
  entropy += terms.entropy * response_tokens;
  clip_fraction += terms.clip_fraction * response_tokens;
  approx_kl += terms.approx_kl * response_tokens;
  tokens += response_tokens;
}

void HybridStep::TokenMeans::WriteTo(HybridStepReport* report) const {
  if (!(tokens > 0)) return;
  report->entropy = entropy / tokens;
  report->clip_fraction = clip_fraction / tokens;
  report->approx_kl = approx_kl / tokens;
}

void HybridStep::MismatchSums::Add(const TokenTerms& tokens, const TrainBatch& part,
                                   const torch::Tensor& mask) {
  const torch::Tensor add = InferenceMismatchSums(tokens.token_logprobs, part.old_logprobs, mask);
  sums = sums.defined() ? sums + add : add;
}

void HybridStep::MismatchSums::WriteTo(HybridStepReport* report) const {
  if (!sums.defined()) return;
  const torch::Tensor host = sums.to(torch::kCPU);
  const double* s = host.data_ptr<double>();
  report->mismatch_tokens = static_cast<int64_t>(std::llround(s[2]));
  if (report->mismatch_tokens == 0) return;
  report->mismatch_abs_mean = s[0] / s[2];
  report->mismatch_k3 = s[1] / s[2];
}

TokenTerms HybridStep::Forward(const TrainBatch& batch) {
  AutocastGuard autocast(optimizer_->parameters().front().device(), config_.precision);
  TokenTerms tokens = ComputeTokenTerms(model_, batch, config_.loss);
  // Nothing below reads the raw logits and their graph node does not keep
  // them (log_softmax saves its output; the fused node its log-probs), so
  // dropping them frees one [B, L, V] tensor for the backward passes.
  tokens.logits = torch::Tensor();
  return tokens;
}

HybridStep::Gate HybridStep::DecideGate(const TrainBatch& batch,
                                        const std::vector<MicroBatch>& micro,
                                        std::optional<TokenTerms>* first_forward) {
  Gate gate;
  // ComputeTokenTerms gives ℓ_D exactly when the batch has teacher rows.
  gate.scored = batch.teacher().defined() && config_.gate != DistillGate::kNone;
  if (!gate.scored) return gate;
  const torch::Tensor& mask = batch.response_mask;
  if (config_.gate != DistillGate::kRstg) {
    gate.selection = SelectAll(mask);
  } else {
    torch::Tensor entropy, divergence;
    if (micro.size() == 1 && first_forward != nullptr) {
      *first_forward = Forward(batch);
      entropy = (*first_forward)->entropy;
      divergence = (*first_forward)->distill.detach();
    } else {
      torch::NoGradGuard no_grad;
      entropy = torch::zeros_like(mask);
      divergence = torch::zeros_like(mask);
      for (const MicroBatch& part : micro) {
        const TokenTerms pass = Forward(part.batch);
        part.Scatter(pass.entropy.to(mask.scalar_type()), entropy);
        part.Scatter(pass.distill.to(mask.scalar_type()), divergence);
      }
    }
    gate.selection = RstgSelect(batch.rewards, mask, batch.teacher(), batch.target_tokens, entropy,
                                divergence, config_.rstg);
  }
  // Nothing selected (RSTG with no all-zero group): trains() is false, no L_D.
  return gate;
}

void HybridStep::BeginStep(const TrainBatch& batch, const Gate& gate, int64_t step, double lambda,
                           int64_t micro_batches) {
  const torch::Tensor& mask = batch.response_mask;
  TermWeights whole;
  whole.no_distill = !gate.trains();
  if (gate.trains()) whole.distill_mask = gate.selection.selected;
  const auto [reward_count, distill_count] = TermCounts(batch, config_.loss, whole);
  const torch::Tensor sft_count =
      batch.sft_mask.defined() ? batch.sft_mask.sum() : torch::zeros({}, mask.options());
  optimizer_->BeginStep(config_.balance.Plan(config_.reward_weight, lambda, config_.sft_weight),
                        SeparateGradients(step), reward_count, distill_count, sft_count,
                        micro_batches);
}

bool HybridStep::SeparateGradients(int64_t step) const {
  // κ needs ∇L_R and ∇L_D apart; so do m3_project, m3_norm and m3_adapt.
  return Due(config_.monitor.kappa_every, step) || config_.balance.NeedsSeparateGradients();
}

TermWeights HybridStep::GateWeights(const MicroBatch& part, const Gate& gate) {
  TermWeights weights;
  weights.no_distill = !gate.trains();
  if (gate.scored) {
    weights.distill = part.Slice(gate.selection.weights);
    weights.distill_mask = part.Slice(gate.selection.selected);
  }
  return weights;
}

void HybridStep::AccumulateMicroBatch(const MicroBatch& part, const TokenTerms& tokens,
                                      const Gate& gate, const torch::Tensor& mismatch_mask,
                                      KdrMonitor& kdr, TokenMeans* means, MismatchSums* mismatch,
                                      HybridStepReport* report) {
  const TrainBatch& sub = part.batch;
  TermWeights weights = GateWeights(part, gate);
  if (kdr.observing()) {
    const CheapKernels kernels = kdr.Observe(part, tokens);
    if (config_.balance.mask) {
      report->masked_positions +=
          ApplyConflictMask(config_.balance, kernels, sub.response_mask, &weights);
    }
  }
  Accumulate(part, tokens, AggregateTerms(tokens, sub, config_.loss, weights), mismatch_mask, means,
             mismatch);
}

void HybridStep::AccumulateFusedMicroBatch(const MicroBatch& part, const Gate& gate, bool separate,
                                           const torch::Tensor& mismatch_mask, KdrMonitor& kdr,
                                           TokenMeans* means, MismatchSums* mismatch,
                                           HybridStepReport* report) {
  const TrainBatch& sub = part.batch;
  FusedMask mask;
  mask.on = config_.balance.mask && kdr.observing();
  mask.target = config_.balance.mask_target;
  mask.estimator = config_.balance.mask_estimator;
  mask.temperature = config_.balance.mask_temperature;
  const TermWeights weights = GateWeights(part, gate);
  std::optional<FusedCombine> combine;
  if (!separate) {
    const auto [reward_count, distill_count] = TermCounts(sub, config_.loss, weights);
    const auto [reward, distill] = optimizer_->PlainWeights(reward_count, distill_count);
    combine = FusedCombine{reward, distill};
  }
  FusedStepTerms fused;
  {
    AutocastGuard autocast(optimizer_->parameters().front().device(), config_.precision);
    fused = ComputeFusedStepTerms(model_, sub, config_.loss, weights, mask, combine);
  }
  report->forward_layers_seconds += fused.layers_seconds;
  report->forward_head_seconds += fused.head_seconds;
  if (kdr.observing()) {
    kdr.Record(part, fused.logit_kernel * sub.response_mask, fused.tokens.hidden.detach());
    if (mask.on) {
      report->masked_positions +=
          ((fused.logit_kernel < 0) & (sub.response_mask > 0)).sum().item<int64_t>();
    }
  }
  Accumulate(part, fused.tokens, fused.terms, mismatch_mask, means, mismatch);
}

void HybridStep::Accumulate(const MicroBatch& part, const TokenTerms& tokens,
                            const LossTerms& terms, const torch::Tensor& mismatch_mask,
                            TokenMeans* means, MismatchSums* mismatch) {
  const TrainBatch& sub = part.batch;
  // The loss's own log π_θ(y_n), at θ before the update: what a worker
  // holding this version should have sent as its behaviour log-probs.
  mismatch->Add(tokens, sub, part.Slice(mismatch_mask));
  means->Add(terms, part.whole ? 1.0 : sub.response_mask.sum().item<double>());
  optimizer_->AccumulateStep(terms);
}

HybridStepReport HybridStep::Run(const TrainBatch& batch_in, const torch::Tensor& on_policy_rows) {
  const std::vector<torch::Tensor>& params = optimizer_->parameters();
  const TrainBatch batch = batch_in.To(params.front().device());
  // The positions the training–inference mismatch is measured on: response
  // positions of the on-policy rows.
  torch::Tensor mismatch_mask = batch.response_mask;
  if (on_policy_rows.defined()) {
    if (on_policy_rows.numel() != batch.response_mask.size(0)) {
      throw std::invalid_argument("HybridStep::Run: on_policy_rows has " +
                                  std::to_string(on_policy_rows.numel()) + " elements for " +
                                  std::to_string(batch.response_mask.size(0)) + " rows");
    }
    const torch::Tensor rows =
        (on_policy_rows.reshape({-1, 1}).to(batch.response_mask.device()) != 0)
            .to(batch.response_mask.scalar_type());
    mismatch_mask = batch.response_mask * rows;
  }
  const int64_t step = optimizer_->step() + 1;  // the step this call makes, 1-based
  const std::vector<MicroBatch> micro = SplitMicroBatches(batch, config_.micro_batch_sequences);
  HybridStepReport report;
  report.lambda = lambda();
  report.demonstrations = batch.num_demonstrations;
  report.teacher_tail_mass = TeacherTailMass(batch.teacher(), batch.response_mask);
  report.teacher_bytes = batch.teacher_bytes();

  // D: the positions L_D trains on, decided over the whole batch. The fused
  // head's training forward is its own, so the gate's forward is not kept.
  std::optional<TokenTerms> first_forward;
  const bool fused = Fuses();
  const Gate gate = DecideGate(batch, micro, fused ? nullptr : &first_forward);
  report.distill_positions = gate.selection.selected_positions;
  report.gated_groups = gate.selection.gated_groups;

  // g = w_R g_R′ + s g_D + μ g_SFT, each term a mean over the whole batch.
  BeginStep(batch, gate, step, report.lambda, static_cast<int64_t>(micro.size()));

  // Each micro-batch: forward → cheap K_DR → m3_mask → aggregate → backward.
  KdrMonitor kdr(config_.monitor, config_.loss, step, gate.scored, config_.balance.mask,
                 batch.response_mask);
  TokenMeans means;
  MismatchSums mismatch;
  for (size_t k = 0; k < micro.size(); ++k) {
    if (fused) {
      AccumulateFusedMicroBatch(micro[k], gate, SeparateGradients(step), mismatch_mask, kdr, &means,
                                &mismatch, &report);
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    const TokenTerms tokens =
        k == 0 && first_forward ? *std::move(first_forward) : Forward(micro[k].batch);
    report.forward_layers_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    AccumulateMicroBatch(micro[k], tokens, gate, mismatch_mask, kdr, &means, &mismatch, &report);
  }
  means.WriteTo(&report);
  mismatch.WriteTo(&report);

  // K_DR over the whole batch; exact K_DR at θ, before the update moves it.
  kdr.Summarize(&report);
  if (kdr.exact_due()) {
    kdr.MeasureExact(
        batch, params, [this](const TrainBatch& rows) { return Forward(rows); }, &report);
  }

  // Combine (m3_project, m3_norm or λ), clip, AdamW; then m3_adapt moves λ
  // (not after a skipped, non-finite step).
  report.stats = optimizer_->FinishStep();
  if (lambda_controller_ && report.stats.measured && !report.stats.skipped()) {
    lambda_controller_->Update(report.stats.reward_grad_norm, report.stats.distill_grad_norm);
  }
  return report;
}

}  // namespace kappa::learner
