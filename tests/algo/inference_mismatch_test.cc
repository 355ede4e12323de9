// The training–inference mismatch (docs/algorithms.md §6.1) on real samples:
// responses drawn with model::Sample (fp32, CPU, τ = 0.7) from a random
// decoder, turned into a TrainBatch as the learner does, and one HybridStep.
// On-policy the learner's recomputed log-probs equal the sampler's to float
// rounding; a learner whose weights differ from the sampler's (a broken
// weight sync) shows a large mismatch and trips the inference_mismatch
// alarm after its window; stale groups do not enter.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "learner/algo/alarms.h"
#include "learner/algo/hybrid_step.h"
#include "model/sampling.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::TinyModel;

constexpr double kTemperature = 0.7;
constexpr int64_t kGroupSize = 4;
constexpr uint64_t kModelSeed = 21;

const std::vector<std::vector<int64_t>>& Prompts() {
  static const std::vector<std::vector<int64_t>> prompts = {{1, 3, 4}, {1, 5}, {2, 7, 8, 9}};
  return prompts;
}

// What a rollout worker sends: G samples of each prompt from `policy` at
// τ = 0.7 with their behaviour log-probs, as groups sampled with `version`;
// optionally with full teacher rows (the fused reverse-KL path).
std::vector<ScoredGroup> SampleGroups(model::Decoder& policy, int64_t version, uint64_t seed,
                                      bool with_teacher) {
  std::vector<std::vector<int64_t>> rows;
  for (const auto& prompt : Prompts()) {
    for (int64_t i = 0; i < kGroupSize; ++i) rows.push_back(prompt);
  }
  model::SamplingParams params;
  params.max_new_tokens = 8;
  params.temperature = kTemperature;
  params.stop_token_ids = {2};
  const std::vector<model::SampledSequence> sampled =
      model::Sample(policy, rows, params, model::MakeGenerator(torch::kCPU, seed));
  torch::manual_seed(seed);
  std::vector<ScoredGroup> groups(Prompts().size());
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].prompt_tokens = Prompts()[g];
    groups[g].policy_version = version;
    for (int64_t i = 0; i < kGroupSize; ++i) {
      const model::SampledSequence& s = sampled[g * kGroupSize + i];
      ScoredSample sample;
      sample.response_tokens = s.tokens;
      sample.behavior_logprobs = s.logprobs;
      sample.truncated = s.truncated;
      sample.reward = static_cast<float>((g + i) % 2);
      if (with_teacher) {
        const int64_t len = static_cast<int64_t>(s.tokens.size());
        sample.teacher_logprobs = torch::log_softmax(2 * torch::randn({len, 16}), -1);
      }
      groups[g].samples.push_back(std::move(sample));
    }
  }
  return groups;
}

int64_t ResponseTokens(const std::vector<ScoredGroup>& groups) {
  int64_t n = 0;
  for (const ScoredGroup& g : groups) {
    for (const ScoredSample& s : g.samples) n += static_cast<int64_t>(s.response_tokens.size());
  }
  return n;
}

HybridStepConfig StepConfig() {
  HybridStepConfig config;
  config.loss.temperature = kTemperature;  // rollout.temperature, as step_config.cc sets it
  return config;
}

std::unique_ptr<HybridStep> MakeStep(model::Decoder model, HybridStepConfig config) {
  auto optimizer = std::make_unique<PolicyOptimizer>(model, 1e-6, 0.0, 1.0);
  return std::make_unique<HybridStep>(model, std::move(optimizer), std::move(config));
}

// The learner's copy of the policy, as a broken weight sync leaves it
// relative to the worker's: every matrix off by `scale`.
model::Decoder Perturbed(double scale) {
  model::Decoder model = TinyModel(kModelSeed);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    if (p.dim() == 2) p.mul_(scale);
  }
  return model;
}

struct Variant {
  const char* name;
  bool with_teacher;
  int64_t micro_batch_sequences;
  int64_t vocab_chunk_positions;
};

class OnPolicyMismatch : public ::testing::TestWithParam<Variant> {};

TEST_P(OnPolicyMismatch, IsFloatRoundingOnTheLearnersOwnLogProbs) {
  const Variant v = GetParam();
  model::Decoder worker = TinyModel(kModelSeed);
  const std::vector<ScoredGroup> groups = SampleGroups(worker, 0, 5, v.with_teacher);
  const TrainBatch batch = BuildTrainBatch(groups, true, 0);
  HybridStepConfig config = StepConfig();
  config.micro_batch_sequences = v.micro_batch_sequences;
  config.loss.vocab_chunk_positions = v.vocab_chunk_positions;
  // The learner holds the same weights in its own copy.
  std::unique_ptr<HybridStep> step = MakeStep(TinyModel(kModelSeed), config);
  const HybridStepReport report =
      step->Run(batch, OnPolicyRows({0, 0, 0}, kGroupSize, /*current_version=*/0));

  EXPECT_EQ(report.mismatch_tokens, ResponseTokens(groups));
  ASSERT_TRUE(report.mismatch_abs_mean.has_value());
  ASSERT_TRUE(report.mismatch_k3.has_value());
  EXPECT_LT(*report.mismatch_abs_mean, 1e-3);
  EXPECT_LT(std::abs(*report.mismatch_k3), 1e-6);
  std::printf("[%s] on-policy mismatch_abs_mean %.3g mismatch_k3 %.3g over %lld tokens\n", v.name,
              *report.mismatch_abs_mean, *report.mismatch_k3,
              static_cast<long long>(report.mismatch_tokens));
}

INSTANTIATE_TEST_SUITE_P(
    Paths, OnPolicyMismatch,
    ::testing::Values(Variant{"unfused", false, 0, 0}, Variant{"fused_reverse_kl", true, 0, 0},
                      Variant{"micro_batches", true, 5, 0}, Variant{"chunked_head", true, 0, 4}),
    [](const ::testing::TestParamInfo<Variant>& info) { return std::string(info.param.name); });

TEST(InferenceMismatch, BrokenWeightSyncIsLargeAndAlarms) {
  model::Decoder worker = TinyModel(kModelSeed);
  const std::vector<ScoredGroup> groups = SampleGroups(worker, 0, 5, true);
  const TrainBatch batch = BuildTrainBatch(groups, true, 0);
  const torch::Tensor on_policy = OnPolicyRows({0, 0, 0}, kGroupSize, 0);

  // Every matrix 5 % off: far above float rounding, below the default
  // threshold.
  const HybridStepReport mild = MakeStep(Perturbed(1.05), StepConfig())->Run(batch, on_policy);
  ASSERT_TRUE(mild.mismatch_abs_mean.has_value());
  std::printf("weights x1.05: mismatch_abs_mean %.4g mismatch_k3 %.4g\n", *mild.mismatch_abs_mean,
              *mild.mismatch_k3);
  EXPECT_GT(*mild.mismatch_abs_mean, 0.01);
  EXPECT_GT(*mild.mismatch_k3, 1e-3);

  // 20 % off: above alarms.mismatch_threshold [0.1] on every step; the
  // alarm fires once its window (3 steps) is full, and once.
  std::unique_ptr<HybridStep> step = MakeStep(Perturbed(1.2), StepConfig());
  AlarmConfig alarm_config;
  AlarmMonitor alarms(alarm_config);
  for (int64_t s = 1; s <= alarm_config.mismatch_window + 1; ++s) {
    const HybridStepReport report = step->Run(batch, on_policy);
    ASSERT_TRUE(report.mismatch_abs_mean.has_value());
    if (s == 1) {
      std::printf("weights x1.2: mismatch_abs_mean %.4g mismatch_k3 %.4g\n",
                  *report.mismatch_abs_mean, *report.mismatch_k3);
    }
    EXPECT_GT(*report.mismatch_abs_mean, alarm_config.mismatch_threshold);
    EXPECT_GT(*report.mismatch_k3, 0.01);
    StepObservation o;
    o.step = s;
    o.reward_mean = 0.5;
    o.entropy = 1.0;
    o.inference_mismatch = report.mismatch_abs_mean;
    const std::vector<AlarmEvent> events = alarms.Observe(o);
    if (s < alarm_config.mismatch_window) {
      EXPECT_TRUE(events.empty()) << "step " << s;
      EXPECT_FALSE(alarms.active(AlarmKind::kInferenceMismatch));
    } else if (s == alarm_config.mismatch_window) {
      ASSERT_EQ(events.size(), 1u);
      EXPECT_EQ(events[0].kind, AlarmKind::kInferenceMismatch);
      EXPECT_EQ(events[0].step, s);
    } else {
      EXPECT_TRUE(events.empty()) << "fires once";
    }
  }
  EXPECT_TRUE(alarms.active(AlarmKind::kInferenceMismatch));
  EXPECT_EQ(alarms.fired(AlarmKind::kInferenceMismatch), 1);
}

TEST(InferenceMismatch, OnPolicyStepsNeverAlarm) {
  model::Decoder worker = TinyModel(kModelSeed);
  const TrainBatch batch = BuildTrainBatch(SampleGroups(worker, 0, 9, true), true, 0);
  const HybridStepReport report =
      MakeStep(TinyModel(kModelSeed), StepConfig())->Run(batch, OnPolicyRows({0, 0, 0}, 4, 0));
  AlarmMonitor alarms{AlarmConfig{}};
  for (int64_t s = 1; s <= 30; ++s) {
    StepObservation o;
    o.step = s;
    o.reward_mean = 0.5;
    o.entropy = 1.0;
    o.inference_mismatch = report.mismatch_abs_mean;
    EXPECT_TRUE(alarms.Observe(o).empty());
  }
}

TEST(InferenceMismatch, StaleGroupsAreLeftOut) {
  // Groups 0 and 1 sampled with the current version 3; group 2 with version
  // 2, whose weights differed (here: by 5%) from the learner's now.
  model::Decoder current = TinyModel(kModelSeed);
  model::Decoder previous = Perturbed(1.05);
  std::vector<ScoredGroup> groups = SampleGroups(current, 3, 5, true);
  const std::vector<ScoredGroup> old = SampleGroups(previous, 2, 6, true);
  groups[2] = old[2];
  const int64_t on_policy_tokens = ResponseTokens({groups[0], groups[1]});
  const TrainBatch batch = BuildTrainBatch(groups, true, 0);
  std::vector<int64_t> versions;
  for (const ScoredGroup& g : groups) versions.push_back(g.policy_version);

  const HybridStepReport report = MakeStep(TinyModel(kModelSeed), StepConfig())
                                      ->Run(batch, OnPolicyRows(versions, kGroupSize, 3));
  EXPECT_EQ(report.mismatch_tokens, on_policy_tokens);
  ASSERT_TRUE(report.mismatch_abs_mean.has_value());
  EXPECT_LT(*report.mismatch_abs_mean, 1e-3);
  EXPECT_LT(std::abs(*report.mismatch_k3), 1e-6);

  // Counted in, the stale group would dominate: what the exclusion avoids.
  const HybridStepReport all = MakeStep(TinyModel(kModelSeed), StepConfig())->Run(batch);
  EXPECT_EQ(all.mismatch_tokens, ResponseTokens(groups));
  EXPECT_GT(*all.mismatch_abs_mean, 0.01);

  // No group on-policy: nothing measured, no value.
  const HybridStepReport none = MakeStep(TinyModel(kModelSeed), StepConfig())
                                    ->Run(batch, OnPolicyRows(versions, kGroupSize, 4));
  EXPECT_EQ(none.mismatch_tokens, 0);
  EXPECT_FALSE(none.mismatch_abs_mean.has_value());
  EXPECT_FALSE(none.mismatch_k3.has_value());
  EXPECT_THROW(MakeStep(TinyModel(kModelSeed), StepConfig())
                   ->Run(batch, OnPolicyRows(versions, kGroupSize - 1, 3)),
               std::invalid_argument);
}

TEST(InferenceMismatch, OnPolicyRowsFollowTheGroupVersions) {
  const torch::Tensor rows = OnPolicyRows({5, 4, 5}, 2, 5);
  EXPECT_TRUE(torch::equal(rows, torch::tensor({1.f, 1.f, 0.f, 0.f, 1.f, 1.f})));
  // Σ|d|, Σ k3 and the count over the mask only; k3 = e^d − 1 − d.
  const torch::Tensor learner = torch::tensor({{-1.0f, -2.0f, 0.0f}});
  const torch::Tensor behaviour = torch::tensor({{-1.5f, -2.0f, 7.0f}});
  const torch::Tensor mask = torch::tensor({{1.0f, 1.0f, 0.0f}});
  const torch::Tensor sums = InferenceMismatchSums(learner, behaviour, mask);
  EXPECT_NEAR(sums[0].item<double>(), 0.5, 1e-6);
  EXPECT_NEAR(sums[1].item<double>(), std::exp(0.5) - 1.5, 1e-6);
  EXPECT_EQ(sums[2].item<double>(), 2.0);
}

}  // namespace
}  // namespace kappa::learner
