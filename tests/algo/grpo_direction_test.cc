// GRPO alone, end to end through BuildTrainBatch and HybridStep, on a
// one-token bandit: the reward is 1 for token 7 and 0 for any other. Each
// step samples 8 groups of 8 with the current model and trains on them
// once (on-policy). The share of token 7 must rise from about 1/16 to most
// of the samples: the update's direction, which docs/results.md's testbed
// probes (every objective degrading at lr 3e-4) put in question.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <vector>

#include "learner/algo/hybrid_step.h"
#include "learner/algo/optimizer_step.h"
#include "learner/algo/train_batch.h"
#include "model/sampling.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

constexpr int64_t kRewardedToken = 7;

// Samples `groups` groups of `group_size` one-token responses to `prompt`.
std::vector<ScoredGroup> SampleBandit(model::Decoder& model, const std::vector<int64_t>& prompt,
                                      int64_t groups, int64_t group_size, uint64_t seed) {
  model::SamplingParams params;
  params.max_new_tokens = 1;
  const std::vector<std::vector<int64_t>> prompts(groups * group_size, prompt);
  const std::vector<model::SampledSequence> sampled =
      model::Sample(model, prompts, params, model::MakeGenerator(torch::kCPU, seed));
  std::vector<ScoredGroup> out(groups);
  for (int64_t g = 0; g < groups; ++g) {
    out[g].prompt_tokens = prompt;
    for (int64_t i = 0; i < group_size; ++i) {
      const model::SampledSequence& row = sampled[g * group_size + i];
      ScoredSample sample;
      sample.response_tokens = row.tokens;
      sample.behavior_logprobs = row.logprobs;
      sample.reward = row.tokens.front() == kRewardedToken ? 1.0f : 0.0f;
      sample.truncated = row.truncated;
      out[g].samples.push_back(std::move(sample));
    }
  }
  return out;
}

double MeanReward(const std::vector<ScoredGroup>& groups) {
  double sum = 0;
  int64_t n = 0;
  for (const ScoredGroup& group : groups) {
    for (const ScoredSample& sample : group.samples) {
      sum += sample.reward;
      ++n;
    }
  }
  return sum / static_cast<double>(n);
}

TEST(GrpoDirectionTest, OnPolicyStepsRaiseTheRewardOfABandit) {
  torch::manual_seed(3);
  model::Decoder model(testing::TinyConfig());  // the N(0, 0.02) init: near uniform
  auto optimizer = std::make_unique<PolicyOptimizer>(model, 3e-3, 0.0, /*max_grad_norm=*/1.0);
  HybridStepConfig config;
  config.gate = DistillGate::kNone;  // GRPO alone: no teacher rows
  HybridStep step(model, std::move(optimizer), config);
  const std::vector<int64_t> prompt = {1, 3, 4};

  const double before = MeanReward(SampleBandit(model, prompt, 32, 8, 1000));
  for (int s = 0; s < 40; ++s) {
    step.Run(BuildTrainBatch(SampleBandit(model, prompt, 8, 8, s), /*norm_std=*/true, 0));
  }
  const double after = MeanReward(SampleBandit(model, prompt, 32, 8, 2000));
  EXPECT_LT(before, 0.2);
  EXPECT_GT(after, 0.8) << "reward " << before << " -> " << after;
  std::cout << "bandit reward " << before << " -> " << after << "\n";
}

}  // namespace
}  // namespace kappa::learner
