// `kappa run` refuses bad configurations before starting anything, and says
// which file and key are wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

using testing::MakeTempDir;
using testing::RunKappa;
using testing::WriteFile;

class RunConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("kappa_cli_run_config");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Config(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    WriteFile(path, text);
    return path;
  }

  std::string dir_;
};

TEST_F(RunConfigTest, UnknownKeyNamesFileAndKey) {
  const std::string path = Config("typo.yaml", "name: t\ntrainer:\n  stepz: 10\n");
  auto result = RunKappa({"run", path, "runs_dir=" + dir_ + "/runs"});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("typo.yaml"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("trainer.stepz"), std::string::npos) << result.output;
  // Nothing was started or created.
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/runs"));
}

TEST_F(RunConfigTest, WrongTypeNamesKeyAndValue) {
  const std::string path = Config("types.yaml", "trainer:\n  steps: ten\n");
  auto result = RunKappa({"run", path});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("types.yaml"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("trainer.steps"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("ten"), std::string::npos) << result.output;
}

TEST_F(RunConfigTest, BadOverrideNamesTheOverride) {
  const std::string path = Config("ok.yaml", "name: t\n");
  auto result = RunKappa({"run", path, "trainer.stepz=3"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("trainer.stepz"), std::string::npos) << result.output;
}

TEST_F(RunConfigTest, MissingFileIsNamed) {
  const std::string path = dir_ + "/does-not-exist.yaml";
  auto result = RunKappa({"run", path});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("does-not-exist.yaml"), std::string::npos) << result.output;
}

TEST_F(RunConfigTest, ZeroWorkersIsRejected) {
  const std::string path = Config("ok.yaml", "name: t\n");
  auto result = RunKappa({"run", path, "workers=0", "runs_dir=" + dir_ + "/runs"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("workers"), std::string::npos) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/runs"));
}

TEST_F(RunConfigTest, UnknownTeacherValuePrecisionIsRejected) {
  const std::string path = Config("ok.yaml", "name: t\n");
  auto result = RunKappa({"run", path, "trainer.teacher_values=fp16", "runs_dir=" + dir_ + "/runs"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("trainer.teacher_values"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("fp16"), std::string::npos) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/runs"));
}

TEST_F(RunConfigTest, BadRolloutSamplingKeysAreRejected) {
  const std::string path = Config("ok.yaml", "name: t\n");
  for (const auto& [override_text, key] : std::vector<std::pair<std::string, std::string>>{
           {"rollout.weights_dtype=fp8", "rollout.weights_dtype"},
           {"rollout.top_k=-1", "rollout.top_k"},
           {"rollout.min_p=1.5", "rollout.min_p"},
           {"rollout.top_p=0", "rollout.top_p"},
           {"rollout.weight_transport=nccl", "rollout.weight_transport"},
           {"learner.weight_group_workers=-1", "learner.weight_group_workers"}}) {
    auto result = RunKappa({"run", path, override_text, "runs_dir=" + dir_ + "/runs"});
    EXPECT_NE(result.exit_code, 0) << override_text;
    EXPECT_NE(result.output.find(key), std::string::npos) << result.output;
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/runs")) << override_text;
  }
}

// student.lora is checked before anything starts, naming the key.
TEST_F(RunConfigTest, BadLoraKeysAreRejected) {
  const std::string path = Config("ok.yaml", "name: t\n");
  for (const auto& [overrides, key] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"student.lora.rank=-2"}, "student.lora.rank"},
           {{"student.lora.rank=8", "student.lora.alpha=0"}, "student.lora.alpha"},
           {{"student.lora.rank=8", "student.lora.dropout=1"}, "student.lora.dropout"},
           {{"student.lora.rank=8", "student.lora.target_modules=q_proj,lm_head"},
            "student.lora.target_modules: 'lm_head'"}}) {
    std::vector<std::string> args = {"run", path, "runs_dir=" + dir_ + "/runs"};
    args.insert(args.end(), overrides.begin(), overrides.end());
    auto result = RunKappa(args);
    EXPECT_NE(result.exit_code, 0) << key;
    EXPECT_NE(result.output.find(key), std::string::npos) << result.output;
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/runs")) << key;
  }
}

// Issue 45: every server would refuse an address other machines reach
// without client authentication; kappa run says so before starting any.
TEST_F(RunConfigTest, AnOpenHostWithoutClientAuthenticationIsRefused) {
  const std::string path = Config("ok.yaml", "name: t\n");
  auto result = RunKappa({"run", path, "host=0.0.0.0", "runs_dir=" + dir_ + "/runs"});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("teacher.address: 0.0.0.0:0 is not a loopback address and no "
                               "client authentication is set"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("security.allow_insecure: true"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/runs"));
}

TEST_F(RunConfigTest, UsageErrorsExitWithTwo) {
  auto no_config = RunKappa({"run"});
  EXPECT_EQ(no_config.exit_code, 2);
  EXPECT_NE(no_config.output.find("CONFIG"), std::string::npos) << no_config.output;
  const std::string path = Config("ok.yaml", "name: t\n");
  auto unknown_flag = RunKappa({"run", path, "--resmue"});
  EXPECT_EQ(unknown_flag.exit_code, 2);
  EXPECT_NE(unknown_flag.output.find("--resmue"), std::string::npos) << unknown_flag.output;
  auto unknown_command = RunKappa({"train", path});
  EXPECT_EQ(unknown_command.exit_code, 2);
  EXPECT_NE(unknown_command.output.find("train"), std::string::npos) << unknown_command.output;
}

}  // namespace
}  // namespace kappa::cli
