// "code" items through the real gRPC VerifierService on loopback: hostile
// solutions end with reward 0, good ones with 1, and the verifier keeps
// serving (an arithmetic request after them succeeds). The tests run are the
// task file's (by example_id), or a caller's own only when the server
// authenticates callers (issue 45).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/services/promtool.h"
#include "tests/services/test_pki.h"
#include "tests/verifier/served_verifier.h"
#include "verifier/verifier_service.h"

namespace kappa::verifier {
namespace {

constexpr char kTests[] = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n";
constexpr char kGood[] = "```python\ndef add(a, b):\n    return a + b\n```";
constexpr char kAdd[] = "add";  // the example id of kTests in the loaded task file

// Code scoring on, with one loaded code task: kAdd -> kTests.
VerifierOptions CodeOn() {
  VerifierOptions options;
  options.max_items = 16;
  options.code.enabled = true;
  options.code.allow_weak_sandbox = true;  // not root: the logic under test still runs
  options.code.max_concurrent = 2;
  options.code.max_solution_bytes = 4096;
  options.code.sandbox.cpu_seconds = 2;
  options.code.sandbox.wall_timeout = absl::Seconds(5);
  options.code.sandbox.address_space_bytes = int64_t{256} << 20;
  auto tasks = std::make_shared<CodeTasks>();
  tasks->Add(kAdd, kTests);
  options.code_tasks = tasks;
  return options;
}

class CodeVerifyTest : public testing::ServedVerifierTest {
 protected:
  void SetUp() override {
    setenv("KAPPA_SECRET", "hunter2-kappa", 1);
    verify_deadline_ = std::chrono::seconds(60);  // hostile items run to their limits
    StartVerifier(CodeOn());                      // plain text, no client authentication
  }

  // A code item that names the loaded task and sends no tests.
  static void AddCode(kappa::v1::VerifyRequest* request, const std::string& response) {
    AddItem(request, "code", "", response, kAdd);
  }
};

TEST_F(CodeVerifyTest, HostileAndOrdinarySolutionsGetTheRightRewardsAndServingGoesOn) {
  const std::string escape = absl::StrCat("/tmp/kappa_escape_", getpid());
  std::remove(escape.c_str());
  kappa::v1::VerifyRequest request;
  AddCode(&request, kGood);                                 // 1
  AddCode(&request, "def add(a, b):\n    return a * b\n");  // wrong
  AddCode(&request, "def add(a, b)\n    return a + b\n");   // syntax
  AddCode(&request, "while True:\n    pass\n");             // loop
  AddCode(
      &request,
      "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n");
  AddCode(&request, "x = bytearray(10 * 1024 ** 3)\ndef add(a, b):\n    return a + b\n");
  AddCode(&request,
          absl::StrCat("open('", escape, "', 'w').write('x')\ndef add(a, b):\n    return a + b\n"));
  AddItem(&request, "code", kTests,  // the tests sent as well: the same, so accepted
          absl::StrCat("import os\nassert 'KAPPA_SECRET' not in os.environ\n", kGood), kAdd);  // 1
  AddItem(&request, "", "7", "3 + 4 = 7");                                               // arithmetic 1
  kappa::v1::VerifyResponse response;
  const grpc::Status status = Verify(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const float expected[] = {1, 0, 0, 0, 0, 0, 0, 1, 1};
  ASSERT_EQ(response.rewards_size(), 9);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(response.rewards(i), expected[i]) << "item " << i;
  if (service_ != nullptr && geteuid() == 0) {
    EXPECT_NE(access(escape.c_str(), F_OK), 0) << escape << " exists";
  }
  std::remove(escape.c_str());

  // Still serving: a plain arithmetic request.
  kappa::v1::VerifyRequest arithmetic;
  AddItem(&arithmetic, "arithmetic", "46", "46");
  AddItem(&arithmetic, "arithmetic", "46", "45");
  kappa::v1::VerifyResponse after;
  ASSERT_TRUE(Verify(arithmetic, &after).ok());
  ASSERT_EQ(after.rewards_size(), 2);
  EXPECT_EQ(after.rewards(0), 1.0f);
  EXPECT_EQ(after.rewards(1), 0.0f);

  const std::string text = registry_.Serialize();
  using kappa::testing::SampleValue;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_sandbox_runs_total{outcome=\"pass\"}"), 2) << text;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_sandbox_runs_total{outcome=\"error\"}"), 0) << text;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_sandbox_seconds_count"), 8) << text;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_rewards_total{value=\"1\"}"), 4) << text;
  const auto [promtool_status, complaints] = kappa::testing::PromtoolCheckMetrics(text);
  EXPECT_EQ(complaints, "");
}

TEST_F(CodeVerifyTest, SandboxMetricsExistAtZero) {
  const std::string text = registry_.Serialize();
  using kappa::testing::SampleValue;
  for (const char* outcome : {"pass", "fail", "timeout", "killed", "error"}) {
    EXPECT_EQ(SampleValue(text, absl::StrCat("kappa_verifier_sandbox_runs_total{outcome=\"",
                                             outcome, "\"}")),
              0)
        << text;
  }
  EXPECT_EQ(SampleValue(text, "kappa_verifier_sandbox_seconds_count"), 0) << text;
}

TEST_F(CodeVerifyTest, InvalidCodeItemsNameTheField) {
  struct Case {
    std::string reference, response, expected;
  };
  const Case cases[] = {
      {"assert add(2, 3) == 6\n", kGood,
       "items[1].reference_answer: differs from the tests of example 'add' in --code-tasks: "
       "send them unchanged or leave it empty"},
      {"", std::string(5000, 'x'), "items[1].response_text: 5000 bytes exceed the limit of 4096"},
  };
  for (const Case& c : cases) {
    kappa::v1::VerifyRequest request;
    AddCode(&request, kGood);
    AddItem(&request, "code", c.reference, c.response, kAdd);
    kappa::v1::VerifyResponse response;
    const grpc::Status status = Verify(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), c.expected);
    EXPECT_EQ(response.rewards_size(), 0);
  }
}

// Issue 45: an anonymous caller cannot make the verifier run tests of its
// choosing (tests that always pass, or code of its own): only the loaded
// task file's, by example_id. Other task families are unchanged.
TEST_F(CodeVerifyTest, AnUnauthenticatedCallerCannotSendItsOwnTests) {
  const std::string anything_passes = "assert True\n";
  for (const std::string id : {"", "not-loaded"}) {
    kappa::v1::VerifyRequest request;
    AddItem(&request, "arithmetic", "7", "7");
    AddItem(&request, "code", anything_passes, "print('hello')\n", id);
    kappa::v1::VerifyResponse response;
    const grpc::Status status = Verify(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << id;
    EXPECT_EQ(status.error_message().rfind("items[1].reference_answer: this verifier runs only "
                                           "the tests of its --code-tasks file",
                                           0),
              0u)
        << status.error_message();
    EXPECT_NE(status.error_message().find(id.empty() ? "the item has no example_id"
                                                     : "example 'not-loaded' is not in"),
              std::string::npos)
        << status.error_message();
    EXPECT_NE(status.error_message().find("security.mutual_tls"), std::string::npos);
    EXPECT_EQ(response.rewards_size(), 0);
  }
  // The loaded task's tests decide, whatever the caller would have liked.
  kappa::v1::VerifyRequest request;
  AddCode(&request, "print('hello')\n");
  AddItem(&request, "arithmetic", "7", "7");
  kappa::v1::VerifyResponse response;
  ASSERT_TRUE(Verify(request, &response).ok());
  EXPECT_EQ(std::vector<float>(response.rewards().begin(), response.rewards().end()),
            (std::vector<float>{0, 1}));
}

// With mutual TLS the server knows its callers (only the deployment's
// certificates get through), so a worker may send a task's tests itself.
TEST(CodeVerifyAuthenticatedTest, AnAuthenticatedCallerMaySendItsOwnTests) {
  char dir[] = "/tmp/kappa_pki_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const kappa::testing::TestPki pki = kappa::testing::MakeTestPki(dir);
  ASSERT_FALSE(pki.dir.empty()) << "openssl failed; see " << dir << "/openssl.log";
  auto load = [&](const std::string& identity) {
    services::Config::Security settings;
    settings.tls = true;
    settings.mutual_tls = true;
    settings.cert_file = pki.Path(identity + ".crt");
    settings.key_file = pki.Path(identity + ".key");
    settings.ca_file = pki.Path("ca.crt");
    const char* const no_environment[] = {nullptr};
    absl::StatusOr<services::TransportSecurity> security =
        services::LoadTransportSecurity(settings, no_environment);
    EXPECT_TRUE(security.ok()) << security.status();
    return security.ok() ? *security : services::TransportSecurity{};
  };
  struct Served : testing::ServedVerifierTest {
    void TestBody() override {}
    using ServedVerifierTest::AddItem;
    using ServedVerifierTest::StartVerifier;
    using ServedVerifierTest::TearDown;
    using ServedVerifierTest::Verify;
  } served;
  services::ServerOptions server;
  server.security = load("server");
  ASSERT_TRUE(server.security.AuthenticatesClients());
  served.StartVerifier(CodeOn(), server, load("client"));
  kappa::v1::VerifyRequest request;
  Served::AddItem(&request, "code", "assert mul(2, 3) == 6\n",
                  "def mul(a, b):\n    return a * b\n");
  Served::AddItem(&request, "code", "assert mul(2, 3) == 6\n",
                  "def mul(a, b):\n    return a + b\n");
  Served::AddItem(&request, "code", "", kGood, kAdd);  // the loaded task still works
  kappa::v1::VerifyResponse response;
  const grpc::Status status = served.Verify(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(std::vector<float>(response.rewards().begin(), response.rewards().end()),
            (std::vector<float>{1, 0, 1}));
  served.TearDown();
  std::filesystem::remove_all(dir);
}

TEST_F(CodeVerifyTest, RewardCodeRunsEveryItemInTheSandbox) {
  // verifier.reward=code through ScoreRequest with a sandbox of its own: the
  // items' task fields (arithmetic, math, empty) are not read.
  VerifierOptions options = CodeOn();
  options.callers_authenticated = true;  // the items bring their own tests
  options.reward_family = "code";
  CodeRewarder code(options.code, nullptr);
  ASSERT_TRUE(code.available().ok()) << code.available();
  kappa::v1::VerifyRequest request;
  AddItem(&request, "arithmetic", kTests, kGood);
  AddItem(&request, "math", kTests, "def add(a, b):\n    return a * b\n");
  AddItem(&request, "", kTests, kGood);
  absl::StatusOr<std::vector<float>> rewards = ScoreRequest(request, options, &code);
  ASSERT_TRUE(rewards.ok()) << rewards.status();
  EXPECT_EQ(*rewards, (std::vector<float>{1, 0, 1}));
}

// Issue 45: a request's code items × the wall timeout must fit the budget
// (RESOURCE_EXHAUSTED naming --code-request-seconds, nothing run), and no
// code item starts once `stop` says the call is over; after the first item,
// the rest are not run and the request ends with that status.
TEST_F(CodeVerifyTest, BudgetAndStopBoundWhatARequestRuns) {
  VerifierOptions options = CodeOn();
  options.code.max_concurrent = 1;  // items run one after another
  options.code.max_request_sandbox_seconds = 12;
  CodeRewarder code(options.code, nullptr);
  ASSERT_TRUE(code.available().ok()) << code.available();
  kappa::v1::VerifyRequest three;
  for (int i = 0; i < 3; ++i) AddCode(&three, kGood);  // 3 × 5 s = 15 > 12
  absl::StatusOr<std::vector<float>> over = ScoreRequest(three, options, &code);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            "items: 3 code items x 5 s wall timeout = 15 sandbox-seconds exceed the per-request "
            "budget of 12 (--code-request-seconds); split the request");

  kappa::v1::VerifyRequest two;
  for (int i = 0; i < 2; ++i) AddCode(&two, kGood);
  int asked = 0;
  const std::function<absl::Status()> stop_after_one = [&asked] {
    return ++asked > 1 ? absl::DeadlineExceededError("deadline passed before every code item ran")
                       : absl::OkStatus();
  };
  absl::StatusOr<std::vector<float>> stopped = ScoreRequest(two, options, &code, stop_after_one);
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kDeadlineExceeded) << stopped.status();
  EXPECT_EQ(asked, 2) << "asked before each item; the second did not start";
  absl::StatusOr<std::vector<float>> whole = ScoreRequest(two, options, &code);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, (std::vector<float>{1, 1}));
}

TEST(CodeVerifyDisabledTest, CodeItemsAreRefusedUnlessEnabled) {
  VerifierOptions options;  // code scoring is off by default
  kappa::v1::VerifyRequest request;
  kappa::v1::VerifyItem* item = request.add_items();
  item->set_task("code");
  item->set_reference_answer(kTests);
  item->set_response_text(kGood);
  absl::StatusOr<std::vector<float>> rewards = ScoreRequest(request, options);
  EXPECT_EQ(rewards.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rewards.status().message(),
            "items[0].task: code tasks are disabled on this verifier (start kappa-verifier with "
            "--enable-code)");
  // The service itself builds no sandbox then: the same answer over its API.
  VerifierService service(options);
  EXPECT_TRUE(service.CodeStatus().ok());
}

}  // namespace
}  // namespace kappa::verifier
