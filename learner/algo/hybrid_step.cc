#include "learner/algo/hybrid_step.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "learner/algo/logit_gradients.h"

namespace kappa::learner {
namespace {

bool Due(int64_t every, int64_t step) { return every > 0 && step % every == 0; }

// The cheap K_DR estimate an option names, of the two computed together.
const torch::Tensor& KernelOf(KdrEstimator estimator, const torch::Tensor& logit,
                              const torch::Tensor& last_layer) {
  return estimator == KdrEstimator::kLogit ? logit : last_layer;
}

}  // namespace

HybridStep::HybridStep(model::Decoder model, std::unique_ptr<PolicyOptimizer> optimizer,
                       HybridStepConfig config)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), config_(std::move(config)) {
  if (config_.monitor.kdr_estimator == KdrEstimator::kExact) {
    throw std::invalid_argument(
        "monitor.kdr_estimator must be last_layer or logit (exact runs on sampled positions "
        "via monitor.kdr_exact_every)");
  }
  if (config_.balance.mask && config_.balance.mask_estimator == KdrEstimator::kExact) {
    throw std::invalid_argument("m3.mask_estimator must be logit or last_layer");
  }
  if (config_.balance.adapt) {
    lambda_controller_.emplace(config_.loss.lambda, config_.balance.kappa_target,
                               config_.balance.adapt_config);
  }
}

double HybridStep::lambda() const {
  return lambda_controller_ ? lambda_controller_->lambda() : config_.loss.lambda;
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

HybridStepReport HybridStep::Run(const TrainBatch& batch_in) {
  const std::vector<torch::Tensor>& params = optimizer_->parameters();
  const TrainBatch batch = batch_in.To(params.front().device());
  const int64_t step = optimizer_->step() + 1;  // the step this call makes, 1-based
  const MonitorConfig& monitor = config_.monitor;
  const BalanceConfig& balance = config_.balance;
  const LossConfig& loss = config_.loss;
  const torch::Tensor& mask = batch.response_mask;

  HybridStepReport report;
  report.lambda = lambda();
  const std::vector<MicroBatch> micro = SplitMicroBatches(batch, config_.micro_batch_sequences);
  // ComputeTokenTerms gives ℓ_D exactly when the batch has teacher log-probs.
  const bool has_distill = batch.teacher_logprobs.defined() && config_.gate != DistillGate::kNone;

  // The distillation gate ranks positions across the whole batch (RSTG's
  // token_frac), so it is decided before any micro-batch's backward. With a
  // single micro-batch its forward serves; with several, RSTG takes one
  // extra forward without graph.
  std::optional<TokenTerms> first_tokens;
  DistillSelection selection;
  bool no_distill = !has_distill;
  if (has_distill) {
    if (config_.gate == DistillGate::kRstg) {
      torch::Tensor entropy, divergence;
      if (micro.size() == 1) {
        first_tokens = Forward(batch);
        entropy = first_tokens->entropy;
        divergence = first_tokens->distill.detach();
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
      selection = RstgSelect(batch.rewards, mask, batch.teacher_logprobs, batch.target_tokens,
                             entropy, divergence, config_.rstg);
    } else {
      selection = SelectAll(mask);
    }
    report.distill_positions = selection.selected_positions;
    report.gated_groups = selection.gated_groups;
    // Nothing selected (RSTG with no all-zero group): no L_D and no backward for it.
    no_distill = selection.selected_positions == 0;
  }

  // What the whole batch's means are taken over, before the first backward.
  const torch::Tensor zeros = torch::zeros_like(mask);
  torch::Tensor reward_count, distill_count, sft_count;
  Aggregate(zeros, mask, loss.aggregation, &reward_count);
  if (no_distill) {
    distill_count = torch::zeros({}, mask.options());
  } else {
    Aggregate(zeros, selection.selected, loss.aggregation, &distill_count);
  }
  sft_count = batch.sft_mask.defined() ? batch.sft_mask.sum() : torch::zeros({}, mask.options());

  GradientPlan plan;
  plan.reward_weight = config_.reward_weight;
  plan.distill_weight = report.lambda;
  plan.sft_weight = config_.sft_weight;
  plan.project = balance.project;
  plan.normalize = balance.normalize;
  plan.kappa_target = balance.kappa_target;
  const bool separate = Due(monitor.kappa_every, step) || balance.NeedsSeparateGradients();
  optimizer_->BeginStep(plan, separate, reward_count, distill_count, sft_count);

  // Cheap K_DR from the closed-form logit gradients of the unweighted
  // per-position terms, over every response position.
  const bool kdr_due = has_distill && Due(monitor.kdr_every, step);
  const bool mask_due = has_distill && balance.mask;
  const bool exact_due = has_distill && Due(monitor.kdr_exact_every, step);
  torch::Tensor logit_kernel, last_layer_kernel;  // [B, L], over the whole batch
  if (kdr_due || mask_due || exact_due) {
    logit_kernel = torch::zeros_like(mask);
    last_layer_kernel = torch::zeros_like(mask);
  }
  // Token means over the micro-batches, weighted by their response tokens.
  double entropy_sum = 0, clip_sum = 0, approx_kl_sum = 0, token_sum = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    const MicroBatch& part = micro[k];
    const TrainBatch& sub = part.batch;
    const TokenTerms tokens =
        k == 0 && first_tokens ? *std::move(first_tokens) : Forward(sub);
    TermWeights weights;
    weights.no_distill = no_distill;
    if (has_distill) {
      weights.distill = part.Slice(selection.weights);
      weights.distill_mask = part.Slice(selection.selected);
    }
    if (logit_kernel.defined()) {
      torch::NoGradGuard no_grad;
      const torch::Tensor logprobs = tokens.logprobs.detach();
      const torch::Tensor coefficient = RewardLogProbCoefficient(
          tokens.token_logprobs.detach(), sub.old_logprobs, sub.advantages, loss.ppo);
      const torch::Tensor g_r =
          RewardLogitGradient(logprobs, sub.target_tokens, coefficient, loss.temperature);
      const torch::Tensor g_d =
          DistillLogitGradient(logprobs, sub.teacher_logprobs, sub.target_tokens, loss.distill,
                               loss.distill_topk, loss.temperature);
      const torch::Tensor logit_part = LogitCrossKernel(g_r, g_d) * sub.response_mask;
      const torch::Tensor last_layer_part =
          LastLayerCrossKernel(logit_part, tokens.hidden.detach());
      part.Scatter(logit_part.to(mask.scalar_type()), logit_kernel);
      part.Scatter(last_layer_part.to(mask.scalar_type()), last_layer_kernel);
      if (mask_due) {
        const torch::Tensor& kernel =
            KernelOf(balance.mask_estimator, logit_part, last_layer_part);
        const torch::Tensor w = ConflictMaskWeights(kernel, balance.mask_temperature);
        report.masked_positions += ((kernel < 0) & (sub.response_mask > 0)).sum().item<int64_t>();
        if (balance.mask_target == BalanceConfig::MaskTarget::kReward) {
          weights.reward = w;
        } else {
          weights.distill = weights.distill.defined() ? weights.distill * w : w;
        }
      }
    }
    const LossTerms terms = AggregateTerms(tokens, sub, loss, weights);
    const double tokens_here = micro.size() == 1 ? 1.0 : sub.response_mask.sum().item<double>();
    entropy_sum += terms.entropy * tokens_here;
    clip_sum += terms.clip_fraction * tokens_here;
    approx_kl_sum += terms.approx_kl * tokens_here;
    token_sum += tokens_here;
    optimizer_->AccumulateStep(terms);
  }
  if (token_sum > 0) {
    report.entropy = entropy_sum / token_sum;
    report.clip_fraction = clip_sum / token_sum;
    report.approx_kl = approx_kl_sum / token_sum;
  }
  report.demonstrations = batch.num_demonstrations;

  if (kdr_due) {
    const torch::Tensor& kernel =
        KernelOf(monitor.kdr_estimator, logit_kernel, last_layer_kernel);
    report.kdr = SummarizeKdr(kernel, mask);
    const torch::Tensor values =
        kernel.masked_select(mask > 0).to(torch::kCPU, torch::kFloat32).contiguous();
    report.kdr_values.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
  }
  if (exact_due) {
    const auto start = std::chrono::steady_clock::now();
    const auto positions = SampleResponsePositions(
        mask, monitor.kdr_exact_positions, monitor.seed * 1000003ULL + static_cast<uint64_t>(step));
    // ℓ_R(n) and ℓ_D(n) depend on row b alone, so the per-position
    // backward passes run through a forward of the sampled rows only.
    std::vector<int64_t> rows;
    for (const auto& [b, t] : positions) {
      if (rows.empty() || rows.back() != b) rows.push_back(b);  // positions are sorted
    }
    std::vector<std::pair<int64_t, int64_t>> local;
    for (const auto& [b, t] : positions) {
      local.emplace_back(std::lower_bound(rows.begin(), rows.end(), b) - rows.begin(), t);
    }
    torch::AutoGradMode enable_grad(true);
    const TrainBatch sampled_rows = batch.SelectRows(torch::tensor(rows, torch::kInt64));
    const TokenTerms sub_tokens = Forward(sampled_rows);
    const std::vector<double> exact =
        ExactCrossKernel(params, sub_tokens.reward, sub_tokens.distill, local);
    report.exact_positions = static_cast<int64_t>(positions.size());
    if (!positions.empty()) {
      report.agreement_logit = SignAgreement(ValuesAt(logit_kernel, positions), exact);
      report.agreement_last_layer = SignAgreement(ValuesAt(last_layer_kernel, positions), exact);
      torch::Tensor exact_kernel = torch::zeros_like(mask, torch::kFloat64);
      torch::Tensor exact_mask = torch::zeros_like(mask);
      for (size_t k = 0; k < positions.size(); ++k) {
        exact_kernel[positions[k].first][positions[k].second] = exact[k];
        exact_mask[positions[k].first][positions[k].second] = 1.0;
      }
      report.kdr_exact = SummarizeKdr(exact_kernel, exact_mask);
    }
    report.exact_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  report.stats = optimizer_->FinishStep();
  if (lambda_controller_ && report.stats.measured) {
    lambda_controller_->Update(report.stats.reward_grad_norm, report.stats.distill_grad_norm);
  }
  return report;
}

}  // namespace kappa::learner
