#include "learner/algo/kdr_monitor.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "learner/algo/logit_gradients.h"

namespace kappa::learner {
namespace {

using Position = std::pair<int64_t, int64_t>;

// The distinct rows of sorted `positions`, and each position with its row
// renumbered into that list.
std::pair<std::vector<int64_t>, std::vector<Position>> RowsOf(
    const std::vector<Position>& positions) {
  std::vector<int64_t> rows;
  for (const auto& [b, t] : positions) {
    if (rows.empty() || rows.back() != b) rows.push_back(b);
  }
  std::vector<Position> local;
  for (const auto& [b, t] : positions) {
    local.emplace_back(std::lower_bound(rows.begin(), rows.end(), b) - rows.begin(), t);
  }
  return {std::move(rows), std::move(local)};
}

}  // namespace

torch::Tensor KdrMonitor::LogitKernel(const TokenTerms& tokens, const TrainBatch& sub,
                                      const torch::Tensor& coefficient) const {
  if (tokens.output_weight.defined()) {
    // The chunked head: g_R·g_D one chunk of positions at a time, at the
    // response positions the head computed.
    const VocabHeadInputs in = HeadInputs(tokens, sub, loss_);
    const torch::Tensor values =
        VocabHeadLogitKernel(in, coefficient.reshape({-1}).index_select(0, tokens.head_positions));
    return torch::zeros({sub.response_mask.numel()}, values.options())
        .index_put_({tokens.head_positions}, values)
        .view(sub.response_mask.sizes());
  }
  const torch::Tensor logprobs = tokens.logprobs.detach();
  const torch::Tensor g_r =
      RewardLogitGradient(logprobs, sub.target_tokens, coefficient, loss_.temperature);
  const torch::Tensor g_d = DistillLogitGradient(logprobs, sub.teacher(), sub.target_tokens,
                                                 loss_.distill, loss_.temperature);
  return LogitCrossKernel(g_r, g_d);
}

KdrMonitor::KdrMonitor(const MonitorConfig& monitor, const LossConfig& loss, int64_t step,
                       bool has_distill, bool kernels_for_mask, const torch::Tensor& response_mask)
    : monitor_(monitor),
      loss_(loss),
      step_(step),
      response_mask_(response_mask),
      statistics_due_(has_distill && Due(monitor.kdr_every, step)),
      exact_due_(has_distill && Due(monitor.kdr_exact_every, step)) {
  if (statistics_due_ || exact_due_ || (has_distill && kernels_for_mask)) {
    logit_ = torch::zeros_like(response_mask);
    last_layer_ = torch::zeros_like(response_mask);
  }
}

void KdrMonitor::CheckAllObserved(const char* what) const {
  const int64_t rows = response_mask_.size(0);
  if (observed_rows_ != rows) {
    throw std::logic_error(
        std::string(what) + " requires every micro-batch observed; Observe saw " +
        std::to_string(observed_rows_) + " of the batch's " + std::to_string(rows) + " rows");
  }
}

CheapKernels KdrMonitor::Observe(const MicroBatch& part, const TokenTerms& tokens) {
  if (!observing()) {
    throw std::logic_error(
        "KdrMonitor::Observe requires observing(): no monitor is due at this step");
  }
  const TrainBatch& sub = part.batch;
  if (!tokens.token_logprobs.defined() ||
      tokens.token_logprobs.sizes() != sub.response_mask.sizes()) {
    throw std::invalid_argument(
        "KdrMonitor::Observe requires `tokens` to be the forward of `part.batch`: token "
        "log-probs " +
        (tokens.token_logprobs.defined() ? c10::str(tokens.token_logprobs.sizes())
                                         : std::string("undefined")) +
        " for a response mask " + c10::str(sub.response_mask.sizes()));
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor coefficient = RewardLogProbCoefficient(
      tokens.token_logprobs.detach(), sub.old_logprobs, sub.advantages, loss_.ppo);
  return Record(part, LogitKernel(tokens, sub, coefficient) * sub.response_mask,
                tokens.hidden.detach());
}

CheapKernels KdrMonitor::Record(const MicroBatch& part, const torch::Tensor& logit_kernel,
                                const torch::Tensor& hidden) {
  if (!observing()) {
    throw std::logic_error(
        "KdrMonitor::Record requires observing(): no monitor is due at this step");
  }
  const TrainBatch& sub = part.batch;
  torch::NoGradGuard no_grad;
  CheapKernels kernels;
  kernels.logit = logit_kernel;
  kernels.last_layer = LastLayerCrossKernel(kernels.logit, hidden);
  part.Scatter(kernels.logit.to(logit_.scalar_type()), logit_);
  part.Scatter(kernels.last_layer.to(last_layer_.scalar_type()), last_layer_);
  observed_rows_ += sub.response_mask.size(0);
  return kernels;
}

void KdrMonitor::Summarize(HybridStepReport* report) const {
  if (!statistics_due_) return;
  CheckAllObserved("KdrMonitor::Summarize");
  const torch::Tensor& kernel =
      monitor_.kdr_estimator == KdrEstimator::kLogit ? logit_ : last_layer_;
  report->kdr = SummarizeKdr(kernel, response_mask_);
  report->kdr_kernel = (kernel * response_mask_).to(torch::kCPU, torch::kFloat32).contiguous();
  const torch::Tensor values =
      kernel.masked_select(response_mask_ > 0).to(torch::kCPU, torch::kFloat32).contiguous();
  report->kdr_values.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
}

void KdrMonitor::MeasureExact(const TrainBatch& batch, const std::vector<torch::Tensor>& params,
                              const std::function<TokenTerms(const TrainBatch&)>& forward,
                              HybridStepReport* report) const {
  if (!exact_due_) {
    throw std::logic_error("KdrMonitor::MeasureExact requires exact_due(): not due at step " +
                           std::to_string(step_));
  }
  CheckAllObserved("KdrMonitor::MeasureExact");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Position> positions =
      SampleResponsePositions(response_mask_, monitor_.kdr_exact_positions,
                              monitor_.seed * 1000003ULL + static_cast<uint64_t>(step_));
  // ℓ_R(n) and ℓ_D(n) depend on row b alone, so the per-position backward
  // passes run through a forward of the sampled rows only.
  const auto [rows, local] = RowsOf(positions);
  torch::AutoGradMode enable_grad(true);
  const TokenTerms sampled = forward(batch.SelectRows(torch::tensor(rows, torch::kInt64)));
  const std::vector<double> exact =
      ExactCrossKernel(params, sampled.reward, sampled.distill, local);
  report->exact_positions = static_cast<int64_t>(positions.size());
  if (!positions.empty()) {
    report->agreement_logit = SignAgreement(ValuesAt(logit_, positions), exact);
    report->agreement_last_layer = SignAgreement(ValuesAt(last_layer_, positions), exact);
    torch::Tensor exact_kernel = torch::zeros_like(response_mask_, torch::kFloat64);
    torch::Tensor exact_mask = torch::zeros_like(response_mask_);
    for (size_t k = 0; k < positions.size(); ++k) {
      exact_kernel[positions[k].first][positions[k].second] = exact[k];
      exact_mask[positions[k].first][positions[k].second] = 1.0;
    }
    // Bucketed by place in the whole response, not among the sampled.
    report->kdr_exact = SummarizeKdr(exact_kernel, exact_mask, response_mask_);
  }
  report->exact_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kappa::learner
