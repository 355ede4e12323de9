// Fault: a rollout worker is killed with SIGKILL in the middle of a real
// `kappa run` (learner, teacher, verifier, three workers on loopback). The
// run must still finish every step, `kappa run` restarts the worker, the
// restarted worker rejoins and works until the end, and no group is trained
// on twice (the dead worker's leases are re-issued, never double-counted).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/process_supervisor.h"
#include "tests/integration/run_files.h"
#include "tests/integration/tiny_run_config.h"

namespace {

namespace fs = std::filesystem;
using kappa::testing::CountTrainedSteps;
using kappa::testing::FindProcess;
using kappa::testing::ReadAll;

TEST(FaultTest, KilledRolloutWorkerIsRestartedAndNothingIsLostOrDoubled) {
  const fs::path root = fs::temp_directory_path() / ("kappa-fault-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  constexpr int kSteps = 40;
  const fs::path config = root / "fault.yaml";
  std::ofstream(config) << kappa::testing::TinyRunConfig(
      "fault", root.string(), 3,
      "{steps: " + std::to_string(kSteps) +
          ", groups_per_step: 3, group_size: 4, eval_every: 0, eval_examples: 10,\n"
          "          checkpoint_every: 0}");

  kappa::cli::ProcessSupervisor supervisor;
  kappa::cli::ProcessSpec run;
  run.name = "kappa-run";
  run.argv = {KAPPA_CLI, "run", config.string(), "--no-progress"};
  run.log_file = (root / "kappa.out").string();
  auto run_pid = supervisor.Spawn(run);
  ASSERT_TRUE(run_pid.ok()) << run_pid.status();

  // Kill rollout-1 once training is under way.
  const fs::path run_dir = root / "runs" / "fault";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (CountTrainedSteps(run_dir / "metrics.jsonl") < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(CountTrainedSteps(run_dir / "metrics.jsonl"), 3) << ReadAll(root / "kappa.out");
  // This run's rollout-1 (other tests may run workers of that name too).
  const pid_t victim = FindProcess((run_dir / "config.yaml").string() + " --worker-id rollout-1");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  std::optional<kappa::cli::ExitStatus> exit =
      supervisor.WaitFor(*run_pid, std::chrono::seconds(180));
  ASSERT_TRUE(exit.has_value()) << "kappa run did not finish\n" << ReadAll(root / "kappa.out");
  const std::string out = ReadAll(root / "kappa.out");
  EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << out;
  EXPECT_NE(out.find("rollout-1 killed by signal 9"), std::string::npos) << out;
  EXPECT_NE(out.find("restarting it (restart 1; a crash loop"), std::string::npos) << out;
  EXPECT_NE(out.find("processes restarted after dying: 1"), std::string::npos) << out;

  // Every step trained, each group exactly once.
  const kappa::testing::TrainedGroups trained =
      kappa::testing::ReadTrainedGroups(run_dir / "metrics.jsonl");
  EXPECT_TRUE(trained.repeated.empty()) << "leases trained twice: " << trained.repeated.size();
  EXPECT_EQ(trained.steps, kSteps);
  EXPECT_EQ(trained.leases.size(), static_cast<size_t>(3 * kSteps));
  // The restarted worker served until the end (its clean-shutdown line).
  EXPECT_NE(ReadAll(run_dir / "logs" / "rollout-1.log").find("rollout worker rollout-1 stopped"),
            std::string::npos);
  fs::remove_all(root);
}

}  // namespace
