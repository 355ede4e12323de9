// The code sandbox against hostile and ordinary solutions, with real child
// processes (small limits keep the file fast: 2 s CPU, 5 s wall, 256 MiB).
// The isolation assertions need root (namespaces, uid drop); without it they
// are skipped with the reason, the rest still runs.
#include "verifier/sandbox.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tasks/answer.h"
#include "verifier/code_reward.h"

namespace kappa::verifier {
namespace {

using Outcome = SandboxResult::Outcome;

CodeOptions SmallLimits() {
  CodeOptions options;
  options.enabled = true;
  options.allow_weak_sandbox = true;  // not root: the rest still runs, isolation cases skip
  options.max_concurrent = 2;
  options.sandbox.cpu_seconds = 2;
  options.sandbox.wall_timeout = absl::Seconds(5);
  options.sandbox.address_space_bytes = int64_t{256} << 20;
  return options;
}

// Processes whose real uid is `uid`, from /proc.
int ProcessesOfUid(uid_t uid) {
  int count = 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return -1;
  while (dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::ifstream status(absl::StrCat("/proc/", entry->d_name, "/status"));
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) == 0) {
        if (std::strtoul(line.c_str() + 4, nullptr, 10) == uid) ++count;
        break;
      }
    }
  }
  closedir(proc);
  return count;
}

class SandboxTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // In the verifier's environment, where no solution may read it.
    setenv("KAPPA_SECRET", "hunter2-kappa", 1);
    rewarder_ = new CodeRewarder(SmallLimits(), nullptr);
  }
  static void TearDownTestSuite() {
    delete rewarder_;
    rewarder_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(rewarder_->available().ok()) << rewarder_->available(); }

  static SandboxResult Run(const std::string& tests, const std::string& response) {
    SandboxResult result = rewarder_->Run(tests, response);
    std::cerr << "  " << result.Summary() << "\n";
    return result;
  }

  static CodeRewarder* rewarder_;
};
CodeRewarder* SandboxTest::rewarder_ = nullptr;

const char kAddTests[] = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n";

TEST_F(SandboxTest, CorrectSolutionPasses) {
  const SandboxResult result = Run(kAddTests, "def add(a, b):\n    return a + b\n");
  EXPECT_EQ(result.outcome, Outcome::kPass) << result.stderr_tail;
  EXPECT_EQ(result.reward(), 1.0f);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_TRUE(result.completed);
}

TEST_F(SandboxTest, FencedSolutionIsExtractedFromTheResponse) {
  const SandboxResult result =
      Run(kAddTests,
          "Here is my solution:\n```python\ndef add(a, b):\n    return a + b\n```\nIt adds.");
  EXPECT_EQ(result.outcome, Outcome::kPass) << result.stderr_tail;
}

TEST_F(SandboxTest, WrongSolutionFails) {
  const SandboxResult result = Run(kAddTests, "def add(a, b):\n    return a - b\n");
  EXPECT_EQ(result.outcome, Outcome::kFail);
  EXPECT_EQ(result.reward(), 0.0f);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.stderr_tail.find("AssertionError"), std::string::npos) << result.stderr_tail;
}

TEST_F(SandboxTest, SyntaxErrorFails) {
  const SandboxResult result = Run(kAddTests, "def add(a, b)\n    return a + b\n");
  EXPECT_EQ(result.outcome, Outcome::kFail);
  EXPECT_EQ(result.reward(), 0.0f);
  EXPECT_NE(result.stderr_tail.find("SyntaxError"), std::string::npos) << result.stderr_tail;
}

TEST_F(SandboxTest, ExitingBeforeTheTestsDoesNotPass) {
  for (const char* solution : {"import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n",
                               "def add(a, b):\n    return a + b\n"
                               "if __name__ == '__main__':\n    raise SystemExit(0)\n"
                               "import sys\nsys.exit(0)\n"}) {
    const SandboxResult result = Run(kAddTests, solution);
    EXPECT_EQ(result.reward(), 0.0f) << solution;
    EXPECT_FALSE(result.completed) << solution;
  }
  // The harness does not run the solution as __main__, so a demo block
  // behind the guard is not executed and the tests decide.
  const SandboxResult guarded =
      Run(kAddTests, "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n"
                     "    print(add(int(input()), 1))\n");
  EXPECT_EQ(guarded.outcome, Outcome::kPass) << guarded.stderr_tail;
}

TEST_F(SandboxTest, InfiniteLoopIsStopped) {
  const auto start = std::chrono::steady_clock::now();
  const SandboxResult result = Run(kAddTests, "while True:\n    pass\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.reward(), 0.0f);
  // RLIMIT_CPU (2 s) fires before the 5 s wall clock: SIGKILL (pid 1 of a
  // namespace ignores SIGXCPU; outside one the kernel's SIGXCPU kills).
  EXPECT_EQ(result.outcome, Outcome::kKilled) << result.Summary();
  EXPECT_TRUE(result.signal == SIGKILL || result.signal == SIGXCPU) << result.signal;
  EXPECT_LT(seconds, 5.0);
}

TEST_F(SandboxTest, SleepingPastTheWallClockTimesOut) {
  CodeOptions options = SmallLimits();
  options.sandbox.wall_timeout = absl::Milliseconds(1500);
  CodeRewarder short_wall(options, nullptr);
  const auto start = std::chrono::steady_clock::now();
  const SandboxResult result = short_wall.Run(kAddTests, "import time\ntime.sleep(600)\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.outcome, Outcome::kTimeout) << result.Summary();
  EXPECT_TRUE(result.timed_out);
  EXPECT_EQ(result.reward(), 0.0f);
  EXPECT_LT(seconds, 3.5);
}

TEST_F(SandboxTest, ForkBombIsContainedAndLeavesNothingBehind) {
  if (!rewarder_->isolation().drop_privileges) {
    GTEST_SKIP() << "RLIMIT_NPROC counts per uid: needs root to drop to uid 65534";
  }
  const int before = ProcessesOfUid(65534);
  const SandboxResult result = Run(kAddTests,
                                   "import os\n"
                                   "while True:\n"
                                   "    try:\n"
                                   "        os.fork()\n"
                                   "    except OSError:\n"
                                   "        pass\n");
  EXPECT_EQ(result.reward(), 0.0f);
  EXPECT_NE(result.outcome, Outcome::kError) << result.Summary();
  EXPECT_NE(result.outcome, Outcome::kPass);
  // Every forked process died with the run (pid namespace + group kill).
  EXPECT_LE(ProcessesOfUid(65534), before);
  // And the sandbox still works.
  EXPECT_EQ(Run(kAddTests, "def add(a, b):\n    return a + b\n").outcome, Outcome::kPass);
}

TEST_F(SandboxTest, EscapingTheProcessGroupDoesNotOutliveTheRun) {
  if (!rewarder_->isolation().pid_namespace || !rewarder_->isolation().drop_privileges) {
    GTEST_SKIP() << "needs root: a pid namespace";
  }
  const int before = ProcessesOfUid(65534);
  // A child in a session of its own, sleeping: no group kill reaches it.
  const SandboxResult result = Run(kAddTests,
                                   "import os, time\n"
                                   "if os.fork() == 0:\n"
                                   "    os.setsid()\n"
                                   "    time.sleep(600)\n"
                                   "    os._exit(0)\n");
  EXPECT_EQ(result.reward(), 0.0f);  // add is undefined
  EXPECT_LE(ProcessesOfUid(65534), before);
}

TEST_F(SandboxTest, TenGigabyteAllocationFails) {
  const SandboxResult result = Run(kAddTests,
                                   "block = bytearray(10 * 1024 ** 3)\n"
                                   "def add(a, b):\n    return a + b\n");
  EXPECT_EQ(result.reward(), 0.0f);
  EXPECT_EQ(result.outcome, Outcome::kFail) << result.Summary();
  EXPECT_NE(result.stderr_tail.find("MemoryError"), std::string::npos) << result.stderr_tail;
}

TEST_F(SandboxTest, WritesStayInsideTheWorkDir) {
  if (!rewarder_->isolation().mount_namespace) {
    GTEST_SKIP() << "needs root: a mount namespace (as root without one, /tmp is writable)";
  }
  const std::string pid = std::to_string(getpid());
  const std::vector<std::string> outside = {"/tmp/kappa_escape_" + pid,
                                            "/var/tmp/kappa_escape_" + pid,
                                            "/dev/shm/kappa_escape_" + pid};
  for (const std::string& path : outside) std::remove(path.c_str());
  // Every write outside fails; a write inside works. The tests check both,
  // so reward 1 means "contained", and the files are checked from here too.
  std::string solution =
      "import os\n"
      "ESCAPED = []\n"
      "for path in PATHS:\n"
      "    try:\n"
      "        with open(path, 'w') as f:\n"
      "            f.write('x')\n"
      "        ESCAPED.append(path)\n"
      "    except OSError:\n"
      "        pass\n"
      "with open('inside.txt', 'w') as f:\n"
      "    f.write('ok')\n";
  std::string paths = "PATHS = [";
  for (const std::string& path : outside) absl::StrAppend(&paths, "'", path, "', ");
  solution = absl::StrCat(paths, "]\n", solution);
  const SandboxResult result =
      Run("assert ESCAPED == [], ESCAPED\nassert open('inside.txt').read() == 'ok'\n", solution);
  EXPECT_EQ(result.outcome, Outcome::kPass) << result.stderr_tail;
  for (const std::string& path : outside) {
    EXPECT_NE(access(path.c_str(), F_OK), 0) << path << " exists";
    std::remove(path.c_str());
  }
}

TEST_F(SandboxTest, LargeFilesHitTheFileSizeLimit) {
  // RLIMIT_FSIZE is 16 MiB: the write fails with EFBIG (as pid 1 of its
  // namespace the program ignores SIGXFSZ; outside one SIGXFSZ kills it).
  const SandboxResult result = Run(kAddTests,
                                   "with open('big.bin', 'wb') as f:\n"
                                   "    f.write(b'x' * (32 * 1024 * 1024))\n"
                                   "def add(a, b):\n    return a + b\n");
  EXPECT_EQ(result.reward(), 0.0f);
  if (result.outcome == Outcome::kKilled) {
    EXPECT_EQ(result.signal, SIGXFSZ);
  } else {
    EXPECT_EQ(result.outcome, Outcome::kFail) << result.Summary();
    EXPECT_NE(result.stderr_tail.find("File too large"), std::string::npos) << result.stderr_tail;
  }
}

TEST_F(SandboxTest, NoNetworkEvenToLoopback) {
  if (!rewarder_->isolation().network_namespace) {
    GTEST_SKIP() << "needs root: a network namespace";
  }
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);

  const std::string solution = absl::StrCat(
      "import socket\n"
      "try:\n"
      "    socket.create_connection(('127.0.0.1', ", port, "), timeout=2).close()\n"
      "    CONNECTED = True\n"
      "except OSError as e:\n"
      "    print('connect failed:', e)\n"
      "    CONNECTED = False\n");
  const SandboxResult result = Run("assert not CONNECTED\n", solution);
  EXPECT_EQ(result.outcome, Outcome::kPass) << result.stdout_tail << result.stderr_tail;
  // Nothing reached the listener either.
  EXPECT_LT(accept(listener, nullptr, nullptr), 0);
  close(listener);
}

// Issue 45: a socket bound to a path is outside every namespace the sandbox
// has; a world-writable one (a docker.sock, an agent's socket under /run)
// would let the code talk to whatever listens there.
TEST_F(SandboxTest, NoUnixSocketEvenAWorldWritableOne) {
  if (!rewarder_->isolation().unix_socket_filter) {
    GTEST_SKIP() << "needs seccomp (x86-64 or aarch64, PR_SET_NO_NEW_PRIVS): "
                 << rewarder_->isolation().ToString();
  }
  for (const std::string dir : {"/tmp", "/run"}) {
    const std::string path = absl::StrCat(dir, "/kappa_unix_", getpid(), ".sock");
    std::remove(path.c_str());
    const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(listener, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
    if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(listener);
      continue;  // no such directory here
    }
    ASSERT_EQ(chmod(path.c_str(), 0777), 0);
    ASSERT_EQ(listen(listener, 4), 0);
    const std::string solution = absl::StrCat(
        "import socket\n"
        "try:\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.settimeout(2)\n"
        "    s.connect('",
        path,
        "')\n"
        "    CONNECTED = True\n"
        "except OSError as e:\n"
        "    print('connect failed:', e)\n"
        "    CONNECTED = False\n");
    const SandboxResult result = Run("assert not CONNECTED\n", solution);
    EXPECT_EQ(result.outcome, Outcome::kPass) << path << result.stdout_tail << result.stderr_tail;
    EXPECT_NE(result.stdout_tail.find("connect failed"), std::string::npos) << result.stdout_tail;
    EXPECT_LT(accept(listener, nullptr, nullptr), 0) << "something connected to " << path;
    close(listener);
    std::remove(path.c_str());
  }
}

// Issue 45: RLIMIT_AS bounds one process; N processes each under it must
// still not get N times the memory. The run's cgroup bounds them together.
TEST_F(SandboxTest, ForkAndAllocateIsBoundedPerRun) {
  if (rewarder_->isolation().cgroups.version == 0) {
    GTEST_SKIP() << "needs a writable cgroup (v2, or v1 memory) for per-run memory: "
                 << rewarder_->isolation().cgroups.missing;
  }
  CodeOptions options = SmallLimits();
  options.sandbox.run_memory_bytes = int64_t{256} << 20;  // the run: 256 MiB in all
  CodeRewarder bounded(options, nullptr);
  ASSERT_TRUE(bounded.available().ok()) << bounded.available();
  // Each child takes 120 MiB (touched: b'x' * n writes every page), under
  // its own 256 MiB RLIMIT_AS, and holds it while its siblings do the same;
  // the tests pass only if every child exited 0.
  auto solution = [](int children) {
    return absl::StrCat(
        "import os, time\n"
        "pids = []\n"
        "for _ in range(",
        children,
        "):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = b'x' * (120 * 1024 * 1024)\n"
        "        time.sleep(1.0)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "CODES = [os.waitpid(pid, 0)[1] for pid in pids]\n");
  };
  const char kTests[] = "assert CODES and all(code == 0 for code in CODES), CODES\n";
  // One child fits: the limit is per run, not too small for one.
  const SandboxResult one = bounded.Run(kTests, solution(1));
  EXPECT_EQ(one.outcome, Outcome::kPass) << one.Summary() << one.stderr_tail;
  // Four (480 MiB together) do not: the run fails or is killed.
  const SandboxResult four = bounded.Run(kTests, solution(4));
  std::cerr << "  " << four.Summary() << "\n";
  EXPECT_EQ(four.reward(), 0.0f) << four.Summary();
  EXPECT_NE(four.outcome, Outcome::kPass);
  EXPECT_NE(four.outcome, Outcome::kError) << four.Summary();
  EXPECT_TRUE(four.oom_killed) << four.Summary() << four.stderr_tail;
}

TEST_F(SandboxTest, EnvironmentIsCleanAndTheVerifiersIsUnreadable) {
  ASSERT_STREQ(std::getenv("KAPPA_SECRET"), "hunter2-kappa");
  // The solution collects everything it can see; the tests assert the secret
  // is not in it (so reward 1 means "not leaked"), and print it for us.
  const std::string solution = absl::StrCat(
      "import os\n"
      "SEEN = dict(os.environ)\n"
      "LEAKS = [k for k, v in SEEN.items() if 'hunter2' in v or k == 'KAPPA_SECRET']\n"
      "for path in ['/proc/", getpid(), "/environ', '/proc/1/environ', '/proc/self/environ']:\n"
      "    try:\n"
      "        with open(path, 'rb') as f:\n"
      "            if b'hunter2' in f.read():\n"
      "                LEAKS.append(path)\n"
      "    except OSError:\n"
      "        pass\n"
      "print(sorted(SEEN))\n");
  const SandboxResult result =
      Run("assert LEAKS == [], LEAKS\nassert set(SEEN) <= {'PATH', 'LANG'}, SEEN\n", solution);
  EXPECT_EQ(result.outcome, Outcome::kPass) << result.stderr_tail;
  EXPECT_EQ(result.stdout_tail.find("KAPPA_SECRET"), std::string::npos) << result.stdout_tail;
  EXPECT_NE(result.stdout_tail.find("'PATH'"), std::string::npos) << result.stdout_tail;
}

TEST_F(SandboxTest, OnlyTheStandardFdsAreOpen) {
  // 0 /dev/null, 1 and 2 the output pipes, 3 the completion fd: nothing of
  // the verifier's (its listening sockets, other runs' pipes).
  const SandboxResult result = Run("assert FDS == [0, 1, 2, 3], FDS\n",
                                   "import os\n"
                                   "FDS = []\n"
                                   "for fd in range(1024):\n"
                                   "    try:\n"
                                   "        os.fstat(fd)\n"
                                   "        FDS.append(fd)\n"
                                   "    except OSError:\n"
                                   "        pass\n");
  EXPECT_EQ(result.outcome, Outcome::kPass) << result.stderr_tail;
}

TEST_F(SandboxTest, OutputIsKeptToItsTail) {
  const SandboxResult result = Run("pass\n", "print('y' * (1 << 20))\nprint('THE END')\n");
  EXPECT_EQ(result.outcome, Outcome::kPass) << result.stderr_tail;
  EXPECT_LE(result.stdout_tail.size(), 64u * 1024);
  EXPECT_NE(result.stdout_tail.find("THE END"), std::string::npos);
}

TEST_F(SandboxTest, ConcurrentRunsAreBoundedBySlots) {
  // Capacity 2: four 0.5 s sleeps take at least two rounds.
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::vector<Outcome> outcomes(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      outcomes[i] = rewarder_->Run("pass\n", "import time\ntime.sleep(0.5)\n").outcome;
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (Outcome outcome : outcomes) EXPECT_EQ(outcome, Outcome::kPass);
  EXPECT_GE(seconds, 1.0);
}

TEST(SandboxIsolationTest, RootGetsEverything) {
  const SandboxIsolation isolation = ProbeSandboxIsolation();
  std::cerr << "  " << isolation.ToString() << "\n";
  if (geteuid() != 0) {
    EXPECT_FALSE(isolation.network_namespace || isolation.drop_privileges);
    GTEST_SKIP() << "not root: no isolation features, as documented";
  }
  EXPECT_TRUE(isolation.full()) << isolation.ToString();
}

TEST(SandboxRunTest, RejectsBadFileNamesAndReportsSetupErrors) {
  SandboxOptions options;
  EXPECT_EQ(RunSandboxed({{"../x.py", ""}}, "x.py", options, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunSandboxed({{"x.py", ""}}, "a/x.py", options, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A missing interpreter is the sandbox's failure (kError), not the code's.
  options.python = "/nonexistent/python3";
  absl::StatusOr<SandboxResult> result =
      RunSandboxed({{"x.py", "pass\n"}}, "x.py", options, ProbeSandboxIsolation());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->outcome, Outcome::kError);
  EXPECT_NE(result->error.find("execve"), std::string::npos) << result->error;
  // A rewarder with that interpreter refuses to score rather than give zeros.
  CodeOptions code = SmallLimits();
  code.sandbox.python = "/nonexistent/python3";
  CodeRewarder broken(code, nullptr);
  EXPECT_EQ(broken.available().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SandboxRunTest, AWeakSandboxIsUnavailableUnlessAllowed) {
  CodeOptions code = SmallLimits();
  code.allow_weak_sandbox = false;
  CodeRewarder rewarder(code, nullptr);
  if (rewarder.isolation().full()) {  // root with cgroups: nothing weak to refuse
    EXPECT_TRUE(rewarder.available().ok()) << rewarder.available();
    return;
  }
  EXPECT_EQ(rewarder.available().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(rewarder.available().message().find("--allow-weak-sandbox"), std::string::npos)
      << rewarder.available();
}

TEST(ExtractPythonCodeTest, FencesAndFallbacks) {
  using tasks::ExtractPythonCode;
  EXPECT_EQ(ExtractPythonCode("x = 1\n"), "x = 1\n");
  EXPECT_EQ(ExtractPythonCode("text\n```python\nx = 1\n```\nmore"), "x = 1\n");
  EXPECT_EQ(ExtractPythonCode("```Python3\nx = 1\n"), "x = 1\n");  // unclosed
  EXPECT_EQ(ExtractPythonCode("```py\r\nx = 1\r\n```"), "x = 1\r\n");
  EXPECT_EQ(ExtractPythonCode("```bash\nls\n```\n```python\ny = 2\n```\n```python\nz\n```"),
            "y = 2\n");
  // A fence not at the start of a line is prose.
  EXPECT_EQ(ExtractPythonCode("see ```python x``` here"), "see ```python x``` here");
  EXPECT_TRUE(tasks::IsCodeTask("code"));
  EXPECT_FALSE(tasks::IsCodeTask("arithmetic"));
}

}  // namespace
}  // namespace kappa::verifier
