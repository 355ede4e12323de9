// trainer.truncated end to end in the learner: the flag as a worker sends it
// (ScoredSample.truncated) is decoded, the configured policy builds the
// batch, and the losses and advantages change exactly as specified — keep
// leaves them as without the flag, mask drops the response from the loss
// but not from its group's reward statistics, zero_reward zeroes its reward
// before the advantages.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "learner/algo/hybrid_loss.h"
#include "learner/algo/losses.h"
#include "learner/algo/train_batch.h"
#include "learner/group_decoder.h"
#include "learner/step_config.h"
#include "services/tensor_codec.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

constexpr int kGroupSize = 4;

// One group as a worker sends it: sample 1 (reward 1) and sample 3
// (reward 0) hit their budget.
kappa::v1::ScoredGroup WireGroup(int variant) {
  kappa::v1::ScoredGroup group;
  group.set_lease_id("lease-" + std::to_string(variant));
  for (int token : {1, 4 + variant, 9}) group.add_prompt_tokens(token);
  for (int i = 0; i < kGroupSize; ++i) {
    kappa::v1::ScoredSample* sample = group.add_samples();
    const int length = 2 + (i + variant) % 3;
    std::vector<float> logprobs;
    for (int k = 0; k < length; ++k) {
      sample->add_response_tokens(3 + (5 * i + 3 * k + variant) % 13);
      logprobs.push_back(-1.5f - 0.1f * static_cast<float>(k));
    }
    services::SetFloat32(sample->mutable_behavior_logprobs(), {length}, logprobs.data());
    sample->set_reward(i < 2 ? 1.0f : 0.0f);
    sample->set_truncated(i == 1 || i == 3);
  }
  return group;
}

std::vector<ScoredGroup> Decoded() {
  GroupExpectations expect;
  expect.group_size = kGroupSize;
  expect.vocab_size = testing::TinyConfig().vocab_size;
  expect.max_new_tokens = 8;
  std::vector<ScoredGroup> groups;
  for (int variant : {0, 1}) {
    absl::StatusOr<ScoredGroup> group = DecodeScoredGroup(WireGroup(variant), expect);
    EXPECT_TRUE(group.ok()) << group.status();
    groups.push_back(*group);
  }
  return groups;
}

// The policy a run configuration with trainer.truncated=`value` trains with.
TruncatedResponses PolicyFor(const std::string& value) {
  services::Config config;
  config.trainer.truncated = *services::ChoiceNamed<services::TruncatedResponses>(value);
  absl::StatusOr<HybridStepConfig> step = MakeHybridStepConfig(config);
  EXPECT_TRUE(step.ok()) << step.status();
  return step->truncated;
}

TEST(TruncatedResponses, KeepMaskAndZeroRewardChangeTheStepAsSpecified) {
  const std::vector<ScoredGroup> groups = Decoded();
  ASSERT_TRUE(groups[0].samples[1].truncated);
  ASSERT_FALSE(groups[0].samples[0].truncated);

  std::vector<ScoredGroup> unflagged = groups;
  for (ScoredGroup& g : unflagged) {
    for (ScoredSample& s : g.samples) s.truncated = false;
  }
  const TrainBatch plain = BuildTrainBatch(unflagged, true, 0);
  const TrainBatch keep = BuildTrainBatch(groups, true, 0, PolicyFor("keep"));
  const TrainBatch mask = BuildTrainBatch(groups, true, 0, PolicyFor("mask"));
  const TrainBatch zero = BuildTrainBatch(groups, true, 0, PolicyFor("zero_reward"));
  for (const TrainBatch* b : {&keep, &mask, &zero}) EXPECT_EQ(b->num_truncated, 4);
  EXPECT_EQ(plain.num_truncated, 0);

  // keep: the batch of the same groups without the flag.
  for (const auto& [a, b] :
       {std::pair{keep.response_mask, plain.response_mask},
        std::pair{keep.advantages, plain.advantages}, std::pair{keep.rewards, plain.rewards}}) {
    EXPECT_TRUE(torch::equal(a, b));
  }

  // mask: the truncated rows (1, 3, 5, 7) count nowhere; every other row and
  // every advantage is as under keep (their rewards still set the mean/std).
  const torch::Tensor truncated_rows = torch::tensor({1, 3, 5, 7}, torch::kInt64);
  const torch::Tensor kept_rows = torch::tensor({0, 2, 4, 6}, torch::kInt64);
  EXPECT_EQ(mask.response_mask.index_select(0, truncated_rows).sum().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(mask.response_mask.index_select(0, kept_rows),
                           keep.response_mask.index_select(0, kept_rows)));
  EXPECT_TRUE(torch::equal(mask.advantages, keep.advantages));
  EXPECT_TRUE(torch::equal(mask.rewards, keep.rewards));

  // zero_reward: sample 1's reward 1 -> 0 before the advantages; the mask stays.
  EXPECT_EQ(zero.rewards[0][1].item<float>(), 0.0f);
  EXPECT_EQ(zero.rewards[0][0].item<float>(), 1.0f);
  EXPECT_TRUE(torch::equal(zero.response_mask, keep.response_mask));
  const torch::Tensor zeroed_adv = GrpoAdvantages(zero.rewards, true);
  EXPECT_FALSE(torch::allclose(zeroed_adv, GrpoAdvantages(keep.rewards, true)));
  // Group advantages land on every response position of their row.
  const torch::Tensor row1 = zero.advantages[1].masked_select(zero.response_mask[1] > 0);
  EXPECT_TRUE(torch::allclose(row1, zeroed_adv[0][1].expand_as(row1)));

  // The losses: keep equals the unflagged step to the bit; mask equals the
  // token mean of keep's own per-position terms over the untruncated rows.
  model::Decoder model = testing::TinyModel(3);
  const LossConfig config;
  const LossTerms plain_terms = ComputeLossTerms(model, plain, config);
  const LossTerms keep_terms = ComputeLossTerms(model, keep, config);
  EXPECT_EQ(keep_terms.reward_loss.item<double>(), plain_terms.reward_loss.item<double>());
  const TokenTerms tokens = ComputeTokenTerms(model, keep, config);
  torch::Tensor untruncated = keep.response_mask.clone();
  untruncated.index_fill_(0, truncated_rows, 0.0f);
  const double expected = (tokens.reward.detach() * untruncated).sum().item<double>() /
                          untruncated.sum().item<double>();
  const LossTerms mask_terms = ComputeLossTerms(model, mask, config);
  EXPECT_NEAR(mask_terms.reward_loss.item<double>(), expected, 1e-6);
  EXPECT_EQ(mask_terms.reward_count.item<double>(), untruncated.sum().item<double>());
  EXPECT_GT(std::abs(mask_terms.reward_loss.item<double>() - keep_terms.reward_loss.item<double>()),
            1e-6);
  const LossTerms zero_terms = ComputeLossTerms(model, zero, config);
  EXPECT_GT(std::abs(zero_terms.reward_loss.item<double>() - keep_terms.reward_loss.item<double>()),
            1e-6);
}

TEST(TruncatedResponses, EveryResponseMaskedGivesAZeroStepNotANaN) {
  std::vector<ScoredGroup> groups = Decoded();
  for (ScoredGroup& g : groups) {
    for (ScoredSample& s : g.samples) s.truncated = true;
  }
  const TrainBatch batch = BuildTrainBatch(groups, true, 0, TruncatedResponses::kMask);
  model::Decoder model = testing::TinyModel(3);
  const LossTerms terms = ComputeLossTerms(model, batch, LossConfig{});
  EXPECT_EQ(terms.reward_loss.item<double>(), 0.0);
  EXPECT_EQ(terms.reward_count.item<double>(), 0.0);
}

TEST(TruncatedResponses, ABadValueIsRefusedNamingTheKey) {
  const absl::StatusOr<services::Config> config =
      services::ParseConfig("", "run.yaml", {"trainer.truncated=drop"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(config.status().message());
  EXPECT_NE(message.find("trainer.truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("zero_reward"), std::string::npos) << message;
  EXPECT_EQ(services::Config().trainer.truncated,
            services::TruncatedResponses::kKeep);  // verl's default
}

}  // namespace
}  // namespace kappa::learner
