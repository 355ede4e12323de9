#include "services/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace kappa::services {
namespace {

std::string Error(const absl::StatusOr<Config>& config) {
  EXPECT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  return std::string(config.status().message());
}

TEST(ConfigTest, EmptyTextGivesDefaults) {
  absl::StatusOr<Config> config = ParseConfig("", "empty.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ConfigToYaml(*config), ConfigToYaml(Config()));
  EXPECT_EQ(config->trainer.steps, 60);
  EXPECT_EQ(config->verifier.address, "127.0.0.1:50053");
}

TEST(ConfigTest, ParsesNestedKeysOfEveryType) {
  const std::string text = R"(name: exp1
seed: 42
task:
  operators: "+-*"
  max_digits: 3
  train_path:
student:
  shape:
    hidden_size: 128
  bootstrap:
    lr: 1e-2
trainer:
  steps: 10
  norm_std: false
  lambda: 0.5
  aggregation: seq-mean-token-mean
verifier:
)";
  absl::StatusOr<Config> config = ParseConfig(text, "run.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name, "exp1");
  EXPECT_EQ(config->seed, 42u);
  EXPECT_EQ(config->task.operators, "+-*");
  EXPECT_EQ(config->task.max_digits, 3);
  EXPECT_EQ(config->task.train_path, "");
  EXPECT_EQ(config->student.shape.hidden_size, 128);
  EXPECT_EQ(config->teacher.shape.hidden_size, 64);  // untouched default
  EXPECT_DOUBLE_EQ(config->student.bootstrap.lr, 1e-2);
  EXPECT_EQ(config->trainer.steps, 10);
  EXPECT_FALSE(config->trainer.norm_std);
  EXPECT_DOUBLE_EQ(config->trainer.lambda, 0.5);
  EXPECT_EQ(config->trainer.aggregation, services::Aggregation::kSeqMeanTokenMean);
}

TEST(ConfigTest, UnknownKeyNamesFileLineAndPath) {
  EXPECT_EQ(Error(ParseConfig("name: x\ntrainer:\n  steps: 3\n  stepz: 10\n", "run.yaml")),
            "run.yaml:4: unknown key 'trainer.stepz'");
  EXPECT_EQ(Error(ParseConfig("\n\nbogus: 1\n", "a.yaml")), "a.yaml:3: unknown key 'bogus'");
  EXPECT_EQ(Error(ParseConfig("student:\n  shape:\n    hiden: 1\n", "a.yaml")),
            "a.yaml:3: unknown key 'student.shape.hiden'");
}

TEST(ConfigTest, WrongTypeNamesFileLineAndPath) {
  EXPECT_EQ(Error(ParseConfig("trainer:\n  steps: ten\n", "run.yaml")),
            "run.yaml:2: key 'trainer.steps' expects an integer, got 'ten'");
  EXPECT_EQ(Error(ParseConfig("trainer:\n  lr: fast\n", "r.yaml")),
            "r.yaml:2: key 'trainer.lr' expects a finite number, got 'fast'");
  EXPECT_EQ(Error(ParseConfig("trainer:\n  norm_std: maybe\n", "r.yaml")),
            "r.yaml:2: key 'trainer.norm_std' expects a boolean, got 'maybe'");
  EXPECT_EQ(Error(ParseConfig("seed: -1\n", "r.yaml")),
            "r.yaml:1: key 'seed' expects a non-negative integer, got '-1'");
  EXPECT_EQ(Error(ParseConfig("trainer:\n  steps: 2.5\n", "r.yaml")),
            "r.yaml:2: key 'trainer.steps' expects an integer, got '2.5'");
  EXPECT_EQ(Error(ParseConfig("trainer:\n  steps: [1, 2]\n", "r.yaml")),
            "r.yaml:2: key 'trainer.steps' expects an integer, got a sequence");
  EXPECT_EQ(Error(ParseConfig("trainer:\n  steps:\n", "r.yaml")),
            "r.yaml:2: key 'trainer.steps' expects an integer, got nothing");
  EXPECT_EQ(Error(ParseConfig("trainer: 5\n", "r.yaml")),
            "r.yaml:1: key 'trainer' is a section and expects a mapping, got a scalar");
}

// A value that is not UTF-8, or holds a carriage return, could not come
// back unchanged through ConfigToYaml (found by config_fuzzer): refused,
// naming the key, in the file and in an override, a scalar or a list item.
TEST(ConfigTest, AValueThatIsNotUtf8IsRefusedByKey) {
  EXPECT_EQ(Error(ParseConfig("name: ab\xff\xff"
                              "cd\n",
                              "run.yaml")),
            "run.yaml:1: key 'name' is not valid UTF-8 (byte 2 of its value)");
  EXPECT_EQ(Error(ParseConfig("trainer:\n  balance: [m3_mask, \"\xc3\"]\n", "run.yaml")),
            "run.yaml:2: key 'trainer.balance' is not valid UTF-8 (byte 0 of its value)");
  EXPECT_THAT(Error(ParseConfig("", "run.yaml", {"name=r\xe9"})),
              ::testing::HasSubstr("key 'name' is not valid UTF-8 (byte 1 of its value)"));
  EXPECT_TRUE(ParseConfig("name: r\xc3\xa9sum\xc3\xa9\n", "run.yaml").ok());  // résumé
  // A carriage return: yaml-cpp writes a trailing one unquoted, which reads
  // back as a line break (found by config_fuzzer: "name: C\r").
  EXPECT_EQ(Error(ParseConfig("name: C\r", "run.yaml")),
            "run.yaml:1: key 'name' holds a carriage return (byte 1 of its value)");
  EXPECT_EQ(Error(ParseConfig("name: \"a\\rb\"\n", "run.yaml")),
            "run.yaml:1: key 'name' holds a carriage return (byte 1 of its value)");
  EXPECT_TRUE(ParseConfig("name: C\r\n", "run.yaml").ok());  // a Windows line end
}

TEST(ConfigTest, OtherFileErrors) {
  EXPECT_EQ(Error(ParseConfig("workers: 1\nworkers: 2\n", "r.yaml")),
            "r.yaml:2: duplicate key 'workers'");
  EXPECT_EQ(Error(ParseConfig("- a\n- b\n", "r.yaml")).rfind("r.yaml:1: expected a mapping", 0),
            0u);
  EXPECT_EQ(Error(ParseConfig("a: [1, 2\n", "r.yaml")).rfind("r.yaml:", 0), 0u);
}

TEST(ConfigTest, OverridesApplyAfterTheFile) {
  absl::StatusOr<Config> config = ParseConfig(
      "trainer:\n  steps: 3\n", "run.yaml",
      {"trainer.steps=20", "workers=3", "name='my run'", "task.operators=*", "trainer.norm_std=no",
       "trainer.lr=2e-4", "task.train_path="});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->trainer.steps, 20);
  EXPECT_EQ(config->workers, 3);
  EXPECT_EQ(config->name, "my run");
  EXPECT_EQ(config->task.operators, "*");
  EXPECT_FALSE(config->trainer.norm_std);
  EXPECT_DOUBLE_EQ(config->trainer.lr, 2e-4);
  EXPECT_EQ(config->task.train_path, "");
}

TEST(ConfigTest, BadOverrides) {
  EXPECT_EQ(Error(ParseConfig("", "r.yaml", {"x=1"})), "override 'x=1': unknown key 'x'");
  EXPECT_EQ(Error(ParseConfig("", "r.yaml", {"trainer=1"})),
            "override 'trainer=1': unknown key 'trainer'");
  EXPECT_EQ(Error(ParseConfig("", "r.yaml", {"trainer.steps=ten"})),
            "override 'trainer.steps=ten': key 'trainer.steps' expects an integer, got 'ten'");
  EXPECT_EQ(Error(ParseConfig("", "r.yaml", {"workers"})),
            "override 'workers': expected key=value");
}

TEST(ConfigTest, EnvironmentOverridesComeBetweenTheFileAndTheCommandLine) {
  const char* environment[] = {"PATH=/usr/bin",
                               "KAPPA_CFG_TRAINER__STEPS=40",
                               "KAPPA_CFG_WORKERS=5",
                               "KAPPA_CFG_TRAINER__GROUPS_PER_STEP=6",
                               "KAPPA_BIN_DIR=/opt/kappa",  // not a config variable
                               nullptr};
  absl::StatusOr<std::vector<std::string>> overrides =
      WithEnvironmentOverrides({"workers=7"}, environment);
  ASSERT_TRUE(overrides.ok()) << overrides.status();
  EXPECT_EQ(*overrides, (std::vector<std::string>{"trainer.groups_per_step=6", "trainer.steps=40",
                                                  "workers=5", "workers=7"}));
  absl::StatusOr<Config> config = ParseConfig("trainer:\n  steps: 3\n", "run.yaml", *overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->trainer.steps, 40);           // environment over the file
  EXPECT_EQ(config->trainer.groups_per_step, 6);
  EXPECT_EQ(config->workers, 7);                  // command line over the environment

  const char* bad[] = {"KAPPA_CFG_TRAINER__STEPZ=4", nullptr};
  EXPECT_EQ(WithEnvironmentOverrides({}, bad).status().message(),
            "environment variable KAPPA_CFG_TRAINER__STEPZ: override 'trainer.stepz=4': unknown "
            "key 'trainer.stepz'");
  const char* bad_value[] = {"KAPPA_CFG_TRAINER__STEPS=many", nullptr};
  EXPECT_EQ(WithEnvironmentOverrides({}, bad_value).status().message(),
            "environment variable KAPPA_CFG_TRAINER__STEPS: override 'trainer.steps=many': key "
            "'trainer.steps' expects an integer, got 'many'");
}

TEST(ConfigTest, YamlRoundTrip) {
  Config config;
  config.name = "round trip: with colon";
  config.seed = 18446744073709551615ull;
  config.task.operators = "*";
  config.task.train_path = "";
  config.student.checkpoint = "  spaced ";
  config.teacher.address = "dns:///teacher:50052";
  config.trainer.lr = 0.1 + 0.2;  // not exactly representable in short decimal
  config.trainer.lambda = 3.0;
  config.trainer.clip_low = 1e-300;
  config.trainer.norm_std = false;
  config.trainer.steps = -5;
  config.rollout.top_p = 0.95;
  // Stop strings keep commas, spaces, newlines and quotes through the YAML.
  config.rollout.stop_strings = {"</answer>", "a, b", "\n\n", " 'q' "};
  config.trainer.truncated = services::TruncatedResponses::kMask;
  const std::string yaml = ConfigToYaml(config);
  absl::StatusOr<Config> parsed = ParseConfig(yaml, "dump.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << yaml;
  EXPECT_EQ(ConfigToYaml(*parsed), yaml);
  EXPECT_EQ(parsed->name, config.name);
  EXPECT_EQ(parsed->seed, config.seed);
  EXPECT_EQ(parsed->task.operators, "*");
  EXPECT_EQ(parsed->student.checkpoint, "  spaced ");
  EXPECT_EQ(parsed->teacher.address, config.teacher.address);
  EXPECT_EQ(parsed->trainer.lr, config.trainer.lr);  // bit-exact
  EXPECT_EQ(parsed->trainer.lambda, 3.0);
  EXPECT_EQ(parsed->trainer.clip_low, 1e-300);
  EXPECT_FALSE(parsed->trainer.norm_std);
  EXPECT_EQ(parsed->trainer.steps, -5);
  EXPECT_EQ(parsed->rollout.top_p, 0.95);
  EXPECT_EQ(parsed->rollout.stop_strings, config.rollout.stop_strings);
  EXPECT_EQ(parsed->trainer.truncated, services::TruncatedResponses::kMask);
}

TEST(ConfigTest, StopStringsAndTruncatedKeys) {
  EXPECT_TRUE(Config().rollout.stop_strings.empty());
  EXPECT_EQ(Config().trainer.truncated, services::TruncatedResponses::kKeep);
  absl::StatusOr<Config> config = ParseConfig(
      "rollout:\n  stop_strings: [\"</answer>\", \"User:\"]\n"
      "trainer:\n  truncated: zero_reward\n",
      "run.yaml", {"rollout.max_new_tokens=64"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rollout.stop_strings, (std::vector<std::string>{"</answer>", "User:"}));
  EXPECT_EQ(config->trainer.truncated, services::TruncatedResponses::kZeroReward);
  config = ParseConfig("", "run.yaml", {"rollout.stop_strings=[\"\\n\\n\", \"END\"]"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rollout.stop_strings, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(Error(ParseConfig("rollout:\n  stop_strings: {a: 1}\n", "run.yaml")),
            "run.yaml:2: key 'rollout.stop_strings' expects a list of names, got a mapping");
}

TEST(ConfigTest, YamlListsEveryKey) {
  const std::string yaml = ConfigToYaml(Config());
  const std::vector<std::string> keys = ConfigKeys();
  EXPECT_GT(keys.size(), 70u);
  for (const std::string& key : keys) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    EXPECT_NE(yaml.find(leaf + ":"), std::string::npos) << key;
    // Each key also works as an override of its own default.
  }
  EXPECT_NE(yaml.find("trainer:\n"), std::string::npos) << yaml;
}

// Every named choice of the configuration, with the spellings docs/
// configuration.md promises for it (written out here, not read from the
// key table): each spelling loads and writes back unchanged, and any other
// text is refused at load, naming the key and every allowed spelling.
TEST(ConfigTest, EveryNamedChoiceRefusesAnUnknownValueByName) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> kChoices = {
      {"task.kind", {"arithmetic", "jsonl"}},
      {"task.heldout_draw", {"first", "interleaved"}},
      {"student.dtype", {"auto", "float32", "bfloat16"}},
      {"teacher.dtype", {"auto", "float32", "bfloat16"}},
      {"rollout.weights_dtype", {"auto", "float32", "bfloat16"}},
      {"rollout.weight_transport", {"grpc", "c10d", "shm", "auto"}},
      {"trainer.lr_schedule", {"constant", "cosine"}},
      {"trainer.lambda_schedule", {"constant", "cosine"}},
      {"trainer.aggregation", {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"}},
      {"trainer.distill_loss",
       {"reverse_kl", "forward_kl", "sampled_reverse_kl", "topk_reverse_kl",
        "topk_tail_reverse_kl"}},
      {"trainer.advantage_std", {"population", "sample"}},
      {"trainer.truncated", {"keep", "mask", "zero_reward"}},
      {"trainer.teacher_values", {"fp32", "bf16"}},
      {"trainer.precision", {"fp32", "bf16"}},
      {"trainer.distill_gate", {"none", "all", "rstg"}},
      {"trainer.balance", {"naive", "m3_norm", "m3_mask", "m3_project", "m3_adapt"}},
      {"m3.mask_target", {"reward", "distill"}},
      {"m3.mask_estimator", {"last_layer", "logit"}},
      {"monitor.kdr_estimator", {"last_layer", "logit"}},
      {"rstg.confidence", {"max_prob", "token_prob"}},
      {"rstg.token_selector", {"entropy", "divergence", "union"}},
  };
  for (const auto& [key, spellings] : kChoices) {
    for (const std::string& spelling : spellings) {
      absl::StatusOr<Config> config = ParseConfig("", "run.yaml", {key + "=" + spelling});
      ASSERT_TRUE(config.ok()) << key << "=" << spelling << ": " << config.status();
      EXPECT_NE(ConfigToYaml(*config).find(spelling), std::string::npos) << key;
    }
    std::string allowed;
    for (const std::string& spelling : spellings) {
      allowed += (allowed.empty() ? "" : ", ") + spelling;
    }
    for (const std::string& bad : {std::string("bogus"), absl::AsciiStrToUpper(spellings[0])}) {
      const std::string message = Error(ParseConfig("", "run.yaml", {key + "=" + bad}));
      EXPECT_NE(message.find("key '" + key + "'"), std::string::npos) << message;
      EXPECT_NE(message.find(allowed), std::string::npos) << message;
      EXPECT_NE(message.find("'" + bad + "'"), std::string::npos) << message;
    }
    // From a file too, naming the line.
    const std::vector<std::string> parts = absl::StrSplit(key, '.');
    const std::string yaml =
        parts.size() == 1 ? key + ": bogus\n" : parts[0] + ":\n  " + parts[1] + ": bogus\n";
    const std::string from_file = Error(ParseConfig(yaml, "run.yaml"));
    EXPECT_EQ(
        from_file.rfind("run.yaml:" + std::to_string(parts.size()) + ": key '" + key + "'", 0), 0u)
        << from_file;
  }
  // A list of choices: every item is checked.
  const std::string list =
      Error(ParseConfig("trainer:\n  balance: [m3_norm, m3_nrom]\n", "run.yaml"));
  EXPECT_NE(list.find("run.yaml:2: key 'trainer.balance' expects a list of naive, m3_norm"),
            std::string::npos)
      << list;
}

TEST(ConfigTest, LoadConfigFromFile) {
  const std::string path = ::testing::TempDir() + "/kappa_config_test.yaml";
  std::ofstream(path) << "workers: 5\ntrainer:\n  group_size: 4\n  bogus: 1\n";
  EXPECT_EQ(Error(LoadConfig(path)), path + ":4: unknown key 'trainer.bogus'");
  std::ofstream(path) << "workers: 5\ntrainer:\n  group_size: 4\n";
  absl::StatusOr<Config> config = LoadConfig(path, {"workers=6"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->workers, 6);
  EXPECT_EQ(config->trainer.group_size, 4);
  std::remove(path.c_str());
  EXPECT_EQ(LoadConfig(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kappa::services
