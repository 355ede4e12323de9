#include "learner/algo/optimizer_step.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::GlobalNorm;
using testing::Grads;
using testing::RandomGroups;
using testing::TinyModel;
using testing::ZeroGrads;

double MaxParamDiff(model::Decoder& a, model::Decoder& b) {
  const auto pa = a->parameters();
  const auto pb = b->parameters();
  double diff = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    diff = std::max(diff, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return diff;
}

// Each trainable parameter, then its AdamW exp_avg, exp_avg_sq and step, cloned.
std::vector<torch::Tensor> Snapshot(PolicyOptimizer& optimizer) {
  std::vector<torch::Tensor> all;
  for (const torch::Tensor& p : optimizer.parameters()) {
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(
        *optimizer.optimizer().state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
    all.insert(all.end(), {p.detach().clone(), state.exp_avg().clone(), state.exp_avg_sq().clone(),
                           torch::tensor(state.step())});
  }
  return all;
}

bool BitwiseEqual(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() && x.dtype() == y.dtype() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

struct Fixture : ::testing::Test {
  TrainBatch batch = BuildTrainBatch(RandomGroups(2, 3, true, 11), true, 0);
  LossConfig config;
};

TEST_F(Fixture, StepEqualsNaiveAdamWStepAndMeasuresBothGradients) {
  const double lambda = 0.5, lr = 1e-2, wd = 0.1, clip = 0.05;
  model::Decoder model = TinyModel(9);
  model::Decoder reference = model::CloneDecoder(model);

  // Reference gradients: each loss alone, then the naive sum.
  ComputeLossTerms(reference, batch, config).reward_loss.backward();
  const double reward_norm = GlobalNorm(Grads(reference));
  ZeroGrads(reference);
  ComputeLossTerms(reference, batch, config).distill_loss.backward();
  const auto distill_grads = Grads(reference);
  ZeroGrads(reference);
  LossTerms ref_terms = ComputeLossTerms(reference, batch, config);
  (ref_terms.reward_loss + lambda * ref_terms.distill_loss).backward();
  const double naive_norm = GlobalNorm(Grads(reference));
  torch::nn::utils::clip_grad_norm_(reference->parameters(), clip);
  torch::optim::AdamW ref_opt(reference->parameters(),
                              torch::optim::AdamWOptions(lr).weight_decay(wd));
  ref_opt.step();

  PolicyOptimizer optimizer(model, lr, wd, clip);
  const LossTerms terms = ComputeLossTerms(model, batch, config);
  const StepStats stats = optimizer.Step(terms, lambda);

  ASSERT_GT(naive_norm, clip);  // so the clip is exercised
  EXPECT_NEAR(stats.grad_norm, naive_norm, 1e-5 * naive_norm);
  EXPECT_NEAR(stats.reward_grad_norm, reward_norm, 1e-5 * reward_norm);
  EXPECT_NEAR(stats.distill_grad_norm, GlobalNorm(distill_grads), 1e-5 * GlobalNorm(distill_grads));
  EXPECT_GE(stats.grad_cosine, -1.0);
  EXPECT_LE(stats.grad_cosine, 1.0);
  // ‖g_R + λ g_D‖² = ‖g_R‖² + λ²‖g_D‖² + 2λ cos ‖g_R‖‖g_D‖
  const double r = stats.reward_grad_norm, d = stats.distill_grad_norm;
  EXPECT_NEAR(stats.grad_norm * stats.grad_norm,
              r * r + lambda * lambda * d * d + 2 * lambda * stats.grad_cosine * r * d,
              1e-4 * stats.grad_norm * stats.grad_norm);
  EXPECT_NEAR(stats.reward_loss, ref_terms.reward_loss.item<double>(), 1e-6);
  EXPECT_NEAR(stats.distill_loss, ref_terms.distill_loss.item<double>(), 1e-6);
  EXPECT_EQ(stats.lr, lr);
  // .grad still holds the clipped gradient the step used.
  const auto got = Grads(model);
  const auto want = Grads(reference);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), 1e-5 * clip) << "parameter " << i;
  }
  // Adam's first step is about lr·sign(g), so float noise in near-zero
  // gradient entries moves parameters by a small fraction of lr.
  EXPECT_LT(MaxParamDiff(model, reference), 1e-2 * lr);
}

TEST_F(Fixture, WarmupRampsTheLearningRate) {
  model::Decoder model = TinyModel(9);
  PolicyOptimizer optimizer(model, 1e-3, 0.0, 1.0, /*warmup_steps=*/4);
  std::vector<double> lrs;
  for (int i = 0; i < 5; ++i) {
    lrs.push_back(optimizer.Step(ComputeLossTerms(model, batch, config), 1.0).lr);
  }
  EXPECT_DOUBLE_EQ(lrs[0], 0.25e-3);
  EXPECT_DOUBLE_EQ(lrs[1], 0.5e-3);
  EXPECT_DOUBLE_EQ(lrs[3], 1e-3);
  EXPECT_DOUBLE_EQ(lrs[4], 1e-3);
  EXPECT_EQ(optimizer.step(), 5);
}

TEST_F(Fixture, StepWithoutTeacherUsesTheRewardGradientOnly) {
  const TrainBatch plain = BuildTrainBatch(RandomGroups(2, 3, false, 11), true, 0);
  model::Decoder model = TinyModel(9);
  PolicyOptimizer optimizer(model, 1e-3, 0.0, 0.0);
  const StepStats stats = optimizer.Step(ComputeLossTerms(model, plain, config), 1.0);
  EXPECT_GT(stats.reward_grad_norm, 0.0);
  EXPECT_EQ(stats.distill_grad_norm, 0.0);
  EXPECT_NEAR(stats.grad_norm, stats.reward_grad_norm, 1e-6 * stats.grad_norm);
}

// A gradient hook writes NaN into one parameter's gradient: the step is
// skipped, and the parameters, the AdamW moments and the step counter stay
// bitwise as they were, measured (one backward per signal) or plain. The
// next finite step is applied as usual.
TEST_F(Fixture, ANonFiniteGradientSkipsTheStepAndChangesNothing) {
  for (const bool separate : {true, false}) {
    SCOPED_TRACE(separate ? "measured step" : "plain step");
    model::Decoder model = TinyModel(9);
    PolicyOptimizer optimizer(model, 1e-2, 0.1, 1.0);
    optimizer.Step(ComputeLossTerms(model, batch, config), 0.5);  // the moments exist
    const std::vector<torch::Tensor> before = Snapshot(optimizer);
    bool poison = true;
    optimizer.parameters()[1].register_hook([&poison](const torch::Tensor& grad) {
      return poison ? torch::full_like(grad, std::numeric_limits<float>::quiet_NaN()) : grad;
    });
    GradientPlan plan;
    plan.distill_weight = 0.5;
    const StepStats skipped =
        optimizer.Step(ComputeLossTerms(model, batch, config), plan, separate);
    EXPECT_TRUE(skipped.skipped());
    EXPECT_EQ(skipped.nonfinite_term, "grad_norm");
    EXPECT_TRUE(std::isnan(skipped.grad_norm));
    EXPECT_EQ(optimizer.step(), 1);
    const std::vector<torch::Tensor> after = Snapshot(optimizer);
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(after[i], before[i]))
          << "parameter " << i / 4 << ", tensor " << i % 4 << " (value, m, v, step)";
    }

    poison = false;
    const StepStats next = optimizer.Step(ComputeLossTerms(model, batch, config), plan, separate);
    EXPECT_FALSE(next.skipped());
    EXPECT_EQ(optimizer.step(), 2);
    EXPECT_FALSE(BitwiseEqual(optimizer.parameters()[1], before[4]));
    EXPECT_TRUE(torch::isfinite(optimizer.parameters()[1]).all().item<bool>());
  }
}

// A NaN or ±inf loss term is named, in the order reward, distill, SFT.
TEST_F(Fixture, ANonFiniteLossTermIsNamed) {
  model::Decoder model = TinyModel(9);
  PolicyOptimizer optimizer(model, 1e-2, 0.0, 1.0);
  LossTerms terms = ComputeLossTerms(model, batch, config);
  terms.distill_loss = terms.distill_loss * std::numeric_limits<double>::infinity();
  EXPECT_EQ(optimizer.Step(terms, 1.0).nonfinite_term, "distill_loss");
  terms = ComputeLossTerms(model, batch, config);
  terms.reward_loss = terms.reward_loss * std::numeric_limits<double>::quiet_NaN();
  terms.distill_loss = terms.distill_loss * std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(optimizer.Step(terms, 1.0).nonfinite_term, "reward_loss");
  EXPECT_EQ(optimizer.step(), 0);
  EXPECT_EQ(optimizer.Step(ComputeLossTerms(model, batch, config), 1.0).nonfinite_term, "");
  EXPECT_EQ(optimizer.step(), 1);
}

TEST_F(Fixture, SaveAndLoadResumeIdentically) {
  model::Decoder a = TinyModel(9);
  PolicyOptimizer opt_a(a, 1e-2, 0.01, 1.0, 3);
  opt_a.Step(ComputeLossTerms(a, batch, config), 1.0);
  const std::string path = ::testing::TempDir() + "/opt_" + std::to_string(::getpid()) + ".pt";
  opt_a.Save(path);

  model::Decoder b = model::CloneDecoder(a);
  PolicyOptimizer opt_b(b, 1e-2, 0.01, 1.0, 3);
  opt_b.Load(path);
  EXPECT_EQ(opt_b.step(), 1);
  const StepStats sa = opt_a.Step(ComputeLossTerms(a, batch, config), 1.0);
  const StepStats sb = opt_b.Step(ComputeLossTerms(b, batch, config), 1.0);
  EXPECT_EQ(sa.lr, sb.lr);
  EXPECT_LT(MaxParamDiff(a, b), 1e-7);

  // A fresh optimizer (no moments) takes a different step.
  model::Decoder c = model::CloneDecoder(a);
  PolicyOptimizer opt_c(c, 1e-2, 0.01, 1.0, 3);
  opt_c.Step(ComputeLossTerms(c, batch, config), 1.0);
  opt_a.Step(ComputeLossTerms(a, batch, config), 1.0);
  EXPECT_GT(MaxParamDiff(a, c), 1e-6);

  std::remove(path.c_str());
  EXPECT_THROW(opt_b.Load(path), std::runtime_error);
}

}  // namespace
}  // namespace kappa::learner
