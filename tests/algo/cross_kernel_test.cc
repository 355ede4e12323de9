// K_DR estimators against independent computations, in float64.
#include "learner/algo/cross_kernel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>

#include "learner/algo/hybrid_loss.h"
#include "learner/algo/logit_gradients.h"
#include "learner/algo/logprob_losses.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::RandomGroups;
using testing::TinyModel;

// A float64 model and an on-policy batch (old log-probs = current ones, so
// ρ = 1 and the closed-form g_R = −Â(e_y − p) holds exactly).
struct Float64Fixture : ::testing::Test {
  void SetUp() override {
    model = TinyModel(5);
    model->to(torch::kFloat64);
    batch = BuildTrainBatch(RandomGroups(2, 3, true, 21), true, 0);
    batch.teacher_logprobs = batch.teacher_logprobs.to(torch::kFloat64);
    batch.advantages = batch.advantages.to(torch::kFloat64);
    batch.response_mask = batch.response_mask.to(torch::kFloat64);
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = model->Forward(batch.input_tokens, batch.attention_mask).logits;
    batch.old_logprobs = TokenLogProbs(logits, batch.target_tokens);
  }

  std::vector<torch::Tensor> Trainable() {
    std::vector<torch::Tensor> out;
    for (auto& p : model->parameters()) {
      if (p.requires_grad()) out.push_back(p);
    }
    return out;
  }

  // g_Rᵀ J Jᵀ g_D with J = ∂z_n/∂θ built row by row (V backward passes).
  double BruteForceKernel(int64_t b, int64_t t, const torch::Tensor& g_r, const torch::Tensor& g_d) {
    const torch::Tensor logits = model->Forward(batch.input_tokens, batch.attention_mask).logits;
    const auto params = Trainable();
    std::vector<torch::Tensor> rows;
    for (int64_t v = 0; v < logits.size(2); ++v) {
      auto grads = torch::autograd::grad({logits[b][t][v]}, params, {}, true, false, true);
      std::vector<torch::Tensor> flat;
      for (size_t i = 0; i < params.size(); ++i) {
        flat.push_back(grads[i].defined() ? grads[i].reshape(-1) : torch::zeros({params[i].numel()}, torch::kFloat64));
      }
      rows.push_back(torch::cat(flat));
    }
    const torch::Tensor jacobian = torch::stack(rows);  // [V, P]
    const torch::Tensor ntk = jacobian.matmul(jacobian.t());
    return g_r[b][t].dot(ntk.matmul(g_d[b][t])).item<double>();
  }

  // Closed-form g_R, g_D at every position of `tokens`.
  std::pair<torch::Tensor, torch::Tensor> ClosedFormGradients(const TokenTerms& tokens) {
    torch::NoGradGuard no_grad;
    const torch::Tensor lp = tokens.logprobs.detach();
    const torch::Tensor coefficient = RewardLogProbCoefficient(
        tokens.token_logprobs.detach(), batch.old_logprobs, batch.advantages, config.ppo);
    return {RewardLogitGradient(lp, batch.target_tokens, coefficient, 1.0),
            DistillLogitGradient(lp, batch.teacher(), batch.target_tokens, DistillLoss::kReverseKl,
                                 1.0)};
  }

  model::Decoder model{nullptr};
  TrainBatch batch;
  LossConfig config;
};

TEST_F(Float64Fixture, ExactEqualsBruteForceInnerProductOfJacobians) {
  const TokenTerms tokens = ComputeTokenTerms(model, batch, config);
  const auto positions = SampleResponsePositions(batch.response_mask, 6, 3);
  ASSERT_EQ(positions.size(), 6u);
  const std::vector<double> exact =
      ExactCrossKernel(Trainable(), tokens.reward, tokens.distill, positions);

  const auto [g_r, g_d] = ClosedFormGradients(tokens);
  int nonzero = 0;
  for (size_t k = 0; k < positions.size(); ++k) {
    torch::AutoGradMode grad_on(true);
    const double brute = BruteForceKernel(positions[k].first, positions[k].second, g_r, g_d);
    EXPECT_NEAR(exact[k], brute, 1e-6 * std::max(1.0, std::abs(brute))) << "position " << k;
    nonzero += std::abs(brute) > 1e-8;
  }
  EXPECT_GT(nonzero, 2);  // not a vacuous 0 == 0
}

TEST_F(Float64Fixture, LastLayerEqualsExactWhenOnlyTheOutputLayerTrains) {
  for (auto& p : model->parameters()) p.requires_grad_(false);
  model->lm_head()->weight.requires_grad_(true);
  const TokenTerms tokens = ComputeTokenTerms(model, batch, config);
  const auto positions = SampleResponsePositions(batch.response_mask, 10, 9);
  const std::vector<double> exact =
      ExactCrossKernel(Trainable(), tokens.reward, tokens.distill, positions);

  const auto [g_r, g_d] = ClosedFormGradients(tokens);
  torch::NoGradGuard no_grad;
  const torch::Tensor logit = LogitCrossKernel(g_r, g_d);
  const std::vector<double> last_layer =
      ValuesAt(LastLayerCrossKernel(logit, tokens.hidden.detach()), positions);
  for (size_t k = 0; k < positions.size(); ++k) {
    EXPECT_NEAR(last_layer[k], exact[k], 1e-6 * std::max(1e-3, std::abs(exact[k])))
        << "position " << k;
  }
  EXPECT_DOUBLE_EQ(SignAgreement(ValuesAt(logit, positions), exact), 1.0);
}

// ∂ℓ(n)/∂z_n by autograd, [B, T, V]: ℓ(n) depends on z_n alone, so the
// gradient of Σ_n ℓ(n) at z_n is the per-position gradient.
torch::Tensor AutogradLogitGradient(const torch::Tensor& logits,
                                    const std::function<torch::Tensor(const torch::Tensor&)>& loss) {
  torch::Tensor z = logits.detach().requires_grad_(true);
  return torch::autograd::grad({loss(z).sum()}, {z})[0];
}

TEST(LogitGradients, ClosedFormsEqualAutograd) {
  torch::manual_seed(3);
  const int64_t B = 3, T = 4, V = 7;
  const torch::Tensor logits = 2 * torch::randn({B, T, V}, torch::kFloat64);
  const torch::Tensor teacher = torch::log_softmax(2 * torch::randn({B, T, V}, torch::kFloat64), -1);
  const torch::Tensor targets = torch::randint(0, V, {B, T});
  const torch::Tensor adv = torch::randn({B, T}, torch::kFloat64);
  PpoConfig ppo;
  // The teacher's top 3 ids, compact (TeacherRows in the top-k form).
  const torch::Tensor topk_ids = std::get<1>(teacher.topk(3, -1));
  const torch::Tensor topk_logq = teacher.gather(-1, topk_ids);
  for (const double temperature : {1.0, 0.7}) {
    auto logprobs_of = [&](const torch::Tensor& z) { return torch::log_softmax(z / temperature, -1); };
    const torch::Tensor lp = logprobs_of(logits);
    // Off-policy: old log-probs shifted so some ratios leave the clip range.
    const torch::Tensor old = GatherTokenLogProbs(lp, targets) + 0.4 * torch::randn({B, T}, torch::kFloat64);
    const torch::Tensor want_r = AutogradLogitGradient(logits, [&](const torch::Tensor& z) {
      return PpoTokenLoss(GatherTokenLogProbs(logprobs_of(z), targets), old, adv, ppo);
    });
    const torch::Tensor coefficient =
        RewardLogProbCoefficient(GatherTokenLogProbs(lp, targets), old, adv, ppo);
    EXPECT_TRUE(torch::allclose(RewardLogitGradient(lp, targets, coefficient, temperature), want_r,
                                1e-9, 1e-12)) << "g_R at temperature " << temperature;
    // Some positions are clipped (coefficient 0) and some are not.
    EXPECT_GT((coefficient == 0).sum().item<int64_t>(), 0);
    EXPECT_GT((coefficient != 0).sum().item<int64_t>(), 0);

    struct Case { DistillLoss kind; std::function<torch::Tensor(const torch::Tensor&)> loss; };
    const std::vector<Case> cases = {
        {DistillLoss::kReverseKl,
         [&](const torch::Tensor& z) { return ReverseKlTokenLoss(z / temperature, teacher); }},
        {DistillLoss::kForwardKl,
         [&](const torch::Tensor& z) { return ForwardKlTokenLoss(z / temperature, teacher); }},
        {DistillLoss::kSampledReverseKl,
         [&](const torch::Tensor& z) {
           return SampledReverseKlTokenLoss(GatherTokenLogProbs(logprobs_of(z), targets),
                                            GatherTokenLogProbs(teacher, targets));
         }},
        {DistillLoss::kTopkReverseKl,
         [&](const torch::Tensor& z) {
           return TopkReverseKl(logprobs_of(z).gather(-1, topk_ids), topk_logq);
         }},
        {DistillLoss::kTopkTailReverseKl,
         [&](const torch::Tensor& z) {
           return TopkTailReverseKl(logprobs_of(z).gather(-1, topk_ids), topk_logq);
         }},
    };
    for (const Case& c : cases) {
      const torch::Tensor want = AutogradLogitGradient(logits, c.loss);
      const TeacherRows rows =
          IsTopkLoss(c.kind) ? TeacherRows{topk_logq, topk_ids} : TeacherRows{teacher, {}};
      const torch::Tensor got = DistillLogitGradient(lp, rows, targets, c.kind, temperature);
      EXPECT_TRUE(torch::allclose(got, want, 1e-9, 1e-12))
          << "g_D kind " << static_cast<int>(c.kind) << " temperature " << temperature
          << " max diff " << (got - want).abs().max().item<double>();
    }
  }
}

TEST(KdrSummary, StatisticsOfAConstructedKernel) {
  // Two rows; row 0 has 4 response positions, row 1 has 2.
  const torch::Tensor mask = torch::tensor({{0., 1., 1., 1., 1.}, {0., 0., 1., 1., 0.}});
  const torch::Tensor kernel = torch::tensor({{9., -1., 2., -3., 4.}, {7., 7., 5., -5., 9.}});
  const KdrSummary s = SummarizeKdr(kernel, mask);
  EXPECT_EQ(s.positions, 6);
  EXPECT_DOUBLE_EQ(s.negative_fraction, 3.0 / 6.0);
  EXPECT_DOUBLE_EQ(s.negative_weighted_fraction, (1. + 3. + 5.) / (1. + 2. + 3. + 4. + 5. + 5.));
  EXPECT_DOUBLE_EQ(s.mean, (-1. + 2. - 3. + 4. + 5. - 5.) / 6.);
  EXPECT_DOUBLE_EQ(s.quantiles[2], 0.5);  // median of {-5,-3,-1,2,4,5}
  // Row 0: relative places 0, .25, .5, .75 → buckets 0, 2, 5, 7; row 1: 0, .5 → 0, 5.
  EXPECT_DOUBLE_EQ(s.position_mean[0], (-1. + 5.) / 2.);
  EXPECT_DOUBLE_EQ(s.position_mean[2], 2.);
  EXPECT_DOUBLE_EQ(s.position_mean[5], (-3. - 5.) / 2.);
  EXPECT_DOUBLE_EQ(s.position_mean[7], 4.);
  EXPECT_TRUE(std::isnan(s.position_mean[1]));
}

TEST(KdrSummary, SamplingIsDistinctDeterministicAndInsideTheMask) {
  const torch::Tensor mask = torch::tensor({{0., 1., 1., 0.}, {1., 0., 1., 1.}});
  const auto a = SampleResponsePositions(mask, 3, 42);
  EXPECT_EQ(a, SampleResponsePositions(mask, 3, 42));
  ASSERT_EQ(a.size(), 3u);
  for (const auto& [b, t] : a) EXPECT_EQ(mask[b][t].item<double>(), 1.0);
  EXPECT_EQ(SampleResponsePositions(mask, 100, 1).size(), 5u);
  EXPECT_DOUBLE_EQ(SignAgreement({1, -2, 0, 3}, {2, -1, 0, -3}), 0.75);
}

}  // namespace
}  // namespace kappa::learner
