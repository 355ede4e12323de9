// The metrics.jsonl line of a real training step against its schema: the
// learner writes only keys of learner/metrics_schema.h, a step that measured
// everything writes every one of them, and docs/metrics.md names each.
#include "learner/step_record.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "learner/algo/hybrid_step.h"
#include "learner/metrics_schema.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

// A step that measured κ, cheap and exact K_DR, fired an alarm and evaluated.
StepRecord FullyMeasuredRecord() {
  model::Decoder model = testing::TinyModel(5);
  HybridStepConfig config;
  config.monitor.kdr_exact_every = 1;
  config.monitor.kdr_exact_positions = 4;
  HybridStep step(model, std::make_unique<PolicyOptimizer>(model, 1e-3, 0.0, 1.0), config);
  StepRecord record;
  record.report = step.Run(BuildTrainBatch(testing::RandomGroups(2, 4, true, 11), true, 0));
  record.step = 1;
  record.policy_version = 1;
  record.samples = 8;
  record.staleness = {0, 1};
  record.lease_ids = {"a", "b"};
  record.group_versions = {0, 0};
  record.interval_seconds = 0.5;
  record.alarm_events.push_back({AlarmKind::kCollapse, 1, "reward fell", {{"reward_mean", 0.1}}});
  record.alarm_active[2] = true;
  record.eval_accuracy = 0.5;
  SubsetKdr covered;
  covered.positions = 2;
  covered.mean = -1.5;
  covered.negative_fraction = 1.0;
  covered.token_mean = {-1.0, std::nullopt, -2.0};
  record.kdr_by_subset = {{"carry_into_hundreds", covered}, {"rest", SubsetKdr{}}};
  record.eval_accuracy_by_subset = {{"carry_into_hundreds", 0.25}, {"rest", 0.75}};
  return record;
}

std::set<std::string> SchemaKeys() {
  return std::set<std::string>(std::begin(metrics_jsonl::kAllKeys),
                               std::end(metrics_jsonl::kAllKeys));
}

TEST(StepRecord, WritesEverySchemaKeyAndNoOther) {
  const StepRecord record = FullyMeasuredRecord();
  ASSERT_TRUE(record.report.kdr_exact.has_value());
  const nlohmann::json line = ToJson(record);
  const std::set<std::string> schema = SchemaKeys();
  std::set<std::string> written;
  for (const auto& [key, value] : line.items()) {
    written.insert(key);
    EXPECT_TRUE(schema.count(key)) << key << " is not in learner/metrics_schema.h";
  }
  for (const std::string& key : schema) {
    EXPECT_TRUE(written.count(key)) << key << " is in the schema but never written";
  }
  const nlohmann::json evaluation = EvaluationJson(0, 0, 0.25);
  for (const auto& [key, value] : evaluation.items()) {
    EXPECT_TRUE(schema.count(key)) << key;
  }
}

TEST(StepRecord, LineCarriesTheStepsValues) {
  const StepRecord record = FullyMeasuredRecord();
  const nlohmann::json line = ToJson(record);
  EXPECT_EQ(line[metrics_jsonl::kStep], 1);
  EXPECT_DOUBLE_EQ(line[metrics_jsonl::kSamplesPerSecond].get<double>(), 16.0);
  EXPECT_DOUBLE_EQ(line[metrics_jsonl::kStalenessMean].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(line[metrics_jsonl::kKappa].get<double>(), *record.report.stats.kappa());
  EXPECT_EQ(line[metrics_jsonl::kKdrExactPositions], 4);
  EXPECT_EQ(line[metrics_jsonl::kAlarms][0]["kind"], "collapse");
  EXPECT_EQ(line[metrics_jsonl::kAlarmActive]["collapse"], 1);
  EXPECT_EQ(line[metrics_jsonl::kAlarmActive]["magnitude_drowning"], 0);
  EXPECT_EQ(line[metrics_jsonl::kAlarmActive]["inference_mismatch"], 0);
  // By subset: unset values are null, never 0.
  EXPECT_EQ(line[metrics_jsonl::kKdrMeanBySubset]["carry_into_hundreds"], -1.5);
  EXPECT_TRUE(line[metrics_jsonl::kKdrMeanBySubset]["rest"].is_null());
  EXPECT_EQ(line[metrics_jsonl::kKdrTokenMeanBySubset]["carry_into_hundreds"].dump(),
            "[-1.0,null,-2.0]");
  EXPECT_EQ(line[metrics_jsonl::kKdrPositionsBySubset]["rest"], 0);
  EXPECT_EQ(line[metrics_jsonl::kEvalAccuracyBySubset]["rest"], 0.75);
  // Every row counted (Run without on-policy rows): the batch's tokens.
  EXPECT_EQ(line[metrics_jsonl::kMismatchTokens], record.report.mismatch_tokens);
  EXPECT_GT(record.report.mismatch_tokens, 0);
  EXPECT_DOUBLE_EQ(line[metrics_jsonl::kMismatchAbsMean].get<double>(),
                   *record.report.mismatch_abs_mean);
  EXPECT_DOUBLE_EQ(line[metrics_jsonl::kMismatchK3].get<double>(), *record.report.mismatch_k3);
  EXPECT_EQ(ObservationOf(record).inference_mismatch, record.report.mismatch_abs_mean);
  // An unmeasured value is null, never 0.
  StepRecord unmeasured;
  const nlohmann::json empty = ToJson(unmeasured);
  EXPECT_TRUE(empty[metrics_jsonl::kKappa].is_null());
  EXPECT_TRUE(empty[metrics_jsonl::kGradCosine].is_null());
  EXPECT_FALSE(empty.contains(metrics_jsonl::kEvalAccuracy));
  // No on-policy token: the mismatch is null, its count 0, the alarm not fed.
  EXPECT_TRUE(empty[metrics_jsonl::kMismatchAbsMean].is_null());
  EXPECT_TRUE(empty[metrics_jsonl::kMismatchK3].is_null());
  EXPECT_EQ(empty[metrics_jsonl::kMismatchTokens], 0);
  EXPECT_FALSE(ObservationOf(unmeasured).inference_mismatch.has_value());
}

TEST(StepRecord, DocsNameEveryKey) {
  std::ifstream in(std::string(KAPPA_SOURCE_DIR) + "/docs/metrics.md");
  ASSERT_TRUE(in) << "docs/metrics.md";
  std::stringstream text;
  text << in.rdbuf();
  for (const std::string& key : SchemaKeys()) {
    EXPECT_NE(text.str().find("`" + key + "`"), std::string::npos)
        << "docs/metrics.md does not document the metrics.jsonl key `" << key << "`";
  }
}

}  // namespace
}  // namespace kappa::learner
