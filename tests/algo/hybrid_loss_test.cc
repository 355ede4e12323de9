#include "learner/algo/hybrid_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "learner/algo/losses.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::Grads;
using testing::RandomGroups;
using testing::TinyModel;
using testing::ZeroGrads;

double MaxAbs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

TEST(ComputeLossTermsTest, SeparateBackwardsSumToTheNaiveGradient) {
  model::Decoder model = TinyModel(1);
  const TrainBatch batch = BuildTrainBatch(RandomGroups(2, 3, true, 2), true, 0);
  LossConfig config;
  config.aggregation = Aggregation::kSeqMeanTokenMean;
  const double lambda = 0.7;

  LossTerms terms = ComputeLossTerms(model, batch, config);
  ASSERT_TRUE(terms.distill_loss.requires_grad());
  ZeroGrads(model);
  terms.reward_loss.backward({}, /*retain_graph=*/true);
  (lambda * terms.distill_loss).backward();
  const auto separate = Grads(model);

  ZeroGrads(model);
  LossTerms again = ComputeLossTerms(model, batch, config);
  (again.reward_loss + lambda * again.distill_loss).backward();
  const auto naive = Grads(model);

  double scale = 0;
  for (const auto& g : naive) scale = std::max(scale, MaxAbs(g));
  ASSERT_GT(scale, 0);
  for (size_t i = 0; i < naive.size(); ++i) {
    EXPECT_LE(MaxAbs(separate[i] - naive[i]), 1e-5 * scale) << "parameter " << i;
  }
}

TEST(ComputeLossTermsTest, LossesMatchTheLossFunctionsOnTheLogits) {
  model::Decoder model = TinyModel(3);
  const TrainBatch batch = BuildTrainBatch(RandomGroups(2, 2, true, 4), true, 0);
  for (DistillLoss kind :
       {DistillLoss::kReverseKl, DistillLoss::kForwardKl, DistillLoss::kSampledReverseKl}) {
    LossConfig config;
    config.distill = kind;
    config.temperature = 1.5;
    const LossTerms terms = ComputeLossTerms(model, batch, config);
    const torch::Tensor z = terms.logits.detach() / 1.5;
    ASSERT_EQ(z.sizes(), (torch::IntArrayRef{4, batch.input_tokens.size(1), 16}));
    const torch::Tensor lp = TokenLogProbs(z, batch.target_tokens);
    const torch::Tensor want_r =
        Aggregate(PpoTokenLoss(lp, batch.old_logprobs, batch.advantages, config.ppo),
                  batch.response_mask, config.aggregation);
    torch::Tensor per_token;
    if (kind == DistillLoss::kReverseKl) per_token = ReverseKlTokenLoss(z, batch.teacher_logprobs);
    if (kind == DistillLoss::kForwardKl) per_token = ForwardKlTokenLoss(z, batch.teacher_logprobs);
    if (kind == DistillLoss::kSampledReverseKl) {
      per_token = SampledReverseKlTokenLoss(
          lp, batch.teacher_logprobs.gather(-1, batch.target_tokens.unsqueeze(-1)).squeeze(-1));
    }
    const torch::Tensor want_d = Aggregate(per_token, batch.response_mask, config.aggregation);
    EXPECT_NEAR(terms.reward_loss.item<double>(), want_r.item<double>(), 1e-5);
    EXPECT_NEAR(terms.distill_loss.item<double>(), want_d.item<double>(), 1e-5);
    const double entropy =
        Aggregate(TokenEntropy(z), batch.response_mask, Aggregation::kTokenMean).item<double>();
    EXPECT_NEAR(terms.entropy, entropy, 1e-5);
    EXPECT_GT(terms.entropy, 0);
  }
}

TEST(ComputeLossTermsTest, OnPolicyBatchHasUnitRatio) {
  model::Decoder model = TinyModel(5);
  auto groups = RandomGroups(2, 2, false, 6);
  const TrainBatch probe = BuildTrainBatch(groups, true, 0);
  const torch::Tensor lp = TokenLogProbs(model->Forward(probe.input_tokens, probe.attention_mask).logits,
                                         probe.target_tokens).detach();
  // Write the model's own log-probs back as behaviour log-probs.
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].samples.size(); ++i) {
      auto& s = groups[g].samples[i];
      const int64_t b = g * groups[g].samples.size() + i;
      const int64_t first = static_cast<int64_t>(groups[g].prompt_tokens.size()) - 1;
      for (size_t k = 0; k < s.behavior_logprobs.size(); ++k) {
        s.behavior_logprobs[k] = lp[b][first + k].item<float>();
      }
    }
  }
  const LossTerms terms = ComputeLossTerms(model, BuildTrainBatch(groups, true, 0), LossConfig{});
  EXPECT_NEAR(terms.approx_kl, 0.0, 1e-6);
  EXPECT_EQ(terms.clip_fraction, 0.0);
  EXPECT_FALSE(terms.distill_loss.requires_grad());
  EXPECT_EQ(terms.distill_loss.item<float>(), 0.0f);
}

TEST(ComputeLossTermsTest, OffPolicyBatchReportsClippingAndKl) {
  model::Decoder model = TinyModel(5);
  // Behaviour log-probs of -2.5 against a peaked model: ratios far from 1.
  const LossTerms terms =
      ComputeLossTerms(model, BuildTrainBatch(RandomGroups(2, 2, false, 6), true, 0), LossConfig{});
  EXPECT_GT(terms.approx_kl, 0.0);
  EXPECT_GT(terms.clip_fraction, 0.0);
  EXPECT_LE(terms.clip_fraction, 1.0);
}

TEST(ComputeLossTermsTest, SampledTeacherOnlyFeedsTheSampledEstimator) {
  model::Decoder model = TinyModel(7);
  auto groups = RandomGroups(2, 2, true, 8);
  for (auto& g : groups) {
    for (auto& s : g.samples) s.teacher_logprobs = s.teacher_logprobs.select(1, 3).clone();
  }
  const TrainBatch batch = BuildTrainBatch(groups, true, 0);
  LossConfig config;
  EXPECT_THROW(ComputeLossTerms(model, batch, config), std::invalid_argument);
  config.distill = DistillLoss::kSampledReverseKl;
  const LossTerms terms = ComputeLossTerms(model, batch, config);
  EXPECT_TRUE(terms.distill_loss.requires_grad());
  EXPECT_TRUE(std::isfinite(terms.distill_loss.item<double>()));
}

}  // namespace
}  // namespace kappa::learner
