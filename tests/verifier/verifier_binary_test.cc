// The kappa-verifier executable as an operator runs it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/ready_file.h"
#include "services/server.h"
#include "tests/services/http_get.h"
#include "tests/services/subprocess.h"

namespace {

using kappa::testing::ReadFile;
using kappa::testing::Spawn;

int ExitCode(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(VerifierBinaryTest, ServesUntilSigterm) {
  const std::string log = ::testing::TempDir() + "/verifier_binary_test.log";
  std::remove(log.c_str());
  const pid_t pid = Spawn({KAPPA_VERIFIER_BINARY, "verifier.max_items=16", "verifier.reward=math",
                           "--address", "127.0.0.1:0", "--log-file", log});
  // The picked port appears in the log once the server is up.
  int port = 0;
  const std::regex port_pattern(R"(\(port (\d+), plain text, max_items 16\))");
  for (int i = 0; i < 200 && port == 0; ++i) {
    std::smatch match;
    const std::string text = ReadFile(log);
    if (std::regex_search(text, match, port_pattern)) port = std::stoi(match[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(port, 0) << ReadFile(log);
  EXPECT_NE(
      ReadFile(log).find("every item is scored as task family 'math' (verifier.reward: math)"),
      std::string::npos)
      << ReadFile(log);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--health-check", address})), 0);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(ExitCode(pid), 0);
  EXPECT_NE(ReadFile(log).find("[verifier] [info] stopped"), std::string::npos) << ReadFile(log);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--health-check", address})), 1);
}

// What `kappa run` relies on: the process binds port 0 itself and reports
// both ports it got, so no other process can take them in between.
TEST(VerifierBinaryTest, ReportsTheAddressesItBoundInItsReadyFile) {
  const std::string ready = ::testing::TempDir() + "/verifier_binary_test.ready.json";
  std::remove(ready.c_str());
  const pid_t pid = Spawn({KAPPA_VERIFIER_BINARY, "--address", "127.0.0.1:0", "--metrics-address",
                           "127.0.0.1:0", "--ready-file", ready});
  absl::StatusOr<kappa::services::ReadyInfo> info = absl::NotFoundError("");
  for (int i = 0; i < 200 && absl::IsNotFound(info.status()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    info = kappa::services::ReadReadyFile(ready);
  }
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->pid, pid);
  ASSERT_EQ(info->address.rfind("127.0.0.1:", 0), 0u) << info->address;
  EXPECT_NE(info->address, "127.0.0.1:0");
  EXPECT_NE(info->metrics_address, "127.0.0.1:0");
  EXPECT_NE(info->metrics_address, info->address);
  // Both answer as soon as the file exists.
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--health-check", info->address})), 0);
  EXPECT_EQ(kappa::testing::HttpGet(info->metrics_address, "/metrics").status, 200);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(ExitCode(pid), 0);
}

// Issue 45: on an address other machines reach, with neither mutual TLS
// nor a token, the verifier does not start, naming the way out; with
// security.allow_insecure it starts and says it is open.
TEST(VerifierBinaryTest, AnOpenAddressWithoutClientAuthenticationNeedsAllowInsecure) {
  const std::string log = ::testing::TempDir() + "/verifier_binary_test.open.log";
  std::remove(log.c_str());
  const int refused =
      ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--address", "0.0.0.0:0", "--log-file", log}));
  EXPECT_NE(refused, 0);
  EXPECT_NE(ReadFile(log).find("refusing to listen on 0.0.0.0:0 without client authentication"),
            std::string::npos)
      << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("security.allow_insecure: true"), std::string::npos);

  const std::string ready = ::testing::TempDir() + "/verifier_binary_test.open.json";
  std::remove(ready.c_str());
  std::remove(log.c_str());
  const pid_t pid = Spawn({KAPPA_VERIFIER_BINARY, "security.allow_insecure=true", "--address",
                           "0.0.0.0:0", "--ready-file", ready, "--log-file", log});
  absl::StatusOr<kappa::services::ReadyInfo> info = absl::NotFoundError("");
  for (int i = 0; i < 200 && absl::IsNotFound(info.status()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    info = kappa::services::ReadReadyFile(ready);
  }
  ASSERT_TRUE(info.ok()) << info.status() << "\n" << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("WITHOUT client authentication (security.allow_insecure)"),
            std::string::npos)
      << ReadFile(log);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(ExitCode(pid), 0);
}

TEST(VerifierBinaryTest, BadArgumentsExitWithUsageError) {
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--bogus"})), 2);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "trainer.stepz=1"})), 2);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--config", "/nonexistent.yaml"})), 2);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "verifier.reward=maths"})), 2);
  EXPECT_EQ(
      ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "verifier.reward=code", "--code-enabled", "false"})),
      2);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--code-cpu-seconds", "soon"})), 2);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "security.max_message_bytes=0"})), 2);
}

}  // namespace
