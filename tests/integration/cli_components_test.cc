// The pieces of `kappa run` that need no services: argument parsing, the
// metrics tail, the progress line, the bootstrap cache key, port assignment,
// run directories and log tails.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli/args.h"
#include "cli/bootstrap.h"
#include "cli/free_port.h"
#include "cli/metrics_tail.h"
#include "cli/progress.h"
#include "cli/restart_budget.h"
#include "cli/run_dir.h"
#include "cli/run_session.h"
#include "cli/service_launch.h"
#include "services/config.h"
#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

using testing::MakeTempDir;

TEST(CliArgsTest, SeparatesConfigOverridesAndFlags) {
  auto line = ParseCommandLine(
      {"--role", "teacher", "c.yaml", "trainer.steps=3", "--out=/tmp/x", "workers=2", "--resume"},
      {"--role", "--out"}, {"--resume"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->config_path, "c.yaml");
  EXPECT_EQ(line->overrides, (std::vector<std::string>{"trainer.steps=3", "workers=2"}));
  EXPECT_EQ(line->Get("--role"), "teacher");
  EXPECT_EQ(line->Get("--out"), "/tmp/x");
  EXPECT_TRUE(line->Has("--resume"));
  EXPECT_FALSE(line->Has("--no-progress"));
}

TEST(CliArgsTest, ErrorsNameTheArgument) {
  auto unknown = ParseCommandLine({"c.yaml", "--bogus"}, {}, {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--bogus"), std::string::npos);
  auto no_value = ParseCommandLine({"c.yaml", "--out"}, {"--out"}, {});
  ASSERT_FALSE(no_value.ok());
  EXPECT_NE(no_value.status().message().find("--out"), std::string::npos);
  auto two_configs = ParseCommandLine({"a.yaml", "b.yaml"}, {}, {});
  ASSERT_FALSE(two_configs.ok());
  EXPECT_NE(two_configs.status().message().find("b.yaml"), std::string::npos);
  EXPECT_FALSE(ParseCommandLine({"trainer.steps=1"}, {}, {}).ok());
  EXPECT_FALSE(ParseCommandLine({"c.yaml", "--resume=1"}, {}, {"--resume"}).ok());
}

TEST(MetricsTailTest, ReturnsOnlyCompleteNewLines) {
  const std::string dir = MakeTempDir("kappa_cli_tail");
  const std::string path = dir + "/metrics.jsonl";
  MetricsTail tail(path);
  EXPECT_TRUE(tail.ReadNew().empty());  // no file yet
  std::ofstream out(path);
  out << "{\"step\": 1}\n{\"step\": 2, \"rew" << std::flush;
  auto first = tail.ReadNew();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["step"], 1);
  out << "ard_mean\": 0.5}\nnot json\n\n{\"step\": 3}\n" << std::flush;
  auto second = tail.ReadNew();
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0]["step"], 2);
  EXPECT_DOUBLE_EQ(second[0]["reward_mean"].get<double>(), 0.5);
  EXPECT_EQ(second[1]["step"], 3);
  EXPECT_EQ(tail.skipped_lines(), 1);
  EXPECT_TRUE(tail.ReadNew().empty());
  std::filesystem::remove_all(dir);
}

TEST(RunProgressTest, TracksFirstAndLastEvalAndFormats) {
  RunProgress progress;
  progress.total_steps = 60;
  progress.Update({{"step", 10},
                   {"policy_version", 10},
                   {"reward_mean", 0.25},
                   {"loss_reward", 0.01},
                   {"loss_distill", 0.5},
                   {"samples_per_second", 40.0},
                   {"eval_accuracy", 0.3}});
  progress.Update({{"step", 11}, {"policy_version", 11}, {"reward_mean", 0.375}});
  progress.Update({{"step", 20}, {"policy_version", 20}, {"eval_accuracy", 0.55}});
  EXPECT_EQ(progress.step, 20);
  EXPECT_DOUBLE_EQ(*progress.first_eval_accuracy, 0.3);
  EXPECT_EQ(*progress.first_eval_step, 10);
  EXPECT_DOUBLE_EQ(*progress.last_eval_accuracy, 0.55);
  EXPECT_EQ(*progress.last_eval_step, 20);
  EXPECT_DOUBLE_EQ(*progress.reward_mean, 0.375);  // kept from step 11
  const std::string line = FormatProgressLine(progress, 65.0, 10);
  EXPECT_EQ(line,
            "step 20/60 [###-------] reward 0.375 | acc 0.550 | L_R 0.0100 | L_D 0.5000 | "
            "κ - | 40.0 samples/s | v20 | 01:05");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
}

TEST(RunProgressTest, AlarmsGetALineWhenTheyFireAndStayInTheBarWhileActive) {
  RunProgress progress;
  progress.total_steps = 60;
  progress.Update({{"step", 41},
                   {"kappa", 12.5},
                   {"alarm_active", {{"magnitude_drowning", 0}, {"collapse", 0}}}});
  EXPECT_TRUE(progress.TakeAlarmLines().empty());
  progress.Update(
      {{"step", 42},
       {"alarms",
        {{{"kind", "magnitude_drowning"}, {"step", 42}, {"message", "kappa_eff EMA 12.1 > 10"}}}},
       {"alarm_active", {{"magnitude_drowning", 1}, {"collapse", 0}}}});
  EXPECT_EQ(progress.TakeAlarmLines(),
            std::vector<std::string>{"step 42 ALARM magnitude_drowning: kappa_eff EMA 12.1 > 10"});
  EXPECT_TRUE(progress.TakeAlarmLines().empty());  // each alarm is shown once
  const std::string line = FormatProgressLine(progress, 5.0, 0);
  EXPECT_NE(line.find("| κ 12.5 |"), std::string::npos) << line;
  EXPECT_NE(line.find("| ALARM magnitude_drowning"), std::string::npos) << line;
  progress.Update({{"step", 43}, {"alarm_active", {{"magnitude_drowning", 0}, {"collapse", 0}}}});
  EXPECT_EQ(FormatProgressLine(progress, 5.0, 0).find("ALARM"), std::string::npos);
  EXPECT_EQ(progress.alarms_fired.at("magnitude_drowning"), 1);
  EXPECT_EQ(progress.first_alarm_step.at("magnitude_drowning"), 42);
}

TEST(BootstrapKeyTest, ChangesWithWhatDeterminesTheWeights) {
  services::Config config;
  const std::string teacher = BootstrapKey(config, learner::Role::kTeacher);
  const std::string student = BootstrapKey(config, learner::Role::kStudent);
  EXPECT_EQ(teacher.size(), 16u);
  EXPECT_NE(teacher, student);
  EXPECT_EQ(teacher, BootstrapKey(config, learner::Role::kTeacher));  // deterministic

  services::Config wider = config;
  wider.teacher.shape.hidden_size = 128;
  EXPECT_NE(BootstrapKey(wider, learner::Role::kTeacher), teacher);
  EXPECT_EQ(BootstrapKey(wider, learner::Role::kStudent), student);  // the student is unaffected

  services::Config more_data = config;
  more_data.task.train_size += 1;
  EXPECT_NE(BootstrapKey(more_data, learner::Role::kStudent), student);

  services::Config interleaved = config;
  interleaved.task.heldout_draw = services::HeldOutDraw::kInterleaved;  // another training split
  EXPECT_NE(BootstrapKey(interleaved, learner::Role::kStudent), student);

  services::Config longer_sft = config;
  longer_sft.student.bootstrap.steps += 1;
  EXPECT_NE(BootstrapKey(longer_sft, learner::Role::kStudent), student);

  services::Config to_a_target = config;
  to_a_target.student.bootstrap.target_accuracy = 0.4;
  const std::string target_key = BootstrapKey(to_a_target, learner::Role::kStudent);
  EXPECT_NE(target_key, student);
  services::Config checked_on_more = to_a_target;  // the checks read eval_examples prompts
  checked_on_more.trainer.eval_examples += 1;
  EXPECT_NE(BootstrapKey(checked_on_more, learner::Role::kStudent), target_key);
  services::Config checked_less_often = to_a_target;
  checked_less_often.student.bootstrap.check_every += 1;
  EXPECT_NE(BootstrapKey(checked_less_often, learner::Role::kStudent), target_key);

  // Settings that do not touch the SFT weights keep the cache.
  services::Config other_run = config;
  other_run.trainer.steps = 7;
  other_run.trainer.eval_examples += 1;  // without a target, only the evaluation
  other_run.workers = 5;
  other_run.name = "other";
  EXPECT_EQ(BootstrapKey(other_run, learner::Role::kTeacher), teacher);
  EXPECT_EQ(BootstrapDir(config, learner::Role::kTeacher), config.data_dir + "/teacher-" + teacher);
}

TEST(BootstrapTest, ConfiguredCheckpointMustExist) {
  services::Config config;
  config.student.checkpoint = "/nonexistent/student";
  std::ostringstream log;
  auto dir = EnsureBootstrapCheckpoint(config, learner::Role::kStudent, log);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("/nonexistent/student"), std::string::npos);
  EXPECT_NE(dir.status().message().find("student.checkpoint"), std::string::npos);
}

TEST(ServiceAddressTest, DefaultAndZeroPortsBecomePortZeroOnTheHostFixedOnesStay) {
  services::Config config;
  config.host = "127.0.0.1";
  config.verifier.address = "0.0.0.0:0";
  config.learner.address = "127.0.0.1:45678";  // fixed by the user
  ResolveListenAddresses(config);
  EXPECT_EQ(config.teacher.address, "127.0.0.1:0");  // was the built-in default
  EXPECT_EQ(config.verifier.address, "127.0.0.1:0");
  EXPECT_EQ(config.learner.address, "127.0.0.1:45678");
  EXPECT_EQ(PortOf("host"), -1);
  EXPECT_EQ(PortOf("h:12"), 12);
}

TEST(ServiceLaunchTest, PinnedSpecReplacesTheAddressesWithTheReportedOnes) {
  ProcessSpec spec;
  spec.name = "teacher";
  spec.argv = {"kappa-teacher", "--config",     "c.yaml", "--metrics-address",
               "127.0.0.1:0",   "--ready-file", "r.json", "--address=127.0.0.1:0"};
  const ProcessSpec pinned = PinnedSpec(spec, {7, "127.0.0.1:4001", "127.0.0.1:4002"});
  EXPECT_EQ(pinned.argv,
            (std::vector<std::string>{"kappa-teacher", "--config", "c.yaml", "--ready-file",
                                      "r.json", "--address", "127.0.0.1:4001", "--metrics-address",
                                      "127.0.0.1:4002"}));
  // A worker has no gRPC address to pin.
  spec.argv = {"kappa-rollout-worker", "--metrics-address", "127.0.0.1:0"};
  EXPECT_EQ(
      PinnedSpec(spec, {7, "", "127.0.0.1:4003"}).argv,
      (std::vector<std::string>{"kappa-rollout-worker", "--metrics-address", "127.0.0.1:4003"}));
}

TEST(ServiceLaunchTest, WorkerSpecAddsTheAddressesItConnectsTo) {
  ServiceProcess worker;
  worker.spec.argv = {"kappa-rollout-worker", "--worker-id", "rollout-0"};
  EXPECT_EQ(WorkerSpec(worker, "0.0.0.0:1", "127.0.0.1:2", "127.0.0.1:3").argv,
            (std::vector<std::string>{"kappa-rollout-worker", "--worker-id", "rollout-0",
                                      "--teacher", "127.0.0.1:1", "--verifier", "127.0.0.1:2",
                                      "--learner", "127.0.0.1:3"}));
}

TEST(RestartBudgetTest, StopsACrashLoopButNotProcessesThatRanAWhile) {
  RestartBudget budget;
  const RestartBudget::Clock::time_point start{};
  auto at = [&](int seconds) { return start + std::chrono::seconds(seconds); };
  // Killed every 70 s for 10 hours, each time after running longer than
  // kHealthyUptime: never a crash loop, however often.
  for (int i = 0; i < 500; ++i) {
    EXPECT_TRUE(budget.TryRestart("teacher", at(70 * i), at(70 * i + 61))) << i;
  }
  EXPECT_EQ(budget.total("teacher"), 500);
  // Dying 2 s after each start: restarted five times, the sixth refused.
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(budget.TryRestart("rollout-0", at(10 * i), at(10 * i + 2))) << i;
  }
  EXPECT_FALSE(budget.TryRestart("rollout-0", at(50), at(52)));
  // One run that lasts starts the count again. Other names are apart.
  RestartBudget again;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(again.TryRestart("verifier", at(10 * i), at(10 * i + 1)));
  EXPECT_TRUE(again.TryRestart("verifier", at(40), at(400)));
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(again.TryRestart("verifier", at(500 + 10 * i), at(501 + 10 * i))) << i;
  }
  EXPECT_TRUE(again.TryRestart("rollout-1", at(0), at(1)));
  EXPECT_EQ(again.total("verifier"), 10);
  EXPECT_EQ(again.total("rollout-0"), 0);
}

TEST(ServiceLaunchTest, MissingBinaryListsWhereItLooked) {
  auto path = FindServiceBinary("kappa-no-such-service");
  ASSERT_FALSE(path.ok());
  EXPECT_NE(path.status().message().find("kappa-no-such-service"), std::string::npos);
  EXPECT_NE(path.status().message().find(ExecutableDir()), std::string::npos);
}

TEST(RunDirTest, FreshRunMovesThePreviousOneAsideResumeKeepsIt) {
  const std::string root = MakeTempDir("kappa_cli_rundir");
  services::Config config;
  config.runs_dir = root;
  config.name = "exp";
  std::ostringstream log;
  auto dir = PrepareRunDir(config, /*resume=*/false, log);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(std::filesystem::is_directory(*dir + "/logs"));
  std::ofstream(*dir + "/metrics.jsonl") << "{\"step\": 1}\n";

  auto resumed = PrepareRunDir(config, /*resume=*/true, log);
  ASSERT_TRUE(resumed.ok());
  EXPECT_TRUE(std::filesystem::exists(*resumed + "/metrics.jsonl"));

  auto fresh = PrepareRunDir(config, /*resume=*/false, log);
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(std::filesystem::exists(*fresh + "/metrics.jsonl"));
  int archived = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (entry.path().filename().string().rfind("exp.", 0) == 0) {
      ++archived;
      EXPECT_TRUE(std::filesystem::exists(entry.path() / "metrics.jsonl"));
    }
  }
  EXPECT_EQ(archived, 1);
  EXPECT_NE(log.str().find("moved to"), std::string::npos);

  config.name = "../escape";
  EXPECT_FALSE(PrepareRunDir(config, false, log).ok());
  std::filesystem::remove_all(root);
}

TEST(RunDirTest, ResolvedConfigRoundTrips) {
  const std::string root = MakeTempDir("kappa_cli_config");
  services::Config config;
  config.trainer.steps = 17;
  config.teacher.address = "127.0.0.1:4242";
  const std::string path = root + "/config.yaml";
  ASSERT_TRUE(WriteResolvedConfig(config, path).ok());
  auto loaded = services::LoadConfig(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->trainer.steps, 17);
  EXPECT_EQ(loaded->teacher.address, "127.0.0.1:4242");
  std::filesystem::remove_all(root);
}

TEST(LogTailTest, KeepsTheLastLines) {
  const std::string root = MakeTempDir("kappa_cli_logtail");
  const std::string path = root + "/x.log";
  {
    std::ofstream out(path);
    for (int i = 0; i < 50; ++i) out << "line " << i << "\n";
  }
  const std::string tail = LogTail(path, 3);
  EXPECT_EQ(tail, "  | line 47\n  | line 48\n  | line 49\n");
  EXPECT_NE(LogTail(root + "/missing.log").find("cannot read"), std::string::npos);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kappa::cli
