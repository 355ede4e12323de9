// The K_DR a learner step reports (the kdr_* metrics: HybridStepReport's
// kdr, kdr_values, kdr_kernel, kdr_exact and the sign agreements) against
// docs/algorithms.md §3.2 evaluated here from per-position autograd on the
// plain float64 model: K(n) = ⟨∇_θ ℓ_R(n), ∇_θ ℓ_D(n)⟩ over every parameter
// (exact), over the output projection W alone (last_layer), and
// ∂ℓ_R(n)/∂z_n · ∂ℓ_D(n)/∂z_n at the logits (logit). The per-position terms
// are written out from §2.1–2.2, not taken from the losses or the closed-form
// logit gradients the step uses, and the statistics are computed from their
// definitions, not by SummarizeKdr.
#include "learner/algo/kdr_monitor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "learner/algo/cross_kernel.h"
#include "learner/algo/hybrid_step.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::RandomGroups;
using testing::TinyModel;

constexpr double kTemperature = 0.8;

model::Decoder Float64Model() {
  model::Decoder m = TinyModel(8);
  m->to(torch::kFloat64);
  return m;
}

// ℓ_R(n) (clipped PPO surrogate with the ±20 log-ratio clamp and the dual
// clip) and ℓ_D(n) = KL(p_n ‖ q_n), p_n = softmax(z_n / τ), from `logits`.
std::pair<torch::Tensor, torch::Tensor> DefinitionTerms(const torch::Tensor& logits,
                                                        const TrainBatch& b, const PpoConfig& ppo) {
  const torch::Tensor lp = torch::log_softmax(logits / kTemperature, -1);
  const torch::Tensor token = lp.gather(-1, b.target_tokens.unsqueeze(-1)).squeeze(-1);
  const torch::Tensor rho = (token - b.old_logprobs).clamp(-20.0, 20.0).exp();
  const torch::Tensor a = b.advantages;
  torch::Tensor reward =
      torch::max(-rho * a, -rho.clamp(1.0 - ppo.clip_low, 1.0 + ppo.clip_high) * a);
  reward = torch::where(a < 0, torch::min(reward, -ppo.dual_clip * a), reward);
  const torch::Tensor distill = (lp.exp() * (lp - b.teacher_logprobs)).sum(-1);
  return {reward, distill};
}

// One response position: its K under the three estimators, and where it
// sits in its response (for the position buckets).
struct Reference {
  int64_t b = 0, t = 0;
  double exact = 0, last_layer = 0, logit = 0;
  int64_t index_in_response = 0, response_length = 0;

  double Of(KdrEstimator e) const {
    return e == KdrEstimator::kExact ? exact : e == KdrEstimator::kLogit ? logit : last_layer;
  }
};

// Every response position of `b` in row-major order, K by autograd.
std::vector<Reference> ReferenceKernels(model::Decoder& model, const TrainBatch& b,
                                        const PpoConfig& ppo) {
  std::vector<torch::Tensor> params;
  size_t output = params.size();
  for (auto& p : model->parameters()) {
    if (p.is_same(model->lm_head()->weight)) output = params.size();
    params.push_back(p);
  }
  EXPECT_LT(output, params.size());
  const torch::Tensor logits = model->Forward(b.input_tokens, b.attention_mask).logits;
  const auto [reward, distill] = DefinitionTerms(logits, b, ppo);
  // At the logits: ℓ(n) depends on z_n alone, so row n of ∂(Σ_m ℓ(m))/∂z is ∂ℓ(n)/∂z_n.
  const torch::Tensor z = logits.detach().requires_grad_(true);
  const auto [reward_z, distill_z] = DefinitionTerms(z, b, ppo);
  const torch::Tensor g_r = torch::autograd::grad({reward_z.sum()}, {z}, {}, true)[0];
  const torch::Tensor g_d = torch::autograd::grad({distill_z.sum()}, {z})[0];

  const torch::Tensor mask = b.response_mask.to(torch::kCPU, torch::kFloat64);
  std::vector<Reference> out;
  for (int64_t row = 0; row < mask.size(0); ++row) {
    const auto length = static_cast<int64_t>(mask[row].sum().item<double>());
    int64_t index = 0;
    for (int64_t t = 0; t < mask.size(1); ++t) {
      if (mask[row][t].item<double>() == 0) continue;
      Reference r;
      r.b = row;
      r.t = t;
      r.index_in_response = index++;
      r.response_length = length;
      const auto grad_r = torch::autograd::grad({reward[row][t]}, params, {}, true, false, true);
      const auto grad_d = torch::autograd::grad({distill[row][t]}, params, {}, true, false, true);
      for (size_t i = 0; i < params.size(); ++i) {
        if (!grad_r[i].defined() || !grad_d[i].defined()) continue;
        const double dot = (grad_r[i] * grad_d[i]).sum().item<double>();
        r.exact += dot;
        if (i == output) r.last_layer = dot;
      }
      r.logit = (g_r[row][t] * g_d[row][t]).sum().item<double>();
      out.push_back(r);
    }
  }
  return out;
}

int Sign(double x) { return (x > 0) - (x < 0); }

// docs/algorithms.md §3.2's statistics of estimator `e` over `positions`, from
// their definitions.
KdrSummary DefinitionSummary(const std::vector<Reference>& positions, KdrEstimator e) {
  KdrSummary s;
  s.positions = static_cast<int64_t>(positions.size());
  std::vector<double> k;
  double negative = 0, negative_abs = 0, abs = 0;
  std::array<double, KdrSummary::kPositionBuckets> sums{}, counts{};
  for (const Reference& r : positions) {
    const double v = r.Of(e);
    k.push_back(v);
    s.mean += v / static_cast<double>(positions.size());
    abs += std::abs(v);
    if (v < 0) {
      negative += 1;
      negative_abs += -v;
    }
    const auto bucket = static_cast<size_t>(10 * r.index_in_response / r.response_length);
    sums[bucket] += v;
    counts[bucket] += 1;
  }
  s.negative_fraction = negative / static_cast<double>(positions.size());
  s.negative_weighted_fraction = abs > 0 ? negative_abs / abs : 0.0;
  std::sort(k.begin(), k.end());
  for (size_t i = 0; i < s.quantiles.size(); ++i) {
    // Linear interpolation between order statistics (torch.quantile's default).
    const double at = KdrSummary::kQuantileLevels[i] * static_cast<double>(k.size() - 1);
    const auto lo = static_cast<size_t>(std::floor(at));
    const size_t hi = std::min(lo + 1, k.size() - 1);
    s.quantiles[i] = k[lo] + (k[hi] - k[lo]) * (at - static_cast<double>(lo));
  }
  for (size_t i = 0; i < sums.size(); ++i) {
    s.position_mean[i] = counts[i] > 0 ? sums[i] / counts[i] : std::nan("");
  }
  return s;
}

double DefinitionAgreement(const std::vector<Reference>& positions, KdrEstimator cheap) {
  double same = 0;
  for (const Reference& r : positions) same += Sign(r.Of(cheap)) == Sign(r.exact);
  return same / static_cast<double>(positions.size());
}

void ExpectSummaryNear(const KdrSummary& got, const KdrSummary& want, double tolerance,
                       const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.positions, want.positions);
  EXPECT_NEAR(got.mean, want.mean, tolerance);
  EXPECT_DOUBLE_EQ(got.negative_fraction, want.negative_fraction);
  EXPECT_NEAR(got.negative_weighted_fraction, want.negative_weighted_fraction, 1e-9);
  for (size_t i = 0; i < want.quantiles.size(); ++i) {
    EXPECT_NEAR(got.quantiles[i], want.quantiles[i], tolerance) << "quantile " << i;
  }
  for (size_t i = 0; i < want.position_mean.size(); ++i) {
    if (std::isnan(want.position_mean[i])) {
      EXPECT_TRUE(std::isnan(got.position_mean[i])) << "bucket " << i;
    } else {
      EXPECT_NEAR(got.position_mean[i], want.position_mean[i], tolerance) << "bucket " << i;
    }
  }
}

// An on-policy batch has ρ = 1 (no clipping, every g_R(n) ≠ 0); the batch
// as RandomGroups builds it is off policy, with clipped and dual-clipped
// positions where ℓ_R(n) is constant and K(n) = 0.
TrainBatch Float64Batch(bool on_policy) {
  TrainBatch b = BuildTrainBatch(RandomGroups(4, 4, true, 23), true, 0);
  b.teacher_logprobs = b.teacher_logprobs.to(torch::kFloat64);
  b.advantages = b.advantages.to(torch::kFloat64);
  b.response_mask = b.response_mask.to(torch::kFloat64);
  b.old_logprobs = b.old_logprobs.to(torch::kFloat64);
  if (on_policy) {
    torch::NoGradGuard no_grad;
    model::Decoder m = Float64Model();
    const torch::Tensor logits = m->Forward(b.input_tokens, b.attention_mask).logits;
    b.old_logprobs = torch::log_softmax(logits / kTemperature, -1)
                         .gather(-1, b.target_tokens.unsqueeze(-1))
                         .squeeze(-1);
  }
  return b;
}

TEST(KdrMonitorTest, ReportedKdrEqualsPerPositionAutogradOfTheDefinition) {
  struct Case {
    bool on_policy;
    KdrEstimator estimator;
    int64_t exact_positions;  // < the batch's positions: a sample of rows
  };
  for (const Case c :
       {Case{true, KdrEstimator::kLogit, 1000}, Case{true, KdrEstimator::kLastLayer, 9},
        Case{false, KdrEstimator::kLastLayer, 1000}, Case{false, KdrEstimator::kLogit, 9}}) {
    const std::string what = std::string(c.on_policy ? "on policy, " : "off policy, ") +
                             KdrEstimatorName(c.estimator) + ", exact at " +
                             std::to_string(c.exact_positions);
    SCOPED_TRACE(what);
    const TrainBatch batch = Float64Batch(c.on_policy);
    HybridStepConfig config;
    // K_DR is unweighted: none of w_R, λ, the aggregation's 1/|M| enters it.
    config.reward_weight = 0.5;
    config.loss.lambda = 0.3;
    config.loss.temperature = kTemperature;
    config.monitor.kdr_estimator = c.estimator;
    config.monitor.kdr_exact_every = 1;
    config.monitor.kdr_exact_positions = c.exact_positions;
    config.monitor.seed = 5;
    model::Decoder model = Float64Model();
    auto optimizer = std::make_unique<PolicyOptimizer>(model, 1e-3, 0.0, 1.0);
    HybridStep step(model, std::move(optimizer), config);
    const HybridStepReport report = step.Run(batch);

    model::Decoder plain = Float64Model();  // θ before the step's update
    const std::vector<Reference> all = ReferenceKernels(plain, batch, config.loss.ppo);
    ASSERT_EQ(static_cast<double>(all.size()), batch.response_mask.sum().item<double>());
    double scale = 0;
    int zeros = 0;
    for (const Reference& r : all) {
      scale = std::max(scale, std::abs(r.exact));
      zeros += r.exact == 0;
    }
    ASSERT_GT(scale, 0);
    // Off policy some positions are clipped (K = 0 exactly); on policy none.
    if (c.on_policy) {
      EXPECT_EQ(zeros, 0);
    } else {
      EXPECT_GT(zeros, 0);
      EXPECT_LT(zeros, static_cast<int>(all.size()) / 2);
    }

    // The cheap estimator: its statistics and its value at every position.
    ASSERT_TRUE(report.kdr.has_value());
    double cheap_scale = 0;
    for (const Reference& r : all) cheap_scale = std::max(cheap_scale, std::abs(r.Of(c.estimator)));
    ExpectSummaryNear(*report.kdr, DefinitionSummary(all, c.estimator), 1e-6 * cheap_scale, "kdr");
    ASSERT_EQ(report.kdr_values.size(), all.size());
    double worst = 0;  // of the float32 values, relative to the largest |K|
    for (size_t k = 0; k < all.size(); ++k) {
      const double want = all[k].Of(c.estimator);
      worst = std::max(worst, std::abs(report.kdr_values[k] - want) / cheap_scale);
      EXPECT_NEAR(report.kdr_values[k], want, 1e-6 * cheap_scale) << "position " << k;
      EXPECT_NEAR(report.kdr_kernel[all[k].b][all[k].t].item<double>(), want, 1e-6 * cheap_scale)
          << "position " << k;
    }

    // Exact K_DR on the positions the step sampled (all, or monitor.seed's
    // sample at step 1: docs/algorithms.md §3.2's seed × 1000003 + step).
    std::vector<Reference> sampled = all;
    if (c.exact_positions < static_cast<int64_t>(all.size())) {
      const auto picked =
          SampleResponsePositions(batch.response_mask, c.exact_positions, 5 * 1000003ULL + 1);
      sampled.clear();
      for (const Reference& r : all) {
        if (std::count(picked.begin(), picked.end(), std::make_pair(r.b, r.t)) > 0) {
          sampled.push_back(r);
        }
      }
      ASSERT_EQ(sampled.size(), picked.size());
      // Rows left out before a sampled one, so the forward of the sampled
      // rows alone renumbers them.
      std::vector<int64_t> rows;
      for (const Reference& r : sampled) {
        if (rows.empty() || rows.back() != r.b) rows.push_back(r.b);
      }
      EXPECT_GT(rows.back(), static_cast<int64_t>(rows.size()) - 1);
    }
    EXPECT_EQ(report.exact_positions, static_cast<int64_t>(sampled.size()));
    ASSERT_TRUE(report.kdr_exact.has_value());
    // Each sampled position is bucketed by its place in its whole response.
    ExpectSummaryNear(*report.kdr_exact, DefinitionSummary(sampled, KdrEstimator::kExact),
                      1e-6 * scale, "kdr_exact");

    // Sign agreement of the cheap estimators with exact over that sample.
    const double logit = DefinitionAgreement(sampled, KdrEstimator::kLogit);
    const double last_layer = DefinitionAgreement(sampled, KdrEstimator::kLastLayer);
    ASSERT_TRUE(report.agreement_logit.has_value());
    ASSERT_TRUE(report.agreement_last_layer.has_value());
    EXPECT_DOUBLE_EQ(*report.agreement_logit, logit);
    EXPECT_DOUBLE_EQ(*report.agreement_last_layer, last_layer);
    std::printf(
        "[ kdr      ] %s: kdr_values within %.1e of max |K|; sign agreement with exact "
        "over %zu positions: logit %.4f, last_layer %.4f (reported %.4f, %.4f)\n",
        what.c_str(), worst, sampled.size(), logit, last_layer, *report.agreement_logit,
        *report.agreement_last_layer);
    // ‖h_n‖² > 0: the two cheap estimators share their signs. On policy,
    // over every position (no clipped K = 0 agreeing for free), the cheap
    // sign is right at 46 of the 56 (0.82); a sign-flipped estimator would
    // score 0.18, one unrelated to K about 0.5.
    EXPECT_EQ(logit, last_layer);
    if (c.on_policy && sampled.size() == all.size()) EXPECT_GE(*report.agreement_logit, 0.7);
  }
}

// The REQUIRES of KdrMonitor's protocol: Observe only while observing and
// with the part's own forward; Summarize and MeasureExact only once every
// micro-batch was observed, MeasureExact only when due.
TEST(KdrMonitorTest, RefusesCallsOutOfProtocol) {
  const TrainBatch batch = Float64Batch(/*on_policy=*/true);
  const std::vector<MicroBatch> parts = SplitMicroBatches(batch, 2);
  ASSERT_GE(parts.size(), 2u);
  LossConfig loss;
  loss.temperature = kTemperature;
  MonitorConfig monitor;
  monitor.kdr_exact_every = 2;  // due at step 2, not at step 1
  model::Decoder model = Float64Model();
  std::vector<TokenTerms> forwards;
  for (const MicroBatch& part : parts)
    forwards.push_back(ComputeTokenTerms(model, part.batch, loss));
  const std::vector<torch::Tensor> params = model->parameters();
  auto forward = [&](const TrainBatch& rows) { return ComputeTokenTerms(model, rows, loss); };
  HybridStepReport report;

  KdrMonitor idle(monitor, loss, /*step=*/1, /*has_distill=*/false, /*kernels_for_mask=*/false,
                  batch.response_mask);
  ASSERT_FALSE(idle.observing());
  EXPECT_THROW(idle.Observe(parts[0], forwards[0]), std::logic_error);

  KdrMonitor due(monitor, loss, /*step=*/2, /*has_distill=*/true, /*kernels_for_mask=*/false,
                 batch.response_mask);
  ASSERT_TRUE(due.observing());
  ASSERT_TRUE(due.exact_due());
  EXPECT_THROW(due.Observe(parts[0], TokenTerms{}), std::invalid_argument);
  TokenTerms fewer_rows = forwards[0];
  fewer_rows.token_logprobs = fewer_rows.token_logprobs.narrow(0, 0, 1);
  EXPECT_THROW(due.Observe(parts[0], fewer_rows), std::invalid_argument)
      << "not the forward of the part's rows";
  due.Observe(parts[0], forwards[0]);
  EXPECT_THROW(due.Summarize(&report), std::logic_error) << "a micro-batch not observed";
  EXPECT_THROW(due.MeasureExact(batch, params, forward, &report), std::logic_error);
  for (size_t k = 1; k < parts.size(); ++k) due.Observe(parts[k], forwards[k]);
  due.Summarize(&report);
  EXPECT_TRUE(report.kdr.has_value());
  due.MeasureExact(batch, params, forward, &report);
  EXPECT_TRUE(report.kdr_exact.has_value());

  KdrMonitor not_due(monitor, loss, /*step=*/1, /*has_distill=*/true,
                     /*kernels_for_mask=*/false, batch.response_mask);
  ASSERT_FALSE(not_due.exact_due());
  for (size_t k = 0; k < parts.size(); ++k) not_due.Observe(parts[k], forwards[k]);
  EXPECT_THROW(not_due.MeasureExact(batch, params, forward, &report), std::logic_error);
}

}  // namespace
}  // namespace kappa::learner
