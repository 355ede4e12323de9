// trainer.advantage_std from the run configuration to the batch: the key
// parses, the step configuration carries it, a bad value is refused naming
// the key, and the batch's advantages divide by the std it names. Also the
// M3 pairs the step configuration refuses by name (issue 44).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "learner/algo/losses.h"
#include "learner/algo/train_batch.h"
#include "learner/step_config.h"
#include "services/config.h"

namespace kappa::learner {
namespace {

// One group of four: rewards 1, 0, 0, 0 (mean 0.25, Σ (r − mean)² = 0.75).
std::vector<ScoredGroup> OneGroup() {
  ScoredGroup group;
  group.prompt_tokens = {1, 2};
  for (float reward : {1.f, 0.f, 0.f, 0.f}) {
    ScoredSample sample;
    sample.response_tokens = {3, 4};
    sample.behavior_logprobs = {-1.f, -1.f};
    sample.reward = reward;
    group.samples.push_back(sample);
  }
  return {group};
}

absl::StatusOr<HybridStepConfig> StepFor(const std::vector<std::string>& overrides) {
  absl::StatusOr<services::Config> config = services::ParseConfig("", "run.yaml", overrides);
  if (!config.ok()) return config.status();
  return MakeHybridStepConfig(*config);
}

TEST(AdvantageStd, DefaultIsThePopulationStd) {
  EXPECT_EQ(services::Config().trainer.advantage_std, services::AdvantageStd::kPopulation);
  absl::StatusOr<HybridStepConfig> step = StepFor({});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->advantage_std, AdvantageStd::kPopulation);
}

TEST(AdvantageStd, SampleReachesTheBatchAdvantages) {
  absl::StatusOr<HybridStepConfig> step = StepFor({"trainer.advantage_std=sample"});
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_EQ(step->advantage_std, AdvantageStd::kSample);

  const TrainBatch batch = BuildTrainBatch(OneGroup(), /*norm_std=*/true, /*pad_id=*/0,
                                           step->truncated, step->advantage_std);
  const double sample_std = std::sqrt(0.75 / 3) + 1e-6;
  // Every response position of a sample carries its advantage; the first
  // response position is input position 1 (prompt length 2).
  EXPECT_NEAR(batch.advantages[0][1].item<double>(), 0.75 / sample_std, 1e-6);
  EXPECT_NEAR(batch.advantages[1][1].item<double>(), -0.25 / sample_std, 1e-6);
  const TrainBatch population = BuildTrainBatch(OneGroup(), true, 0);
  EXPECT_NEAR(population.advantages[0][1].item<double>(), 0.75 / (std::sqrt(0.75 / 4) + 1e-6),
              1e-6);
}

TEST(AdvantageStd, ABadValueIsRefusedNamingTheKey) {
  const absl::StatusOr<HybridStepConfig> step = StepFor({"trainer.advantage_std=unbiased"});
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(step.status().message());
  EXPECT_NE(message.find("trainer.advantage_std"), std::string::npos) << message;
  EXPECT_NE(message.find("population, sample"), std::string::npos) << message;
}

// Pairs that would run and do nothing, refused naming both keys; their
// neighbours still pass.
TEST(M3Config, PairsThatWouldDoNothingAreRefusedNamingBothKeys) {
  struct Refused {
    std::vector<std::string> overrides;
    std::string other_key, why;
  };
  for (const Refused& c : std::vector<Refused>{
           {{"trainer.balance=m3_norm", "trainer.reward_weight=0"},
            "trainer.reward_weight",
            "m3_norm"},
           {{"trainer.balance=[m3_norm,m3_project]", "trainer.reward_weight=0"},
            "trainer.reward_weight",
            "m3_norm"},
           {{"trainer.balance=m3_mask", "trainer.distill_gate=rstg"},
            "trainer.distill_gate",
            "can only remove reward signal"},
           {{"trainer.balance=m3_mask", "trainer.distill_gate=rstg", "m3.mask_target=distill"},
            "trainer.distill_gate",
            "m3_mask"}}) {
    const absl::StatusOr<HybridStepConfig> step = StepFor(c.overrides);
    if (step.ok()) {
      ADD_FAILURE() << "accepted: " << c.overrides[0] << " " << c.overrides[1];
      continue;
    }
    EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(step.status().message());
    EXPECT_NE(message.find("trainer.balance"), std::string::npos) << message;
    EXPECT_NE(message.find(c.other_key), std::string::npos) << message;
    EXPECT_NE(message.find(c.why), std::string::npos) << message;
  }
  for (const std::vector<std::string>& fine : std::vector<std::vector<std::string>>{
           {"trainer.balance=m3_norm", "trainer.reward_weight=0.5"},
           {"trainer.balance=naive", "trainer.reward_weight=0"},
           {"trainer.balance=m3_mask", "trainer.distill_gate=all"},
           {"trainer.balance=m3_norm", "trainer.distill_gate=rstg"},
           {"trainer.balance=m3_mask", "m3.mask_temperature=0.5"}}) {
    const absl::StatusOr<HybridStepConfig> step = StepFor(fine);
    EXPECT_TRUE(step.ok()) << fine[0] << " " << fine[1] << ": " << step.status();
  }
  const absl::StatusOr<HybridStepConfig> negative = StepFor({"m3.mask_temperature=-1"});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("m3.mask_temperature"), std::string::npos)
      << negative.status();
}

}  // namespace
}  // namespace kappa::learner
