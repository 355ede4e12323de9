#include "learner/algo/hybrid_step.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "learner/algo/logit_gradients.h"

namespace kappa::learner {
namespace {

bool Due(int64_t every, int64_t step) { return every > 0 && step % every == 0; }

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

HybridStepReport HybridStep::Run(const TrainBatch& batch_in) {
  const std::vector<torch::Tensor>& params = optimizer_->parameters();
  const TrainBatch batch = batch_in.To(params.front().device());
  const int64_t step = optimizer_->step() + 1;  // the step this call makes, 1-based
  const MonitorConfig& monitor = config_.monitor;
  const BalanceConfig& balance = config_.balance;
  const LossConfig& loss = config_.loss;

  HybridStepReport report;
  report.lambda = lambda();
  const torch::Device device = params.front().device();
  TokenTerms tokens;
  {
    AutocastGuard autocast(device, config_.precision);
    tokens = ComputeTokenTerms(model_, batch, loss);
  }
  const bool has_distill = tokens.distill.defined() && config_.gate != DistillGate::kNone;
  const torch::Tensor& mask = batch.response_mask;

  TermWeights weights;
  weights.no_distill = !has_distill;
  if (has_distill) {
    const DistillSelection selection =
        config_.gate == DistillGate::kRstg
            ? RstgSelect(batch.rewards, mask, batch.teacher_logprobs, batch.target_tokens,
                         tokens.entropy, tokens.distill.detach(), config_.rstg)
            : SelectAll(mask);
    weights.distill = selection.weights;
    weights.distill_mask = selection.selected;
    report.distill_positions = selection.selected_positions;
    report.gated_groups = selection.gated_groups;
    // Nothing selected (RSTG with no all-zero group): no L_D and no backward for it.
    weights.no_distill = selection.selected_positions == 0;
  }

  // Cheap K_DR from the closed-form logit gradients of the unweighted
  // per-position terms, over every response position.
  const bool kdr_due = has_distill && Due(monitor.kdr_every, step);
  const bool mask_due = has_distill && balance.mask;
  const bool exact_due = has_distill && Due(monitor.kdr_exact_every, step);
  if (kdr_due || mask_due || exact_due) {
    torch::NoGradGuard no_grad;
    const torch::Tensor logprobs = tokens.logprobs.detach();
    const torch::Tensor coefficient = RewardLogProbCoefficient(
        tokens.token_logprobs.detach(), batch.old_logprobs, batch.advantages, loss.ppo);
    const torch::Tensor g_r =
        RewardLogitGradient(logprobs, batch.target_tokens, coefficient, loss.temperature);
    const torch::Tensor g_d =
        DistillLogitGradient(logprobs, batch.teacher_logprobs, batch.target_tokens, loss.distill,
                             loss.distill_topk, loss.temperature);
    const torch::Tensor logit_kernel = LogitCrossKernel(g_r, g_d) * mask;
    const torch::Tensor last_layer_kernel =
        LastLayerCrossKernel(logit_kernel, tokens.hidden.detach());
    auto kernel_of = [&](KdrEstimator e) {
      return e == KdrEstimator::kLogit ? logit_kernel : last_layer_kernel;
    };
    if (kdr_due) {
      const torch::Tensor& kernel = kernel_of(monitor.kdr_estimator);
      report.kdr = SummarizeKdr(kernel, mask);
      const torch::Tensor values =
          kernel.masked_select(mask > 0).to(torch::kCPU, torch::kFloat32).contiguous();
      report.kdr_values.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
    }
    if (mask_due) {
      const torch::Tensor kernel = kernel_of(balance.mask_estimator);
      const torch::Tensor w = ConflictMaskWeights(kernel, balance.mask_temperature);
      report.masked_positions = ((kernel < 0) & (mask > 0)).sum().item<int64_t>();
      if (balance.mask_target == BalanceConfig::MaskTarget::kReward) {
        weights.reward = w;
      } else {
        weights.distill = weights.distill.defined() ? weights.distill * w : w;
      }
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
      const TrainBatch sub = batch.SelectRows(torch::tensor(rows, torch::kInt64));
      TokenTerms sub_tokens;
      {
        AutocastGuard autocast(device, config_.precision);
        sub_tokens = ComputeTokenTerms(model_, sub, loss);
      }
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
  }
  report.demonstrations = batch.num_demonstrations;

  const LossTerms terms = AggregateTerms(tokens, batch, loss, weights);
  report.entropy = terms.entropy;
  report.clip_fraction = terms.clip_fraction;
  report.approx_kl = terms.approx_kl;

  GradientPlan plan;
  plan.reward_weight = config_.reward_weight;
  plan.distill_weight = report.lambda;
  plan.sft_weight = config_.sft_weight;
  plan.project = balance.project;
  plan.normalize = balance.normalize;
  plan.kappa_target = balance.kappa_target;
  const bool separate = Due(monitor.kappa_every, step) || balance.NeedsSeparateGradients();
  report.stats = optimizer_->Step(terms, plan, separate);
  if (lambda_controller_ && report.stats.measured) {
    lambda_controller_->Update(report.stats.reward_grad_norm, report.stats.distill_grad_norm);
  }
  return report;
}

}  // namespace kappa::learner
