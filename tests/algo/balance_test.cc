// M3 guarantees (docs/algorithms.md §4) on constructed gradients.
#include "learner/algo/balance.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace kappa::learner {
namespace {

GradientList RandomList(uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({3, 4}, torch::kFloat64), torch::randn({5}, torch::kFloat64),
          torch::Tensor(), torch::randn({2, 2}, torch::kFloat64)};
}

GradientList Clone(const GradientList& a) {
  GradientList out;
  for (const auto& t : a) out.push_back(t.defined() ? t.clone() : t);
  return out;
}

double Dot(const GradientList& a, const GradientList& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() && b[i].defined()) s += (a[i] * b[i]).sum().item<double>();
  }
  return s;
}

double Norm(const GradientList& a) { return std::sqrt(Dot(a, a)); }

GradientList Scaled(const GradientList& a, double s) {
  GradientList out;
  for (const auto& t : a) out.push_back(t.defined() ? t * s : t);
  return out;
}

const torch::Device kCpu(torch::kCPU);

// g_R′ alone: λ = 0 and no normalization leave total = g_R′.
GradientList ProjectedReward(const GradientList& reward, const GradientList& distill) {
  GradientPlan plan;
  plan.balance.project = true;
  plan.distill_weight = 0.0;
  return CombineGradients(Clone(reward), Clone(distill), GradientList(reward.size()), plan, kCpu)
      .total;
}

TEST(M3Project, RemovesTheConflictingComponent) {
  const GradientList distill = RandomList(1);
  // g_R = −2 g_D + noise: strongly conflicting.
  GradientList reward = Scaled(distill, -2.0);
  const GradientList noise = RandomList(2);
  for (size_t i = 0; i < reward.size(); ++i) {
    if (reward[i].defined()) reward[i] += 0.3 * noise[i];
  }
  ASSERT_LT(Dot(reward, distill), 0);
  const GradientList projected = ProjectedReward(reward, distill);
  EXPECT_GE(Dot(projected, distill), -1e-12 * Norm(reward) * Norm(distill));
  EXPECT_NEAR(Dot(projected, distill), 0.0, 1e-10);
  // Only the g_D component changed.
  const double coefficient = Dot(reward, distill) / Dot(distill, distill);
  for (size_t i = 0; i < reward.size(); ++i) {
    if (!reward[i].defined()) continue;
    EXPECT_TRUE(torch::allclose(projected[i], reward[i] - coefficient * distill[i]));
  }
}

TEST(M3Project, IsTheIdentityWithoutConflict) {
  const GradientList distill = RandomList(3);
  GradientList reward = Scaled(distill, 0.5);
  const GradientList noise = RandomList(4);
  for (size_t i = 0; i < reward.size(); ++i) {
    if (reward[i].defined()) reward[i] += 0.1 * noise[i];
  }
  ASSERT_GT(Dot(reward, distill), 0);
  const GradientList projected = ProjectedReward(reward, distill);
  for (size_t i = 0; i < reward.size(); ++i) {
    if (reward[i].defined()) {
      EXPECT_TRUE(torch::equal(projected[i], reward[i]));
    }
  }
}

// m3_norm holds κ_eff = ‖g_R′‖ / ‖s g_D‖ at κ_target / λ: λ = 1 gives
// κ_target, and a λ below 1 keeps the distillation that much weaker relative
// to the reward than at λ = 1 (issue 39: m3_norm used to ignore λ).
TEST(M3Norm, PostNormalizationRatioIsKappaTargetOverLambda) {
  for (const double kappa_target : {1.0, 0.25, 4.0}) {
    for (const double lambda : {1.0, 0.03, 123.0}) {
      for (const bool project : {false, true}) {
        const GradientList reward = Scaled(RandomList(5), 300.0);  // κ ≫ 1 before
        const GradientList distill = RandomList(6);
        GradientPlan plan;
        plan.balance.normalize = true;
        plan.balance.project = project;
        plan.balance.kappa_target = kappa_target;
        plan.distill_weight = lambda;
        const CombinedGradient c = CombineGradients(Clone(reward), Clone(distill),
                                                    GradientList(reward.size()), plan, kCpu);
        const double s = c.distill_scale.item<double>();
        const GradientList g_r = project ? ProjectedReward(reward, distill) : reward;
        const double want = kappa_target / lambda;
        EXPECT_NEAR(Norm(g_r) / (s * Norm(distill)), want, 1e-9 * want)
            << "κ_target " << kappa_target << " λ " << lambda;
        // total = g_R′ + s g_D
        for (size_t i = 0; i < reward.size(); ++i) {
          if (!reward[i].defined()) continue;
          EXPECT_TRUE(torch::allclose(c.total[i], g_r[i] + s * distill[i]));
        }
      }
    }
  }
}

TEST(M3Naive, CombinationIsTheWeightedSum) {
  const GradientList reward = RandomList(7), distill = RandomList(8), sft = RandomList(9);
  GradientPlan plan;
  plan.reward_weight = 0.5;
  plan.distill_weight = 2.0;
  plan.sft_weight = 0.1;
  const CombinedGradient c = CombineGradients(Clone(reward), Clone(distill), Clone(sft), plan, kCpu);
  for (size_t i = 0; i < reward.size(); ++i) {
    if (!reward[i].defined()) continue;
    EXPECT_TRUE(torch::allclose(c.total[i], 0.5 * reward[i] + 2.0 * distill[i] + 0.1 * sft[i]));
  }
  EXPECT_NEAR(c.reward_sq.item<double>(), 0.25 * Dot(reward, reward), 1e-9);
  EXPECT_NEAR(c.dot.item<double>(), 0.5 * Dot(reward, distill), 1e-9);
}

TEST(M3Mask, ZeroesExactlyTheConflictingPositions) {
  const torch::Tensor kernel = torch::tensor({{-1.0, 0.0, 2.0}, {-1e-9, 3.0, -5.0}});
  const torch::Tensor hard = ConflictMaskWeights(kernel, 0.0);
  EXPECT_TRUE(torch::equal(hard, torch::tensor({{0.0, 1.0, 1.0}, {0.0, 1.0, 0.0}})));
  const torch::Tensor soft = ConflictMaskWeights(kernel, 2.0);
  EXPECT_NEAR(soft[0][0].item<double>(), 1.0 / (1.0 + std::exp(0.5)), 1e-6);
  EXPECT_NEAR(soft[1][2].item<double>(), 1.0 / (1.0 + std::exp(2.5)), 1e-6);
  EXPECT_EQ(soft[0][2].item<double>(), 1.0);
}

TEST(M3Adapt, LambdaStaysWithinItsBoundsAndMovesTowardTheTarget) {
  LambdaControllerConfig config;
  config.lambda_min = 0.01;
  config.lambda_max = 50.0;
  config.max_factor = 1.2;
  LambdaController controller(1.0, 1.0, config);
  double previous = controller.lambda();
  // Reward gradient 1000× the distillation one: λ must rise, at most ×1.2 a step.
  for (int i = 0; i < 200; ++i) {
    controller.Update(1000.0, 1.0);
    EXPECT_LE(controller.lambda(), previous * 1.2 + 1e-12);
    EXPECT_GE(controller.lambda(), previous);
    EXPECT_LE(controller.lambda(), 50.0);
    previous = controller.lambda();
  }
  EXPECT_DOUBLE_EQ(controller.lambda(), 50.0);
  for (int i = 0; i < 500; ++i) {
    controller.Update(1e-6, 1.0);
    EXPECT_GE(controller.lambda(), 0.01);
    EXPECT_GE(controller.lambda(), previous / 1.2 - 1e-12);
    previous = controller.lambda();
  }
  EXPECT_DOUBLE_EQ(controller.lambda(), 0.01);
  // Balanced: κ_eff = ‖g_R‖/(λ‖g_D‖) = 1 at λ = 3 settles there.
  LambdaController settle(0.5, 1.0, LambdaControllerConfig{});
  for (int i = 0; i < 400; ++i) settle.Update(3.0, 1.0);
  EXPECT_NEAR(settle.lambda(), 3.0, 0.05);
}

TEST(BalanceParse, NamesAndCombinations) {
  EXPECT_EQ(BalanceName(ParseBalance({"naive"})), "naive");
  const BalanceConfig both = ParseBalance({"m3_norm", "m3_project"});
  EXPECT_TRUE(both.normalize && both.project && !both.mask && !both.adapt);
  EXPECT_EQ(BalanceName(both), "m3_norm+m3_project");
  EXPECT_THROW(ParseBalance({"m3_nrom"}), std::invalid_argument);
  EXPECT_THROW(ParseBalance({"naive", "m3_mask"}), std::invalid_argument);
  EXPECT_THROW(ParseBalance({"m3_norm", "m3_adapt"}), std::invalid_argument);
  EXPECT_THROW(ParseBalance({"m3_mask", "m3_mask"}), std::invalid_argument);
}

TEST(Float64Sums, ChunkedDotsEqualTheWholeFloat64Products) {
  // 2.5 chunks of 2^20, so the chunk edges and the short last chunk count.
  torch::manual_seed(3);
  const torch::Tensor a = torch::randn({5, (int64_t{1} << 19) + 7});
  const torch::Tensor b = torch::randn({5, (int64_t{1} << 19) + 7});
  const double aa = a.to(torch::kFloat64).square().sum().item<double>();
  const double bb = b.to(torch::kFloat64).square().sum().item<double>();
  const double ab = (a.to(torch::kFloat64) * b.to(torch::kFloat64)).sum().item<double>();
  EXPECT_NEAR(DotInFloat64(a, a).item<double>(), aa, 1e-12 * aa);
  EXPECT_NEAR(DotInFloat64(a, b).item<double>(), ab, 1e-9 * std::sqrt(aa * bb));
  const torch::Tensor gram = GramInFloat64(a, b);
  ASSERT_EQ(gram.scalar_type(), torch::kFloat64);
  EXPECT_NEAR(gram[0].item<double>(), aa, 1e-12 * aa);
  EXPECT_NEAR(gram[1].item<double>(), bb, 1e-12 * bb);
  EXPECT_NEAR(gram[2].item<double>(), ab, 1e-9 * std::sqrt(aa * bb));
  EXPECT_THROW(DotInFloat64(a, b.narrow(0, 0, 4)), std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner
