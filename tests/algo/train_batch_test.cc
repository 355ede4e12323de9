#include "learner/algo/train_batch.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace kappa::learner {
namespace {

constexpr int64_t kPad = 0;

ScoredSample Sample(std::vector<int64_t> tokens, float reward) {
  ScoredSample s;
  s.behavior_logprobs.resize(tokens.size());
  for (size_t k = 0; k < tokens.size(); ++k) s.behavior_logprobs[k] = -0.1f * (k + 1);
  s.response_tokens = std::move(tokens);
  s.reward = reward;
  return s;
}

// Two groups of G = 2: prompts of 3 and 2 tokens, responses of 2..4 tokens.
std::vector<ScoredGroup> HandBuilt() {
  ScoredGroup a;
  a.prompt_tokens = {1, 5, 6};
  a.samples = {Sample({7, 2}, 1.0f), Sample({8, 9, 2}, 0.0f)};
  ScoredGroup b;
  b.prompt_tokens = {1, 4};
  b.samples = {Sample({3, 2}, 0.0f), Sample({3, 3, 3, 2}, 0.0f)};
  return {a, b};
}

std::vector<int64_t> Longs(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous().to(torch::kInt64);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::vector<float> Floats(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous().to(torch::kFloat32);
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

TEST(BuildTrainBatchTest, AlignsTargetsMasksAndAdvantages) {
  const TrainBatch batch = BuildTrainBatch(HandBuilt(), /*norm_std=*/true, kPad);
  EXPECT_EQ(batch.num_groups, 2);
  EXPECT_EQ(batch.group_size, 2);
  // Longest sequence: 2 + 4 = 6 tokens -> 5 positions.
  ASSERT_EQ(batch.input_tokens.sizes(), (torch::IntArrayRef{4, 5}));
  EXPECT_FALSE(batch.teacher_logprobs.defined());

  using V = std::vector<int64_t>;
  using F = std::vector<float>;
  EXPECT_EQ(Longs(batch.input_tokens[0]), (V{1, 5, 6, 7, kPad}));
  EXPECT_EQ(Longs(batch.target_tokens[0]), (V{5, 6, 7, 2, kPad}));
  EXPECT_EQ(Longs(batch.input_tokens[1]), (V{1, 5, 6, 8, 9}));
  EXPECT_EQ(Longs(batch.target_tokens[1]), (V{5, 6, 8, 9, 2}));
  EXPECT_EQ(Longs(batch.input_tokens[3]), (V{1, 4, 3, 3, 3}));
  EXPECT_EQ(Longs(batch.target_tokens[3]), (V{4, 3, 3, 3, 2}));
  EXPECT_EQ(Longs(batch.attention_mask[0]), (V{1, 1, 1, 1, 0}));
  EXPECT_EQ(Longs(batch.attention_mask[2]), (V{1, 1, 1, 0, 0}));

  // The response starts being predicted at position prompt_len - 1.
  EXPECT_EQ(Floats(batch.response_mask[0]), (F{0, 0, 1, 1, 0}));
  EXPECT_EQ(Floats(batch.response_mask[1]), (F{0, 0, 1, 1, 1}));
  EXPECT_EQ(Floats(batch.response_mask[2]), (F{0, 1, 1, 0, 0}));
  EXPECT_EQ(Floats(batch.response_mask[3]), (F{0, 1, 1, 1, 1}));
  EXPECT_EQ(Floats(batch.old_logprobs[1]), (F{0, 0, -0.1f, -0.2f, -0.3f}));
  EXPECT_EQ(Floats(batch.old_logprobs[2]), (F{0, -0.1f, -0.2f, 0, 0}));

  const float a = 0.5f / (0.5f + 1e-6f);
  const std::vector<float> adv0 = Floats(batch.advantages[0]);
  const std::vector<float> adv1 = Floats(batch.advantages[1]);
  EXPECT_NEAR(adv0[2], a, 1e-6);
  EXPECT_NEAR(adv0[3], a, 1e-6);
  EXPECT_EQ(adv0[0], 0.0f);
  EXPECT_EQ(adv0[4], 0.0f);
  EXPECT_NEAR(adv1[4], -a, 1e-6);
  EXPECT_EQ(batch.advantages[2].abs().sum().item<float>(), 0.0f);  // all-zero group
  EXPECT_EQ(Floats(batch.rewards), (F{1, 0, 0, 0}));

  const TrainBatch centered = BuildTrainBatch(HandBuilt(), /*norm_std=*/false, kPad);
  EXPECT_NEAR(centered.advantages[0][2].item<float>(), 0.5f, 1e-7);
}

TEST(BuildTrainBatchTest, PlacesFullAndSampledTeacherLogProbs) {
  std::vector<ScoredGroup> groups = HandBuilt();
  const int64_t vocab = 11;
  for (auto& g : groups) {
    for (auto& s : g.samples) {
      const int64_t len = static_cast<int64_t>(s.response_tokens.size());
      s.teacher_logprobs = -torch::arange(1, len * vocab + 1, torch::kFloat32).reshape({len, vocab});
    }
  }
  const TrainBatch full = BuildTrainBatch(groups, true, kPad);
  ASSERT_EQ(full.teacher_logprobs.sizes(), (torch::IntArrayRef{4, 5, vocab}));
  // Sample 1 (prompt 3, response 3): teacher rows 0..2 sit at positions 2..4.
  EXPECT_TRUE(full.teacher_logprobs[1].narrow(0, 2, 3).equal(groups[0].samples[1].teacher_logprobs));
  EXPECT_EQ(full.teacher_logprobs[1].narrow(0, 0, 2).abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(full.teacher_logprobs[3].narrow(0, 1, 4).equal(groups[1].samples[1].teacher_logprobs));

  for (auto& g : groups) {
    for (auto& s : g.samples) s.teacher_logprobs = s.teacher_logprobs.select(1, 0).clone();
  }
  const TrainBatch sampled = BuildTrainBatch(groups, true, kPad);
  ASSERT_EQ(sampled.teacher_logprobs.sizes(), (torch::IntArrayRef{4, 5}));
  EXPECT_EQ(Floats(sampled.teacher_logprobs[0]), (std::vector<float>{0, 0, -1, -12, 0}));
}

void ExpectInvalid(const std::vector<ScoredGroup>& groups, const std::string& fragment) {
  try {
    BuildTrainBatch(groups, true, kPad);
    FAIL() << "expected std::invalid_argument mentioning '" << fragment << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(BuildTrainBatchTest, RejectsInconsistentInput) {
  ExpectInvalid({}, "no groups");
  {
    auto g = HandBuilt();
    g[1].samples.pop_back();
    ExpectInvalid(g, "group size");
  }
  {
    auto g = HandBuilt();
    g[0].samples[1].behavior_logprobs.pop_back();
    ExpectInvalid(g, "behavior_logprobs");
  }
  {
    auto g = HandBuilt();
    g[1].samples[0].response_tokens.clear();
    g[1].samples[0].behavior_logprobs.clear();
    ExpectInvalid(g, "empty response");
  }
  {
    auto g = HandBuilt();
    g[0].prompt_tokens.clear();
    ExpectInvalid(g, "empty prompt");
  }
  {
    auto g = HandBuilt();
    for (auto& grp : g) {
      for (auto& s : grp.samples) s.teacher_logprobs = torch::zeros({(long)s.response_tokens.size(), 5});
    }
    g[1].samples[1].teacher_logprobs = torch::zeros({3, 5});  // response has 4 tokens
    ExpectInvalid(g, "does not match");
    g[1].samples[1].teacher_logprobs = torch::zeros({4, 6});
    ExpectInvalid(g, "vocabulary");
    g[1].samples[1].teacher_logprobs = torch::Tensor();
    ExpectInvalid(g, "all samples or for none");
    g[1].samples[1].teacher_logprobs = torch::full({4, 5}, std::numeric_limits<float>::infinity());
    ExpectInvalid(g, "non-finite");
  }
}

}  // namespace
}  // namespace kappa::learner
