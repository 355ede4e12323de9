// The full learner step: κ is the ratio of separately computed gradient
// norms, the separate gradients sum to the naive one, and every balancing and
// gating mode runs and reports what it did.
#include "learner/algo/hybrid_step.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "learner/algo/logit_gradients.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::GlobalNorm;
using testing::Grads;
using testing::RandomGroups;
using testing::TinyModel;
using testing::ZeroGrads;

HybridStep MakeStep(model::Decoder model, HybridStepConfig config) {
  // No clipping, so .grad after the step is exactly the combined gradient.
  auto optimizer = std::make_unique<PolicyOptimizer>(model, 1e-6, 0.0, /*max_grad_norm=*/0.0);
  return HybridStep(model, std::move(optimizer), std::move(config));
}

struct StepFixture : ::testing::Test {
  TrainBatch batch = BuildTrainBatch(RandomGroups(3, 4, true, 17), true, 0);
};

TEST_F(StepFixture, KappaIsTheRatioOfSeparateNormsAndTheSumIsTheNaiveGradient) {
  const double lambda = 0.3;
  model::Decoder reference = TinyModel(2);
  LossConfig loss;
  ComputeLossTerms(reference, batch, loss).reward_loss.backward();
  const double reward_norm = GlobalNorm(Grads(reference));
  ZeroGrads(reference);
  ComputeLossTerms(reference, batch, loss).distill_loss.backward();
  const double distill_norm = GlobalNorm(Grads(reference));
  ZeroGrads(reference);
  LossTerms naive = ComputeLossTerms(reference, batch, loss);
  (naive.reward_loss + lambda * naive.distill_loss).backward();
  const std::vector<torch::Tensor> naive_grad = Grads(reference);

  for (const int64_t kappa_every : {1, 0}) {
    model::Decoder model = TinyModel(2);
    HybridStepConfig config;
    config.loss.lambda = lambda;
    config.monitor.kappa_every = kappa_every;
    HybridStep step = MakeStep(model, config);
    const HybridStepReport report = step.Run(batch);
    if (kappa_every == 1) {
      ASSERT_TRUE(report.stats.kappa().has_value());
      EXPECT_NEAR(*report.stats.kappa(), reward_norm / distill_norm,
                  1e-5 * reward_norm / distill_norm);
    } else {
      EXPECT_FALSE(report.stats.kappa().has_value());  // one backward pass, nothing measured
    }
    const std::vector<torch::Tensor> got = Grads(model);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[i], naive_grad[i], 1e-4, 1e-7))
          << "parameter " << i << " kappa_every " << kappa_every;
    }
  }
}

TEST_F(StepFixture, EveryBalanceAndGateRunsWithFiniteStatistics) {
  const std::vector<std::vector<std::string>> balances = {
      {"naive"}, {"m3_norm"}, {"m3_mask"}, {"m3_project"}, {"m3_adapt"},
      {"m3_norm", "m3_project"}, {"m3_mask", "m3_project", "m3_adapt"}};
  for (const auto& names : balances) {
    for (const DistillGate gate : {DistillGate::kNone, DistillGate::kAll, DistillGate::kRstg}) {
      HybridStepConfig config;
      config.balance = ParseBalance(names);
      config.gate = gate;
      config.loss.lambda = 0.05;
      HybridStep step = MakeStep(TinyModel(3), config);
      for (int i = 0; i < 2; ++i) {
        const HybridStepReport r = step.Run(batch);
        EXPECT_TRUE(std::isfinite(r.stats.grad_norm)) << BalanceName(config.balance);
        EXPECT_TRUE(std::isfinite(r.stats.reward_loss));
        if (gate == DistillGate::kNone) {
          EXPECT_EQ(r.stats.distill_loss, 0.0);
          EXPECT_FALSE(r.kdr.has_value());
        }
        if (gate == DistillGate::kAll) {
          ASSERT_TRUE(r.kdr.has_value());
          EXPECT_EQ(r.kdr->positions, batch.response_mask.sum().item<int64_t>());
        }
        if (config.balance.normalize && gate == DistillGate::kAll) {
          EXPECT_NEAR(r.stats.balanced_reward_grad_norm /
                          (r.stats.distill_scale * r.stats.distill_grad_norm),
                      1.0, 1e-6);
        }
      }
    }
  }
}

TEST_F(StepFixture, MaskDropsTheRewardTermExactlyWhereTheLogitKernelIsNegative) {
  model::Decoder model = TinyModel(4);
  model::Decoder reference = model::CloneDecoder(model);
  HybridStepConfig config;
  config.balance = ParseBalance({"m3_mask"});
  config.loss.lambda = 0.0;  // .grad = ∇ of the masked L_R alone
  HybridStep step = MakeStep(model, config);
  const HybridStepReport report = step.Run(batch);

  // Independent: negative K_DR positions from the closed forms, then the
  // reward loss with those positions zeroed by hand.
  const TrainBatch b = batch;
  TokenTerms tokens = ComputeTokenTerms(reference, b, config.loss);
  torch::Tensor kernel;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor lp = tokens.logprobs.detach();
    const torch::Tensor c = RewardLogProbCoefficient(tokens.token_logprobs.detach(),
                                                     b.old_logprobs, b.advantages, config.loss.ppo);
    kernel = LogitCrossKernel(RewardLogitGradient(lp, b.target_tokens, c, 1.0),
                              DistillLogitGradient(lp, b.teacher(), b.target_tokens,
                                                   DistillLoss::kReverseKl, 1.0)) *
             b.response_mask;
  }
  const torch::Tensor conflicting = (kernel < 0) & (b.response_mask > 0);
  EXPECT_EQ(report.masked_positions, conflicting.sum().item<int64_t>());
  EXPECT_GT(report.masked_positions, 0);
  const torch::Tensor keep = (~conflicting).to(torch::kFloat32);
  Aggregate(tokens.reward * keep, b.response_mask, Aggregation::kTokenMean).backward();
  const auto want = Grads(reference);
  const auto got = Grads(model);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-7)) << "parameter " << i;
  }
}

TEST_F(StepFixture, RstgTrainsOnDemonstrationsAndExactKdrAgreesInSign) {
  std::vector<ScoredGroup> groups = RandomGroups(3, 4, true, 17);
  for (ScoredSample& s : groups[1].samples) s.reward = 0;  // negative zero-variance
  groups[1].teacher_demonstrations = {{5, 6, 2}, {7, 2}};
  const TrainBatch rstg_batch = BuildTrainBatch(groups, true, 0);
  ASSERT_EQ(rstg_batch.num_demonstrations, 2);

  HybridStepConfig config;
  config.gate = DistillGate::kRstg;
  config.sft_weight = 0.1;
  config.monitor.kdr_exact_every = 1;
  config.monitor.kdr_exact_positions = 8;
  HybridStep step = MakeStep(TinyModel(6), config);
  const HybridStepReport r = step.Run(rstg_batch);
  EXPECT_EQ(r.gated_groups, 1);
  EXPECT_EQ(r.demonstrations, 2);
  EXPECT_GT(r.stats.sft_loss, 0.0);
  EXPECT_GT(r.distill_positions, 0);
  EXPECT_EQ(r.exact_positions, 8);
  ASSERT_TRUE(r.agreement_logit.has_value());
  EXPECT_GE(*r.agreement_logit, 0.0);
  EXPECT_LE(*r.agreement_logit, 1.0);
  EXPECT_EQ(*r.agreement_logit, *r.agreement_last_layer);  // ‖h‖² > 0: same signs
}

}  // namespace
}  // namespace kappa::learner
