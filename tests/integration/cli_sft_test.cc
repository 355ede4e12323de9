// `kappa sft` end to end on a tiny config: a loadable checkpoint of the
// configured shape and a summary with the numbers it printed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/tokenizer.h"
#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RunKappa;
using testing::WriteFile;

constexpr const char* kTinyConfig = R"(name: tiny
seed: 3
task:
  kind: arithmetic
  min_digits: 1
  max_digits: 1
  operators: "+"
  train_size: 40
  heldout_size: 10
student:
  shape: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1,
          num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 12}
  bootstrap: {steps: 4, batch_size: 8, lr: 1.0e-3, warmup_steps: 1, seed: 5, train_examples: 20}
teacher:
  shape: {hidden_size: 24, intermediate_size: 48, num_hidden_layers: 1,
          num_attention_heads: 2, num_key_value_heads: 2, max_position_embeddings: 12}
  bootstrap: {steps: 3, batch_size: 8, lr: 1.0e-3, warmup_steps: 0, seed: 6}
rollout:
  max_new_tokens: 3
trainer:
  eval_examples: 10
)";

class SftCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("kappa_cli_sft");
    ASSERT_FALSE(dir_.empty());
    config_ = dir_ + "/tiny.yaml";
    WriteFile(config_, kTinyConfig);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::string config_;
};

TEST_F(SftCommandTest, WritesLoadableCheckpointAndSummary) {
  const std::string out = dir_ + "/student-ckpt";
  auto result =
      RunKappa({"sft", config_, "--role", "student", "--out", out, "student.bootstrap.steps=5"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("held-out accuracy"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("step 5/5"), std::string::npos) << result.output;

  ASSERT_TRUE(model::CheckpointExists(out));
  model::Decoder decoder = model::LoadCheckpoint(out);
  EXPECT_EQ(decoder->config().hidden_size, 16);
  EXPECT_EQ(decoder->config().num_key_value_heads, 1);
  EXPECT_EQ(decoder->config().max_position_embeddings, 12);
  EXPECT_EQ(decoder->config().vocab_size, model::CharTokenizer().vocab_size());

  const nlohmann::json summary = nlohmann::json::parse(ReadFile(out + "/sft_summary.json"));
  EXPECT_EQ(summary.at("steps").get<int64_t>(), 5);  // the override won over the file
  EXPECT_EQ(summary.at("train_examples").get<int64_t>(), 20);
  EXPECT_EQ(summary.at("eval_examples").get<int64_t>(), 10);
  EXPECT_EQ(summary.at("role").get<std::string>(), "student");
  const double accuracy = summary.at("accuracy").get<double>();
  EXPECT_GE(accuracy, 0.0);
  EXPECT_LE(accuracy, 1.0);
  EXPECT_GT(summary.at("loss").get<double>(), 0.0);
  EXPECT_GT(summary.at("seconds").get<double>(), 0.0);
}

TEST_F(SftCommandTest, DefaultsToDataDirSlashRole) {
  const std::string data_dir = dir_ + "/cache";
  auto result = RunKappa({"sft", config_, "--role=teacher", "data_dir=" + data_dir});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  ASSERT_TRUE(model::CheckpointExists(data_dir + "/teacher"));
  EXPECT_EQ(model::LoadCheckpoint(data_dir + "/teacher")->config().hidden_size, 24);
  EXPECT_TRUE(std::filesystem::exists(data_dir + "/teacher/sft_summary.json"));
}

TEST_F(SftCommandTest, StopsAtTheFirstCheckThatReachesTheTargetAccuracy) {
  const std::string out = dir_ + "/teacher-ckpt";
  auto result =
      RunKappa({"sft", config_, "--role", "teacher", "--out", out, "teacher.bootstrap.steps=600",
                "teacher.bootstrap.lr=1.0e-2", "teacher.bootstrap.target_accuracy=0.25",
                "teacher.bootstrap.check_every=10"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("reached, stopping"), std::string::npos) << result.output;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(out + "/sft_summary.json"));
  const int64_t steps = summary.at("steps").get<int64_t>();
  EXPECT_LT(steps, 600);
  EXPECT_EQ(steps % 10, 0);
  EXPECT_TRUE(summary.at("reached_target").get<bool>());
  EXPECT_DOUBLE_EQ(summary.at("target_accuracy").get<double>(), 0.25);
  EXPECT_GE(summary.at("train_accuracy").get<double>(), 0.25);
  // A check before the last one was short of the target (at step 30 here).
  ASSERT_GT(steps, 10);
  EXPECT_NE(result.output.find("step " + std::to_string(steps - 10) + ": accuracy on 10"),
            std::string::npos)
      << result.output;
}

TEST_F(SftCommandTest, AnUnreachedTargetTrainsAllStepsAndAWrongOneIsRefused) {
  const std::string out = dir_ + "/student-ckpt";
  auto capped =
      RunKappa({"sft", config_, "--role", "student", "--out", out,
                "student.bootstrap.target_accuracy=1", "student.bootstrap.check_every=2"});
  ASSERT_EQ(capped.exit_code, 0) << capped.output;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(out + "/sft_summary.json"));
  EXPECT_EQ(summary.at("steps").get<int64_t>(), 4);
  EXPECT_FALSE(summary.at("reached_target").get<bool>());

  auto wrong = RunKappa({"sft", config_, "--role", "student", "--out", dir_ + "/y",
                         "student.bootstrap.target_accuracy=1.5"});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("student.bootstrap.target_accuracy': 1.5 is not in [0, 1]"),
            std::string::npos)
      << wrong.output;
  auto never_checked =
      RunKappa({"sft", config_, "--role", "student", "--out", dir_ + "/y",
                "student.bootstrap.target_accuracy=0.5", "student.bootstrap.check_every=0"});
  EXPECT_NE(never_checked.exit_code, 0);
  EXPECT_NE(never_checked.output.find("student.bootstrap.check_every': 0 is not >= 1"),
            std::string::npos)
      << never_checked.output;
  EXPECT_FALSE(model::CheckpointExists(dir_ + "/y"));
}

TEST_F(SftCommandTest, RejectsBadRoleAndMissingRole) {
  auto bad = RunKappa({"sft", config_, "--role", "critic"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("critic"), std::string::npos) << bad.output;
  auto missing = RunKappa({"sft", config_});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("--role"), std::string::npos) << missing.output;
}

TEST_F(SftCommandTest, ReportsSequencesTooLongForTheModel) {
  // "9+9=" is 5 tokens with BOS and "18" + EOS 3 more: 8 > 6 positions.
  auto result = RunKappa({"sft", config_, "--role", "student", "--out", dir_ + "/x",
                          "student.shape.max_position_embeddings=6"});
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("positions"), std::string::npos) << result.output;
  EXPECT_FALSE(model::CheckpointExists(dir_ + "/x"));
}

// corrupt_fraction: the summary says the chance the run used, and a fraction
// outside (0, 1] or one without a rule is refused naming the key, writing
// nothing.
TEST_F(SftCommandTest, ACorruptFractionIsRecordedAndABadOneRefused) {
  const std::string out = dir_ + "/student-ckpt";
  auto mixed = RunKappa({"sft", config_, "--role", "student", "--out", out, "task.max_digits=2",
                         "task.train_size=200", "student.bootstrap.corrupt=hundreds_plus_one",
                         "student.bootstrap.corrupt_fraction=0.75"});
  ASSERT_EQ(mixed.exit_code, 0) << mixed.output;
  EXPECT_NE(mixed.output.find("(drawn so with chance 0.75)"), std::string::npos) << mixed.output;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(out + "/sft_summary.json"));
  EXPECT_DOUBLE_EQ(summary.at("corrupt_fraction").get<double>(), 0.75);
  EXPECT_GT(summary.at("corrupted_train_examples").get<int64_t>(), 0);

  auto zero = RunKappa({"sft", config_, "--role", "student", "--out", dir_ + "/y",
                        "student.bootstrap.corrupt=hundreds_plus_one",
                        "student.bootstrap.corrupt_fraction=0"});
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.output.find("student.bootstrap.corrupt_fraction': 0 is not in (0, 1]"),
            std::string::npos)
      << zero.output;
  auto without_rule = RunKappa({"sft", config_, "--role", "teacher", "--out", dir_ + "/y",
                                "teacher.bootstrap.corrupt_fraction=0.5"});
  EXPECT_NE(without_rule.exit_code, 0);
  EXPECT_NE(without_rule.output.find("'teacher.bootstrap.corrupt' is empty"), std::string::npos)
      << without_rule.output;
  EXPECT_FALSE(model::CheckpointExists(dir_ + "/y"));
}

}  // namespace
}  // namespace kappa::cli
