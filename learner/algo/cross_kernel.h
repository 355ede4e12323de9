// The cross-signal NTK K_DR(n) = ⟨∇_θ ℓ_R(n), ∇_θ ℓ_D(n)⟩ = g_R(n)ᵀ Θ(n,n) g_D(n)
// (docs/algorithms.md §3.2) and the per-step statistics the monitors report.
// K_DR(n) < 0: a reward step raises the distillation loss at position n.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kappa::learner {

enum class KdrEstimator { kExact, kLastLayer, kLogit };

// "exact" | "last_layer" | "logit"; throws std::invalid_argument otherwise.
KdrEstimator ParseKdrEstimator(const std::string& name);
const char* KdrEstimatorName(KdrEstimator estimator);

// `logit` estimator, Θ = I: K(n) = g_R(n)·g_D(n). Gradients [B, T, V] → [B, T].
torch::Tensor LogitCrossKernel(const torch::Tensor& reward_logit_grad,
                               const torch::Tensor& distill_logit_grad);

// `last_layer` estimator, Θ restricted to the output projection z = W h (no
// bias in our decoder): ∂z/∂W gives Θ = ‖h_n‖² I, so K(n) = ‖h_n‖² g_R·g_D.
// It has the sign of the logit estimator everywhere; the two differ in
// weight, which matters for |K|-weighted statistics and soft masks.
// hidden: [B, T, D], the input of the output projection.
torch::Tensor LastLayerCrossKernel(const torch::Tensor& logit_kernel, const torch::Tensor& hidden);

// `count` distinct response positions (b, t) drawn uniformly from mask > 0
// (all of them when there are fewer), deterministic in `seed`.
std::vector<std::pair<int64_t, int64_t>> SampleResponsePositions(const torch::Tensor& mask,
                                                                 int64_t count, uint64_t seed);

// `exact` estimator: for each position, autograd of ℓ_R(n) and of ℓ_D(n)
// with respect to `params` and their inner product (two backward passes per
// position through the retained graph; the graph survives). The per-position
// terms are the real loss terms, so off-policy ratios and clipping are
// included. reward_terms, distill_terms: [B, T] with graph.
std::vector<double> ExactCrossKernel(const std::vector<torch::Tensor>& params,
                                     const torch::Tensor& reward_terms,
                                     const torch::Tensor& distill_terms,
                                     const std::vector<std::pair<int64_t, int64_t>>& positions);

// Share of positions where sign(a) == sign(b) (zero counts as its own sign).
double SignAgreement(const std::vector<double>& a, const std::vector<double>& b);

// Values of a [B, T] tensor at `positions`.
std::vector<double> ValuesAt(const torch::Tensor& values,
                             const std::vector<std::pair<int64_t, int64_t>>& positions);

struct KdrSummary {
  static constexpr int kPositionBuckets = 10;
  static constexpr std::array<double, 5> kQuantileLevels = {0.05, 0.25, 0.5, 0.75, 0.95};

  int64_t positions = 0;
  double mean = 0.0;
  double negative_fraction = 0.0;           // #{K < 0} / #positions
  double negative_weighted_fraction = 0.0;  // Σ_{K<0} |K| / Σ |K|
  std::array<double, 5> quantiles{};        // at kQuantileLevels
  // Mean K over positions whose relative place in their response,
  // (index in response) / (response length), falls in bucket k of 10;
  // NaN for an empty bucket.
  std::array<double, kPositionBuckets> position_mean{};
};

// Statistics of K over the positions (mask > 0) of a [B, T] tensor. A
// position's place in its response is counted along `response_mask` [B, T]
// (undefined: `mask` itself), so a sample of a response's positions is
// bucketed where it stands in the whole response.
KdrSummary SummarizeKdr(const torch::Tensor& kernel, const torch::Tensor& mask,
                        const torch::Tensor& response_mask = {});

}  // namespace kappa::learner
