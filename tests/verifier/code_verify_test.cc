// "code" items through the real gRPC VerifierService on loopback: hostile
// solutions end with reward 0, good ones with 1, and the verifier keeps
// serving (an arithmetic request after them succeeds).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/services/promtool.h"
#include "tests/verifier/served_verifier.h"
#include "verifier/verifier_service.h"

namespace kappa::verifier {
namespace {

class CodeVerifyTest : public testing::ServedVerifierTest {
 protected:
  void SetUp() override {
    setenv("KAPPA_SECRET", "hunter2-kappa", 1);
    VerifierOptions options;
    options.max_items = 16;
    options.code.max_concurrent = 2;
    options.code.max_solution_bytes = 4096;
    options.code.sandbox.cpu_seconds = 2;
    options.code.sandbox.wall_timeout = absl::Seconds(5);
    options.code.sandbox.address_space_bytes = int64_t{256} << 20;
    verify_deadline_ = std::chrono::seconds(60);  // hostile items run to their limits
    StartVerifier(options);
  }
};

constexpr char kTests[] = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n";
constexpr char kGood[] = "```python\ndef add(a, b):\n    return a + b\n```";

TEST_F(CodeVerifyTest, HostileAndOrdinarySolutionsGetTheRightRewardsAndServingGoesOn) {
  const std::string escape = absl::StrCat("/tmp/kappa_escape_", getpid());
  std::remove(escape.c_str());
  kappa::v1::VerifyRequest request;
  AddItem(&request, "code", kTests, kGood);                                 // 1
  AddItem(&request, "code", kTests, "def add(a, b):\n    return a * b\n");  // wrong
  AddItem(&request, "code", kTests, "def add(a, b)\n    return a + b\n");   // syntax
  AddItem(&request, "code", kTests, "while True:\n    pass\n");             // loop
  AddItem(&request, "code", kTests,
      "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n");
  AddItem(&request, "code", kTests,
      "x = bytearray(10 * 1024 ** 3)\ndef add(a, b):\n    return a + b\n");
  AddItem(&request, "code", kTests,
      absl::StrCat("open('", escape, "', 'w').write('x')\ndef add(a, b):\n    return a + b\n"));
  AddItem(&request, "code", kTests,
      absl::StrCat("import os\nassert 'KAPPA_SECRET' not in os.environ\n", kGood));  // 1
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
      {"  \n", kGood, "items[1].reference_answer: code tests are empty"},
      {kTests, std::string(5000, 'x'),
       "items[1].response_text: 5000 bytes exceed the limit of 4096"},
  };
  for (const Case& c : cases) {
    kappa::v1::VerifyRequest request;
    AddItem(&request, "code", kTests, kGood);
    AddItem(&request, "code", c.reference, c.response);
    kappa::v1::VerifyResponse response;
    const grpc::Status status = Verify(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), c.expected);
    EXPECT_EQ(response.rewards_size(), 0);
  }
}

TEST_F(CodeVerifyTest, RewardCodeRunsEveryItemInTheSandbox) {
  // verifier.reward=code through ScoreRequest with a sandbox of its own: the
  // items' task fields (arithmetic, math, empty) are not read.
  VerifierOptions options;
  options.code.max_concurrent = 2;
  options.code.sandbox.cpu_seconds = 2;
  options.code.sandbox.wall_timeout = absl::Seconds(5);
  options.code.sandbox.address_space_bytes = int64_t{256} << 20;
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

TEST(CodeVerifyDisabledTest, CodeItemsAreRefusedWhenDisabled) {
  VerifierOptions options;
  options.code.enabled = false;
  kappa::v1::VerifyRequest request;
  kappa::v1::VerifyItem* item = request.add_items();
  item->set_task("code");
  item->set_reference_answer(kTests);
  item->set_response_text(kGood);
  absl::StatusOr<std::vector<float>> rewards = ScoreRequest(request, options);
  EXPECT_EQ(rewards.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rewards.status().message(), "items[0].task: code tasks are disabled on this verifier");
}

}  // namespace
}  // namespace kappa::verifier
