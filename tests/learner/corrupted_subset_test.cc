// The unreliable-teacher keys from the run configuration to the learner's
// reports: trainer.lr_schedule and teacher.bootstrap.corrupt are parsed and
// refused by name, and CorruptedSubset splits accuracy and K_DR by the
// subset the rule covers.
#include "learner/corrupted_subset.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "learner/step_config.h"
#include "services/config.h"
#include "tasks/vector_dataset.h"

namespace kappa::learner {
namespace {

absl::StatusOr<services::Config> ConfigWith(const std::vector<std::string>& overrides) {
  return services::ParseConfig("", "run.yaml", overrides);
}

// Where a configuration with `overrides` is refused: at load (a named
// choice's unknown value) or by the learner's start-up checks; OK if neither.
absl::Status RefusalOf(const std::vector<std::string>& overrides) {
  absl::StatusOr<services::Config> config = ConfigWith(overrides);
  return config.ok() ? ValidateStepConfig(*config) : config.status();
}

TEST(LearningRateScheduleConfig, CosineWithWarmupFromTheTrainerKeys) {
  absl::StatusOr<services::Config> config =
      ConfigWith({"trainer.lr=2e-3", "trainer.warmup_steps=5", "trainer.lr_schedule=cosine",
                  "trainer.min_lr_ratio=0.1", "trainer.steps=100"});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<LearningRateSchedule> schedule = MakeLearningRateSchedule(*config);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_DOUBLE_EQ(schedule->At(0), 2e-3 / 5);
  EXPECT_NEAR(schedule->At(100), 0.2e-3, 1e-15);
  // The defaults: the constant rate of before.
  absl::StatusOr<LearningRateSchedule> plain = MakeLearningRateSchedule(services::Config());
  ASSERT_TRUE(plain.ok());
  EXPECT_DOUBLE_EQ(plain->At(0), services::Config().trainer.lr);
  EXPECT_DOUBLE_EQ(plain->At(10000), services::Config().trainer.lr);
}

TEST(LearningRateScheduleConfig, BadValuesNameTheirKey) {
  for (const auto& [override_text, key] : std::vector<std::pair<std::string, std::string>>{
           {"trainer.lr_schedule=linear", "trainer.lr_schedule"},
           {"trainer.min_lr_ratio=1.5", "trainer.min_lr_ratio"},
           {"trainer.warmup_steps=-1", "trainer.warmup_steps"},
           {"trainer.lr=0", "trainer.lr"}}) {
    const absl::Status status = RefusalOf({override_text});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << override_text;
    EXPECT_NE(status.message().find(key), std::string::npos) << status;
  }
}

TEST(LambdaScheduleConfig, CosineIsAScheduleAndBadValuesNameTheirKey) {
  absl::StatusOr<services::Config> constant = ConfigWith({});
  ASSERT_TRUE(constant.ok());
  absl::StatusOr<std::optional<LearningRateSchedule>> none = MakeLambdaSchedule(*constant);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  absl::StatusOr<services::Config> cosine =
      ConfigWith({"trainer.lambda=0.5", "trainer.lambda_schedule=cosine", "trainer.steps=100",
                  "trainer.lambda_warmup_steps=10", "trainer.lambda_min_ratio=0.1"});
  ASSERT_TRUE(cosine.ok()) << cosine.status();
  absl::StatusOr<HybridStepConfig> step = MakeHybridStepConfig(*cosine);
  ASSERT_TRUE(step.ok() && step->lambda_schedule) << step.status();
  EXPECT_DOUBLE_EQ(step->lambda_schedule->At(9), 0.5);
  EXPECT_DOUBLE_EQ(step->lambda_schedule->At(100), 0.05);

  for (const auto& [overrides, key] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"trainer.lambda_schedule=linear"}, "trainer.lambda_schedule"},
           {{"trainer.lambda_warmup_steps=5"}, "trainer.lambda_warmup_steps"},
           {{"trainer.lambda_schedule=cosine", "trainer.lambda_min_ratio=2"},
            "trainer.lambda_min_ratio"},
           {{"trainer.lambda_schedule=cosine", "trainer.balance=[m3_adapt]"}, "m3_adapt"}}) {
    const absl::Status status = RefusalOf(overrides);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_NE(status.message().find(key), std::string::npos) << status;
  }
}

// The pairs that contradict each other are refused by the algorithm's one
// check (ValidateHybridStepConfig) at start-up, naming the keys.
TEST(StepConfig, ContradictoryPairsAreRefusedByTheOneCheck) {
  for (const auto& [overrides, key] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"rstg.token_selector=union", "rstg.entropy_threshold=0.5"}, "rstg.token_selector"},
           {{"rstg.token_selector=union", "rstg.divergence_threshold=0"}, "union"},
           {{"rstg.token_frac=0"}, "rstg.token_frac"},
           {{"trainer.lambda_schedule=cosine", "trainer.balance=[m3_adapt]"},
            "trainer.lambda_schedule"}}) {
    const absl::Status status = RefusalOf(overrides);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_NE(status.message().find(key), std::string::npos) << status;
  }
  EXPECT_TRUE(RefusalOf({"rstg.token_selector=union"}).ok());
}

TEST(TeacherCorruptionConfig, NamesTheKeyOfAnUnknownRuleOrAConfiguredCheckpoint) {
  absl::StatusOr<services::Config> none = ConfigWith({});
  ASSERT_TRUE(none.ok());
  absl::StatusOr<std::optional<tasks::AnswerCorruption>> rule = StudiedCorruption(*none);
  ASSERT_TRUE(rule.ok());
  EXPECT_FALSE(rule->has_value());

  absl::StatusOr<services::Config> good = ConfigWith({"teacher.bootstrap.corrupt=minus_as_plus"});
  ASSERT_TRUE(good.ok()) << good.status();
  rule = StudiedCorruption(*good);
  ASSERT_TRUE(rule.ok() && rule->has_value()) << rule.status();
  EXPECT_EQ((*rule)->name(), "minus_as_plus");

  absl::StatusOr<services::Config> bad = ConfigWith({"teacher.bootstrap.corrupt=sometimes"});
  ASSERT_TRUE(bad.ok());
  absl::Status status = ValidateStepConfig(*bad);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("teacher.bootstrap.corrupt"), std::string::npos) << status;
  EXPECT_NE(status.message().find("'sometimes'"), std::string::npos) << status;

  absl::StatusOr<services::Config> own =
      ConfigWith({"teacher.bootstrap.corrupt=minus_as_plus", "teacher.checkpoint=/models/t"});
  ASSERT_TRUE(own.ok());
  status = ValidateStepConfig(*own);
  EXPECT_NE(status.message().find("teacher.checkpoint is set"), std::string::npos) << status;
}

// The mirror control of issue 39: a clean teacher and a student bootstrapped
// wrong on a subset. The learner reports that subset as it does a corrupted
// teacher's; both at once would be two subsets, which it does not report.
TEST(StudiedCorruptionConfig, TheLearnerReadsTheStudentsRuleAndRefusesBoth) {
  absl::StatusOr<services::Config> student =
      ConfigWith({"student.bootstrap.corrupt=hundreds_plus_one"});
  ASSERT_TRUE(student.ok()) << student.status();
  absl::StatusOr<std::optional<tasks::AnswerCorruption>> rule = StudiedCorruption(*student);
  ASSERT_TRUE(rule.ok() && rule->has_value()) << rule.status();
  EXPECT_EQ((*rule)->name(), "hundreds_plus_one");
  EXPECT_TRUE(ValidateStepConfig(*student).ok()) << ValidateStepConfig(*student);

  absl::StatusOr<services::Config> bad = ConfigWith({"student.bootstrap.corrupt=sometimes"});
  ASSERT_TRUE(bad.ok());
  absl::Status status = ValidateStepConfig(*bad);
  EXPECT_NE(status.message().find("student.bootstrap.corrupt"), std::string::npos) << status;

  absl::StatusOr<services::Config> both = ConfigWith(
      {"student.bootstrap.corrupt=hundreds_plus_one", "teacher.bootstrap.corrupt=minus_as_plus"});
  ASSERT_TRUE(both.ok());
  status = ValidateStepConfig(*both);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("set one of them"), std::string::npos) << status;

  absl::StatusOr<services::Config> own =
      ConfigWith({"student.bootstrap.corrupt=minus_as_plus", "student.checkpoint=/models/s"});
  ASSERT_TRUE(own.ok());
  status = ValidateStepConfig(*own);
  EXPECT_NE(status.message().find("student.checkpoint is set"), std::string::npos) << status;
}

tasks::Example Problem(std::string prompt, std::string answer) {
  tasks::Example example;
  example.prompt = std::move(prompt);
  example.answer = std::move(answer);
  return example;
}

CorruptedSubset CarrySubset(size_t heldout_count) {
  static const tasks::VectorDataset train(
      {Problem("57+68=", "125"), Problem("1+2=", "3"), Problem("60+40=", "100")});
  static const tasks::VectorDataset heldout({Problem("70+70=", "140"), Problem("3+4=", "7"),
                                             Problem("5+5=", "10"), Problem("99+9=", "108")});
  return CorruptedSubset(*tasks::AnswerCorruption::Named("carry_into_hundreds"), train, heldout,
                         heldout_count);
}

TEST(CorruptedSubsetTest, ClassifiesTrainingExamplesAndSplitsHeldOutAccuracy) {
  const CorruptedSubset subset = CarrySubset(4);
  EXPECT_EQ(subset.name(), "carry_into_hundreds");
  EXPECT_TRUE(subset.TrainCovered(0));
  EXPECT_FALSE(subset.TrainCovered(1));
  EXPECT_TRUE(subset.TrainCovered(2));
  // Held-out examples 0 and 3 are covered: one of them right; of the rest
  // (1, 2), both right.
  const std::map<std::string, double> accuracy = subset.AccuracyBySubset({false, true, true, true});
  ASSERT_EQ(accuracy.size(), 2u);
  EXPECT_DOUBLE_EQ(accuracy.at("carry_into_hundreds"), 0.5);
  EXPECT_DOUBLE_EQ(accuracy.at("rest"), 1.0);
  // Only the evaluated examples count: the first two hold one of each.
  const std::map<std::string, double> first_two = CarrySubset(2).AccuracyBySubset({true, false});
  EXPECT_DOUBLE_EQ(first_two.at("carry_into_hundreds"), 1.0);
  EXPECT_DOUBLE_EQ(first_two.at("rest"), 0.0);
  // A subset without evaluated examples is left out.
  const std::map<std::string, double> only_rest = CarrySubset(4).AccuracyBySubset({});
  EXPECT_TRUE(only_rest.empty());
  // The covered evaluated prompts, answered the rule's way, for the
  // "<rule>_followed" view.
  EXPECT_EQ(subset.FollowedName(), "carry_into_hundreds_followed");
  const tasks::Dataset& as_taught = subset.covered_heldout_as_taught();
  ASSERT_EQ(as_taught.size(), 2u);
  EXPECT_EQ(as_taught.at(0).prompt, "70+70=");
  EXPECT_EQ(as_taught.at(0).answer, "40");
  EXPECT_EQ(as_taught.at(1).prompt, "99+9=");
  EXPECT_EQ(as_taught.at(1).answer, "8");
  EXPECT_EQ(CarrySubset(2).covered_heldout_as_taught().size(), 1u);
}

TEST(CorruptedSubsetTest, KdrBySubsetCountsEachRowsResponseTokensFromItsFirst) {
  // Three rows; responses start at columns 2, 1 and 3. Rows 0 and 2 are
  // covered.
  const torch::Tensor mask = torch::tensor(
      {{0.f, 0.f, 1.f, 1.f, 0.f}, {0.f, 1.f, 1.f, 1.f, 0.f}, {0.f, 0.f, 0.f, 1.f, 1.f}});
  const torch::Tensor kernel = torch::tensor(
      {{9.f, 9.f, -2.f, 4.f, 9.f}, {9.f, 1.f, 2.f, 3.f, 9.f}, {9.f, 9.f, 9.f, -4.f, -6.f}});
  const std::map<std::string, SubsetKdr> kdr =
      CorruptedSubset::KdrBySubset("carry_into_hundreds", kernel, mask, {true, false, true});
  const SubsetKdr& covered = kdr.at("carry_into_hundreds");
  EXPECT_EQ(covered.positions, 4);
  EXPECT_DOUBLE_EQ(*covered.mean, (-2.0 + 4.0 - 4.0 - 6.0) / 4);
  EXPECT_DOUBLE_EQ(*covered.negative_fraction, 0.75);
  ASSERT_EQ(covered.token_mean.size(), 2u);
  EXPECT_DOUBLE_EQ(*covered.token_mean[0], -3.0);  // -2 and -4: each row's first answer token
  EXPECT_DOUBLE_EQ(*covered.token_mean[1], -1.0);  // 4 and -6
  const SubsetKdr& rest = kdr.at("rest");
  EXPECT_EQ(rest.positions, 3);
  EXPECT_DOUBLE_EQ(*rest.mean, 2.0);
  EXPECT_DOUBLE_EQ(*rest.negative_fraction, 0.0);
  ASSERT_EQ(rest.token_mean.size(), 3u);
  EXPECT_DOUBLE_EQ(*rest.token_mean[2], 3.0);

  // No covered row: its statistics stay unset rather than 0.
  const std::map<std::string, SubsetKdr> none =
      CorruptedSubset::KdrBySubset("carry_into_hundreds", kernel, mask, {false, false, false});
  EXPECT_EQ(none.at("carry_into_hundreds").positions, 0);
  EXPECT_FALSE(none.at("carry_into_hundreds").mean.has_value());
  EXPECT_THROW(CorruptedSubset::KdrBySubset("x", kernel, mask, {true}), std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner
