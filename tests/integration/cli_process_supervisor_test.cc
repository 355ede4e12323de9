#include "cli/process_supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace kappa::cli {
namespace {

using std::chrono::milliseconds;

std::string TempDir() {
  char templ[] = "/tmp/kappa_supervisor_test_XXXXXX";
  const char* dir = mkdtemp(templ);
  EXPECT_NE(dir, nullptr);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A killed grandchild is reparented to init; where init does not reap (some
// containers), it lingers as a zombie, which still counts as terminated.
bool IsZombie(pid_t pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

ProcessSpec Shell(const std::string& name, const std::string& script) {
  return ProcessSpec{name, {"/bin/sh", "-c", script}, {}, "", true};
}

TEST(ProcessSupervisorTest, ReportsExitCodes) {
  ProcessSupervisor supervisor;
  auto ok = supervisor.Spawn(Shell("ok", "exit 0"));
  auto bad = supervisor.Spawn(Shell("bad", "exit 3"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE(bad.ok()) << bad.status();
  auto ok_status = supervisor.WaitFor(*ok, milliseconds(5000));
  auto bad_status = supervisor.WaitFor(*bad, milliseconds(5000));
  ASSERT_TRUE(ok_status.has_value());
  ASSERT_TRUE(bad_status.has_value());
  EXPECT_TRUE(ok_status->success());
  EXPECT_FALSE(bad_status->success());
  EXPECT_EQ(bad_status->exit_code, 3);
  EXPECT_EQ(bad_status->ToString(), "exited with status 3");
  EXPECT_EQ(supervisor.running_count(), 0u);
}

TEST(ProcessSupervisorTest, PollReturnsEachExitOnce) {
  ProcessSupervisor supervisor;
  ASSERT_TRUE(supervisor.Spawn(Shell("quick", "exit 7")).ok());
  auto slow = supervisor.Spawn({"slow", {"/bin/sleep", "30"}, {}, "", true});
  ASSERT_TRUE(slow.ok());
  std::vector<ExitEvent> events;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (events.empty() && std::chrono::steady_clock::now() < deadline) {
    events = supervisor.Poll();
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "quick");
  EXPECT_EQ(events[0].status.exit_code, 7);
  EXPECT_TRUE(supervisor.Poll().empty());
  EXPECT_TRUE(supervisor.IsRunning(*slow));
  EXPECT_EQ(supervisor.RunningNames(), std::vector<std::string>{"slow"});
}

TEST(ProcessSupervisorTest, StopAllTerminatesSleepQuickly) {
  ProcessSupervisor supervisor;
  auto pid = supervisor.Spawn({"sleeper", {"/bin/sleep", "30"}, {}, "", true});
  ASSERT_TRUE(pid.ok()) << pid.status();
  const auto start = std::chrono::steady_clock::now();
  std::vector<ExitEvent> events = supervisor.StopAll(milliseconds(5000));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "sleeper");
  EXPECT_EQ(events[0].status.signal, SIGTERM);
  EXPECT_LT(took, std::chrono::seconds(2));
  EXPECT_EQ(supervisor.running_count(), 0u);
}

TEST(ProcessSupervisorTest, ChildIgnoringSigtermIsKilledAfterGrace) {
  ProcessSupervisor supervisor;
  // `exec sleep` keeps the ignored disposition, so SIGTERM does nothing.
  auto pid = supervisor.Spawn(Shell("stubborn", "trap '' TERM; exec /bin/sleep 30"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::this_thread::sleep_for(milliseconds(200));  // let the trap install
  const auto start = std::chrono::steady_clock::now();
  std::vector<ExitEvent> events = supervisor.StopAll(milliseconds(500));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].status.signal, SIGKILL);
  EXPECT_GE(took, milliseconds(450));
  EXPECT_LT(took, std::chrono::seconds(3));
}

TEST(ProcessSupervisorTest, SignalReachesTheWholeProcessGroup) {
  const std::string dir = TempDir();
  const std::string pid_file = dir + "/grandchild.pid";
  ProcessSupervisor supervisor;
  // The shell stays in the foreground waiting on a grandchild in its group.
  auto pid = supervisor.Spawn(
      Shell("parent", "/bin/sleep 30 & echo $! > " + pid_file + "; wait"));
  ASSERT_TRUE(pid.ok());
  pid_t grandchild = 0;
  for (int i = 0; i < 200 && grandchild == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    std::ifstream in(pid_file);
    in >> grandchild;
  }
  ASSERT_GT(grandchild, 0);
  EXPECT_EQ(getpgid(grandchild), *pid);
  supervisor.StopAll(milliseconds(2000));
  // The grandchild was in the group, so it got SIGTERM too (it is not our
  // child, so poll for it disappearing rather than reaping it).
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = kill(grandchild, 0) != 0 || IsZombie(grandchild);
    if (!gone) std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(gone);
  std::filesystem::remove_all(dir);
}

TEST(ProcessSupervisorTest, RedirectsStdoutAndStderrToLogAndSetsEnv) {
  const std::string dir = TempDir();
  const std::string log = dir + "/child.log";
  ProcessSupervisor supervisor;
  ProcessSpec spec = Shell("logger", "echo out-$KAPPA_TEST_VAR; echo err-line >&2; exit 0");
  spec.env = {"KAPPA_TEST_VAR=forty-two"};
  spec.log_file = log;
  auto pid = supervisor.Spawn(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto status = supervisor.WaitFor(*pid, milliseconds(5000));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->success());
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("out-forty-two"), std::string::npos) << text;
  EXPECT_NE(text.find("err-line"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

TEST(ProcessSupervisorTest, SpawnFailsForMissingExecutableAndBadLogPath) {
  ProcessSupervisor supervisor;
  auto missing = supervisor.Spawn({"ghost", {"/nonexistent/kappa-ghost"}, {}, "", true});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("ghost"), std::string::npos);
  EXPECT_NE(missing.status().message().find("/nonexistent/kappa-ghost"), std::string::npos);
  auto bad_log = supervisor.Spawn({"nolog", {"/bin/true"}, {}, "/nonexistent/dir/x.log", true});
  ASSERT_FALSE(bad_log.ok());
  EXPECT_NE(bad_log.status().message().find("/nonexistent/dir/x.log"), std::string::npos);
  EXPECT_EQ(supervisor.running_count(), 0u);
}

TEST(ProcessSupervisorTest, DestructorKillsRunningChildren) {
  pid_t pid = 0;
  {
    ProcessSupervisor supervisor;
    auto spawned = supervisor.Spawn(Shell("stubborn", "trap '' TERM; exec /bin/sleep 30"));
    ASSERT_TRUE(spawned.ok());
    pid = *spawned;
  }
  // Reaped by the destructor: no such process any more.
  EXPECT_NE(kill(pid, 0), 0);
}

}  // namespace
}  // namespace kappa::cli
