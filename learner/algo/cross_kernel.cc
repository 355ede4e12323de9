#include "learner/algo/cross_kernel.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

namespace kappa::learner {

KdrEstimator ParseKdrEstimator(const std::string& name) {
  if (name == "exact") return KdrEstimator::kExact;
  if (name == "last_layer") return KdrEstimator::kLastLayer;
  if (name == "logit") return KdrEstimator::kLogit;
  throw std::invalid_argument("unknown K_DR estimator '" + name +
                              "' (allowed: exact, last_layer, logit)");
}

const char* KdrEstimatorName(KdrEstimator estimator) {
  switch (estimator) {
    case KdrEstimator::kExact: return "exact";
    case KdrEstimator::kLastLayer: return "last_layer";
    case KdrEstimator::kLogit: return "logit";
  }
  return "unknown";
}

torch::Tensor LogitCrossKernel(const torch::Tensor& reward_logit_grad,
                               const torch::Tensor& distill_logit_grad) {
  return (reward_logit_grad * distill_logit_grad).sum(-1);
}

torch::Tensor LastLayerCrossKernel(const torch::Tensor& logit_kernel, const torch::Tensor& hidden) {
  return hidden.to(logit_kernel.scalar_type()).square().sum(-1) * logit_kernel;
}

std::vector<std::pair<int64_t, int64_t>> SampleResponsePositions(const torch::Tensor& mask,
                                                                 int64_t count, uint64_t seed) {
  const torch::Tensor nonzero = (mask.to(torch::kCPU) > 0).nonzero();  // [N, 2]
  const int64_t n = nonzero.size(0);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(seed);
  const int64_t take = std::min(std::max<int64_t>(count, 0), n);
  // Partial Fisher–Yates: the first `take` entries are a uniform sample.
  for (int64_t i = 0; i < take; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, n - 1);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(pick(rng))]);
  }
  auto rows = nonzero.accessor<int64_t, 2>();
  std::vector<std::pair<int64_t, int64_t>> positions;
  positions.reserve(static_cast<size_t>(take));
  for (int64_t i = 0; i < take; ++i) {
    const int64_t k = order[static_cast<size_t>(i)];
    positions.emplace_back(rows[k][0], rows[k][1]);
  }
  std::sort(positions.begin(), positions.end());
  return positions;
}

std::vector<double> ExactCrossKernel(const std::vector<torch::Tensor>& params,
                                     const torch::Tensor& reward_terms,
                                     const torch::Tensor& distill_terms,
                                     const std::vector<std::pair<int64_t, int64_t>>& positions) {
  auto gradient = [&](const torch::Tensor& term) {
    std::vector<torch::Tensor> g =
        torch::autograd::grad({term}, params, /*grad_outputs=*/{}, /*retain_graph=*/true,
                              /*create_graph=*/false, /*allow_unused=*/true);
    // An untied model's token lookup gives a sparse gradient
    // (Decoder::SetSparseEmbeddingGradient).
    for (torch::Tensor& t : g) {
      if (t.defined() && t.is_sparse()) t = t.to_dense();
    }
    return g;
  };
  if (positions.empty()) return {};
  const auto f64 = torch::TensorOptions(params.front().device()).dtype(torch::kFloat64);
  std::vector<torch::Tensor> dots;
  dots.reserve(positions.size());
  for (const auto& [b, t] : positions) {
    const std::vector<torch::Tensor> g_r = gradient(reward_terms[b][t]);
    const std::vector<torch::Tensor> g_d = gradient(distill_terms[b][t]);
    torch::Tensor dot = torch::zeros({}, f64);
    for (size_t i = 0; i < params.size(); ++i) {
      if (g_r[i].defined() && g_d[i].defined()) {
        dot = dot + (g_r[i].to(torch::kFloat64) * g_d[i].to(torch::kFloat64)).sum();
      }
    }
    dots.push_back(dot);
  }
  const torch::Tensor host = torch::stack(dots).to(torch::kCPU).contiguous();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

double SignAgreement(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw std::invalid_argument("SignAgreement: size mismatch");
  if (a.empty()) return std::numeric_limits<double>::quiet_NaN();
  auto sign = [](double x) { return (x > 0) - (x < 0); };
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += sign(a[i]) == sign(b[i]);
  return static_cast<double>(same) / static_cast<double>(a.size());
}

std::vector<double> ValuesAt(const torch::Tensor& values,
                             const std::vector<std::pair<int64_t, int64_t>>& positions) {
  const torch::Tensor host = values.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  auto v = host.accessor<double, 2>();
  std::vector<double> out;
  out.reserve(positions.size());
  for (const auto& [b, t] : positions) out.push_back(v[b][t]);
  return out;
}

KdrSummary SummarizeKdr(const torch::Tensor& kernel, const torch::Tensor& mask,
                        const torch::Tensor& response_mask) {
  torch::NoGradGuard no_grad;
  const torch::Tensor valid = mask.detach() > 0;
  // Relative place of each position in its response, from the running count
  // of response positions along the row.
  const torch::Tensor response =
      (response_mask.defined() ? response_mask : mask).detach().to(torch::kFloat64);
  const torch::Tensor index_in_response = response.cumsum(1) - 1;
  const torch::Tensor length = response.sum(1, /*keepdim=*/true);
  const torch::Tensor bucket =
      (index_in_response * KdrSummary::kPositionBuckets / length.clamp_min(1))
          .floor()
          .clamp(0, KdrSummary::kPositionBuckets - 1)
          .to(torch::kInt64);

  const torch::Tensor k = kernel.detach().to(torch::kFloat64).masked_select(valid).to(torch::kCPU);
  const torch::Tensor buckets = bucket.masked_select(valid).to(torch::kCPU);
  KdrSummary summary;
  summary.positions = k.numel();
  summary.position_mean.fill(std::numeric_limits<double>::quiet_NaN());
  if (summary.positions == 0) {
    summary.quantiles.fill(std::numeric_limits<double>::quiet_NaN());
    return summary;
  }
  const torch::Tensor negative = k < 0;
  const double abs_sum = k.abs().sum().item<double>();
  summary.mean = k.mean().item<double>();
  summary.negative_fraction = negative.to(torch::kFloat64).mean().item<double>();
  summary.negative_weighted_fraction =
      abs_sum > 0 ? k.masked_select(negative).abs().sum().item<double>() / abs_sum : 0.0;
  const torch::Tensor levels =
      torch::tensor(std::vector<double>(KdrSummary::kQuantileLevels.begin(),
                                        KdrSummary::kQuantileLevels.end()),
                    torch::kFloat64);
  const torch::Tensor q = torch::quantile(k, levels);
  for (size_t i = 0; i < summary.quantiles.size(); ++i) {
    summary.quantiles[i] = q[static_cast<int64_t>(i)].item<double>();
  }
  const torch::Tensor sums =
      torch::zeros({KdrSummary::kPositionBuckets}, torch::kFloat64).index_add_(0, buckets, k);
  const torch::Tensor counts = torch::zeros({KdrSummary::kPositionBuckets}, torch::kFloat64)
                                   .index_add_(0, buckets, torch::ones_like(k));
  for (int i = 0; i < KdrSummary::kPositionBuckets; ++i) {
    const double c = counts[i].item<double>();
    if (c > 0) summary.position_mean[static_cast<size_t>(i)] = sums[i].item<double>() / c;
  }
  return summary;
}

}  // namespace kappa::learner
