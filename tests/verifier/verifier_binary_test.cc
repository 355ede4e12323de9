// The kappa-verifier executable as an operator runs it.
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kappa/v1/verifier.grpc.pb.h"
#include "services/grpc_util.h"
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
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--allow-weak-sandbox"})), 2);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--code-cpu-seconds", "soon"})), 2);
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "security.max_message_bytes=0"})), 2);
}

// Runs the binary with `args` as uid/gid 65534 when this test is root (the
// binary itself when not), and returns its exit code.
int RunUnprivileged(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    if (geteuid() == 0 && (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
                           setresuid(65534, 65534, 65534) != 0)) {
      _exit(120);
    }
    execve(argv[0], argv.data(), environ);
    _exit(121);
  }
  return ExitCode(pid);
}

// Issue 45: code scoring is asked for by name, and refused loudly when it
// cannot have the sandbox it was promised.
TEST(VerifierBinaryTest, CodeScoringIsOptInByName) {
  const std::string log = ::testing::TempDir() + "/verifier_binary_test.code.log";
  std::remove(log.c_str());
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "verifier.reward=code", "--log-file", log})), 2);
  EXPECT_NE(ReadFile(log).find("verifier.reward: 'code' runs model-written code in the sandbox, "
                               "which is off; pass --enable-code"),
            std::string::npos)
      << ReadFile(log);
  std::remove(log.c_str());
  EXPECT_EQ(ExitCode(Spawn({KAPPA_VERIFIER_BINARY, "--code-enabled", "true", "--log-file", log})),
            2);
  EXPECT_NE(ReadFile(log).find("--code-enabled: removed; code scoring is off unless "
                               "--enable-code is given"),
            std::string::npos)
      << ReadFile(log);

  // Not root: no namespaces, no uid drop, no cgroups. Refused unless
  // --allow-weak-sandbox, which starts it with the warning.
  char dir[] = "/tmp/kappa_weak_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_EQ(chmod(dir, 0777), 0);
  const std::string weak_log = absl::StrCat(dir, "/weak.log");
  EXPECT_EQ(RunUnprivileged({KAPPA_VERIFIER_BINARY, "--enable-code", "--address", "127.0.0.1:0",
                             "--log-file", weak_log}),
            2);
  EXPECT_NE(ReadFile(weak_log).find("--enable-code: the code sandbox lacks full isolation"),
            std::string::npos)
      << ReadFile(weak_log);
  EXPECT_NE(ReadFile(weak_log).find("or pass --allow-weak-sandbox"), std::string::npos);
  EXPECT_EQ(ReadFile(weak_log).find("serving"), std::string::npos) << ReadFile(weak_log);
  std::remove(weak_log.c_str());
  rmdir(dir);
}

// Issue 45: on a server that does not authenticate its callers (loopback,
// plain text), a code item runs the tests of the --code-tasks file by
// example_id, and tests a caller sends are refused.
TEST(VerifierBinaryTest, CodeItemsRunTheTestsOfTheLoadedTaskFile) {
  const std::string tasks = ::testing::TempDir() + "/verifier_binary_test.tasks.jsonl";
  std::ofstream(tasks) << R"({"id": "add", "prompt": "Write add(a, b).", "answer": )"
                       << R"("assert add(2, 3) == 5\n", "task": "code"})"
                       << "\n"
                       << R"({"prompt": "1+1=", "answer": "2"})"
                       << "\n";
  const std::string ready = ::testing::TempDir() + "/verifier_binary_test.tasks.json";
  const std::string log = ::testing::TempDir() + "/verifier_binary_test.tasks.log";
  std::remove(ready.c_str());
  std::remove(log.c_str());
  // --allow-weak-sandbox: what is tested here is which tests run, wherever
  // this test runs (root or not).
  const pid_t pid =
      Spawn({KAPPA_VERIFIER_BINARY, "--enable-code", "--allow-weak-sandbox", "--code-tasks", tasks,
             "--address", "127.0.0.1:0", "--ready-file", ready, "--log-file", log});
  absl::StatusOr<kappa::services::ReadyInfo> info = absl::NotFoundError("");
  for (int i = 0; i < 200 && absl::IsNotFound(info.status()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    info = kappa::services::ReadReadyFile(ready);
  }
  ASSERT_TRUE(info.ok()) << info.status() << "\n" << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("code tasks: 1 from"), std::string::npos) << ReadFile(log);
  auto stub = kappa::v1::Verifier::NewStub(kappa::services::MakeChannel(info->address));
  auto verify = [&](const kappa::v1::VerifyRequest& request, kappa::v1::VerifyResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub->Verify(&context, request, response);
  };
  kappa::v1::VerifyRequest by_id;
  for (const char* solution :
       {"def add(a, b):\n    return a + b\n", "def add(a, b):\n    return 0\n",
        "def add(a, b):\n    return a - b\n"}) {
    kappa::v1::VerifyItem* item = by_id.add_items();
    item->set_task("code");
    item->set_example_id("add");
    item->set_response_text(solution);
  }
  kappa::v1::VerifyResponse rewards;
  const grpc::Status ok = verify(by_id, &rewards);
  ASSERT_TRUE(ok.ok()) << ok.error_message() << "\n" << ReadFile(log);
  EXPECT_EQ(std::vector<float>(rewards.rewards().begin(), rewards.rewards().end()),
            (std::vector<float>{1, 0, 0}));

  kappa::v1::VerifyRequest own_tests;
  kappa::v1::VerifyItem* item = own_tests.add_items();
  item->set_task("code");
  item->set_reference_answer("assert True\n");
  item->set_response_text("print('anything')\n");
  kappa::v1::VerifyResponse refused;
  const grpc::Status denied = verify(own_tests, &refused);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(denied.error_message().rfind("items[0].reference_answer: ", 0), 0u)
      << denied.error_message();
  EXPECT_EQ(refused.rewards_size(), 0);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(ExitCode(pid), 0);
}

}  // namespace
