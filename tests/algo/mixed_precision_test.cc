// bf16 autocast of the learner's forward: the matmuls run in bfloat16 inside
// the guard only, the step's losses and κ stay close to the fp32 step's,
// and parameters, gradients and optimizer state stay float32.
#include "learner/algo/mixed_precision.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "learner/algo/hybrid_step.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::RandomGroups;

TEST(AutocastGuard, MatmulsRunInBf16InsideTheGuardOnly) {
  const torch::Tensor a = torch::randn({4, 8}), b = torch::randn({8, 3});
  {
    AutocastGuard guard(torch::kCPU, Precision::kBFloat16);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    {
      AutocastGuard nested(torch::kCPU, Precision::kBFloat16);
      EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    }
    // Leaving the nested guard keeps the outer one in force.
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
  {
    AutocastGuard fp32(torch::kCPU, Precision::kFloat32);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
  }
}

TEST(AutocastGuard, ParsesPrecisionNames) {
  EXPECT_EQ(ParsePrecision("bf16"), Precision::kBFloat16);
  EXPECT_EQ(ParsePrecision("fp32"), Precision::kFloat32);
  EXPECT_STREQ(PrecisionName(Precision::kBFloat16), "bf16");
  try {
    ParsePrecision("fp16");
    FAIL() << "fp16 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown precision 'fp16' (fp32 | bf16)");
  }
}

TEST(MixedPrecisionStep, Bf16StepMatchesTheFp32StepAndKeepsFp32State) {
  const TrainBatch batch = BuildTrainBatch(RandomGroups(3, 4, true, 17), true, 0);
  HybridStepReport reports[2];
  torch::Tensor grads[2];  // the step's combined gradient, flattened
  torch::Tensor before, after[2];
  for (int i = 0; i < 2; ++i) {
    // The default initialisation: TinyModel's scaled-up weights give logits
    // near 50, where bf16 steps by 0.25 and swamps the small reward gradient.
    torch::manual_seed(2);
    model::Decoder model(testing::TinyConfig());
    if (i == 0) before = torch::nn::utils::parameters_to_vector(model->parameters()).detach().clone();
    HybridStepConfig config;
    config.loss.lambda = 0.5;
    config.precision = i == 0 ? Precision::kFloat32 : Precision::kBFloat16;
    auto optimizer = std::make_unique<PolicyOptimizer>(model, 1e-3, 0.0, /*max_grad_norm=*/0.0);
    HybridStep step(model, std::move(optimizer), config);
    reports[i] = step.Run(batch);
    std::vector<torch::Tensor> g;
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.scalar_type(), torch::kFloat32);
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
      g.push_back(p.grad().flatten());
    }
    grads[i] = torch::cat(g);
    after[i] = torch::nn::utils::parameters_to_vector(model->parameters()).detach().clone();
  }
  const StepStats& fp32 = reports[0].stats;
  const StepStats& bf16 = reports[1].stats;
  // The bf16 step did run in bf16 (not bit-identical)...
  EXPECT_NE(bf16.distill_loss, fp32.distill_loss);
  // ... and bf16 keeps 8 bits of mantissa: a few per cent on this tiny model.
  EXPECT_NEAR(bf16.reward_loss, fp32.reward_loss, 0.05 * std::abs(fp32.reward_loss) + 1e-3);
  EXPECT_NEAR(bf16.distill_loss, fp32.distill_loss, 0.05 * fp32.distill_loss);
  ASSERT_TRUE(bf16.kappa().has_value() && fp32.kappa().has_value());
  EXPECT_NEAR(*bf16.kappa(), *fp32.kappa(), 0.1 * *fp32.kappa());
  EXPECT_NEAR(bf16.grad_cosine, fp32.grad_cosine, 0.1);
  EXPECT_NEAR(reports[1].entropy, reports[0].entropy, 0.05 * reports[0].entropy);
  // The same direction of descent, and both steps moved the weights.
  EXPECT_GT(torch::cosine_similarity(grads[0], grads[1], 0).item<double>(), 0.98);
  EXPECT_GT((after[0] - before).abs().max().item<float>(), 0.0f);
  EXPECT_GT((after[1] - before).abs().max().item<float>(), 0.0f);
}

}  // namespace
}  // namespace kappa::learner
