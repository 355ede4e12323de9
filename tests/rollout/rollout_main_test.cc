// kappa-rollout-worker start-up and rollout.device: a device this machine
// lacks, or a name that is no device, stops the worker before it connects
// anywhere, with an error naming the key (exit 2); cpu starts it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/services/subprocess.h"

#ifndef KAPPA_ROLLOUT_WORKER_BINARY
#error "KAPPA_ROLLOUT_WORKER_BINARY must name the kappa-rollout-worker executable"
#endif

namespace {

using kappa::testing::ReadFile;
using kappa::testing::Spawn;
using kappa::testing::WaitExit;

// Nothing listens there: the worker only ever retries its connection.
constexpr const char* kNoLearner = "--learner=127.0.0.1:1";

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Outcome RunToExit(const std::string& arguments) {
  const std::string command =
      std::string(KAPPA_ROLLOUT_WORKER_BINARY) + " " + kNoLearner + " " + arguments + " 2>&1";
  Outcome outcome;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  size_t read = 0;
  while ((read = fread(buffer, 1, sizeof(buffer), pipe)) > 0) outcome.output.append(buffer, read);
  const int status = pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return outcome;
}

TEST(RolloutMainTest, CudaWithoutAGpuIsRefusedAtStartUpNamingTheKey) {
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  const Outcome outcome = RunToExit("rollout.device=cuda");
  EXPECT_EQ(outcome.exit_code, 2) << outcome.output;
  EXPECT_NE(outcome.output.find("rollout.device: 'cuda' asked for, but this libtorch sees 0 "
                                "CUDA device(s)"),
            std::string::npos)
      << outcome.output;
  const Outcome indexed = RunToExit("rollout.device=cuda:1");
  EXPECT_EQ(indexed.exit_code, 2) << indexed.output;
  EXPECT_NE(indexed.output.find("rollout.device: 'cuda:1' asked for"), std::string::npos)
      << indexed.output;
}

TEST(RolloutMainTest, ANameThatIsNoDeviceIsRefusedAtStartUp) {
  const Outcome outcome = RunToExit("rollout.device=gpu");
  EXPECT_EQ(outcome.exit_code, 2) << outcome.output;
  EXPECT_NE(outcome.output.find("rollout.device: 'gpu' is not cpu, cuda or cuda:N"),
            std::string::npos)
      << outcome.output;
  const Outcome no_index = RunToExit("rollout.device=cuda:x");
  EXPECT_EQ(no_index.exit_code, 2) << no_index.output;
  EXPECT_NE(no_index.output.find("rollout.device: 'cuda:x' has no device index"),
            std::string::npos)
      << no_index.output;
}

// The exit code tells a bad setting (2: fix the configuration) from a
// failure of the process's own start-up (1).
TEST(RolloutMainTest, ABadSettingExitsTwoAFailedStartUpOne) {
  const Outcome limit = RunToExit("security.max_message_bytes=0");
  EXPECT_EQ(limit.exit_code, 2) << limit.output;
  EXPECT_NE(limit.output.find("kappa-rollout-worker: INVALID_ARGUMENT: "
                              "security.max_message_bytes: expected 1.."),
            std::string::npos)
      << limit.output;
  const Outcome ready = RunToExit("--ready-file /nonexistent/kappa/ready.json");
  EXPECT_EQ(ready.exit_code, 1) << ready.output;
  EXPECT_NE(ready.output.find("/nonexistent/kappa/ready.json"), std::string::npos) << ready.output;
}

TEST(RolloutMainTest, CpuStartsAndStopsOnSigterm) {
  const std::string log =
      (std::filesystem::temp_directory_path() /
       ("kappa_rollout_main_" + std::to_string(getpid()) + ".log"))
          .string();
  std::filesystem::remove(log);
  const pid_t pid =
      Spawn({KAPPA_ROLLOUT_WORKER_BINARY, kNoLearner, "--log-file", log, "rollout.device=cpu"});
  ASSERT_GT(pid, 0);
  bool started = false;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!started && std::chrono::steady_clock::now() < give_up) {
    started = ReadFile(log).find("policy on cpu") != std::string::npos;
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!started) {
    kill(pid, SIGKILL);
    WaitExit(pid, std::chrono::seconds(10));
    FAIL() << "no start-up line; log:\n" << ReadFile(log);
  }
  // Still running (it waits for its learner), then stops cleanly.
  EXPECT_EQ(WaitExit(pid, std::chrono::milliseconds(200)), -1)
      << "exited early; log:\n" << ReadFile(log);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(pid, std::chrono::seconds(20)), 0) << ReadFile(log);
  std::filesystem::remove(log);
}

}  // namespace
