// The verifier behind a real gRPC server on a loopback port.
#include "verifier/verifier_service.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/config.h"
#include "services/grpc_util.h"
#include "tests/services/promtool.h"
#include "tests/verifier/served_verifier.h"

namespace kappa::verifier {
namespace {

class VerifierServiceTest : public testing::ServedVerifierTest {
 protected:
  void SetUp() override {
    VerifierOptions options;
    options.max_items = 8;
    StartVerifier(options);
  }

  // Most items here are plain answers: the task comes last and may be left out.
  static void Add(kappa::v1::VerifyRequest* request, const std::string& reference,
                  const std::string& response, const std::string& task = "") {
    AddItem(request, task, reference, response);
  }
};

TEST_F(VerifierServiceTest, HealthIsServing) {
  EXPECT_TRUE(services::CheckHealth(address_, absl::Seconds(5)).ok());
}

TEST_F(VerifierServiceTest, RewardsABatchInOrder) {
  kappa::v1::VerifyRequest request;
  Add(&request, "46", "46");
  Add(&request, "46", "45");
  Add(&request, "-3", "the answer is -03", "arithmetic");
  Add(&request, "0", "-0");
  Add(&request, "12", "12a");
  Add(&request, "7", "");
  Add(&request, "6", "4 6");
  Add(&request, "123456789012345678901234567890", " 123456789012345678901234567890\n");
  kappa::v1::VerifyResponse response;
  const grpc::Status status = Verify(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.rewards_size(), 8);
  const float expected[] = {1, 0, 1, 1, 0, 0, 1, 1};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(response.rewards(i), expected[i]) << "item " << i;
}

TEST_F(VerifierServiceTest, MetricsCountRequestsRejectionsAndRewardsByValue) {
  kappa::v1::VerifyRequest request;
  Add(&request, "46", "46");
  Add(&request, "46", "45");
  Add(&request, "7", "7");
  kappa::v1::VerifyResponse response;
  ASSERT_TRUE(Verify(request, &response).ok());
  kappa::v1::VerifyRequest empty;
  EXPECT_FALSE(Verify(empty, &response).ok());

  const std::string text = registry_.Serialize();
  using kappa::testing::SampleValue;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_requests_total"), 2) << text;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_rejected_requests_total"), 1) << text;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_rewards_total{value=\"1\"}"), 2) << text;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_rewards_total{value=\"0\"}"), 1) << text;
  EXPECT_EQ(SampleValue(text, "kappa_verifier_verify_seconds_count"), 2) << text;
  const auto [status, complaints] = kappa::testing::PromtoolCheckMetrics(text);
  EXPECT_EQ(complaints, "");
}

TEST_F(VerifierServiceTest, InvalidItemsNameTheField) {
  struct Case {
    std::string task, reference, response;
    std::string expected;
  };
  const Case cases[] = {
      {"", "4 6", "46", "items[1].reference_answer: '4 6' is not an integer answer"},
      {"", "", "46", "items[1].reference_answer: '' is not an integer answer"},
      {"chess", "1", "1",
       "items[1].task: unknown task 'chess' (known: arithmetic, math, math_strict)"},
  };
  for (const Case& c : cases) {
    kappa::v1::VerifyRequest request;
    Add(&request, "1", "1");
    Add(&request, c.reference, c.response, c.task);
    Add(&request, "2", "2");
    kappa::v1::VerifyResponse response;
    const grpc::Status status = Verify(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), c.expected);
    EXPECT_EQ(response.rewards_size(), 0);  // nothing scored when any item is bad
  }
}

TEST_F(VerifierServiceTest, EmptyAndOversizeRequests) {
  kappa::v1::VerifyResponse response;
  grpc::Status status = Verify(kappa::v1::VerifyRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "items: empty request");

  kappa::v1::VerifyRequest request;
  for (int i = 0; i < 9; ++i) Add(&request, "1", "1");
  status = Verify(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "items: 9 items exceed the limit of 8 per request");
}

TEST_F(VerifierServiceTest, NonUtf8ResponseIsRejected) {
  // Over the wire, proto3 already refuses to parse a string field with
  // invalid UTF-8, so the request never reaches the handler...
  kappa::v1::VerifyRequest request;
  Add(&request, "1", "1");
  Add(&request, "46", "46 \xff\xfe");
  kappa::v1::VerifyResponse response;
  EXPECT_FALSE(Verify(request, &response).ok());
  EXPECT_EQ(response.rewards_size(), 0);
  // ...and the handler's own check names the field for in-process callers.
  VerifierOptions options;
  absl::StatusOr<std::vector<float>> rewards = ScoreRequest(request, options);
  EXPECT_EQ(rewards.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rewards.status().message(), "items[1].response_text: not valid UTF-8");
}

// verifier.reward: the configuration's reward for every item, over the wire.
class VerifierRewardTest : public testing::ServedVerifierTest {
 protected:
  // Starts the verifier from a configuration with these overrides.
  void StartWithConfig(const std::vector<std::string>& overrides) {
    absl::StatusOr<services::Config> config = services::ParseConfig("", "<test>", overrides);
    ASSERT_TRUE(config.ok()) << config.status();
    VerifierOptions options;
    options.code.enabled = false;  // no sandbox probe: these items are answers
    const absl::Status status = ApplyVerifierConfig(*config, &options);
    ASSERT_TRUE(status.ok()) << status;
    StartVerifier(options);
  }

  // The rewards of `request`, or the failure's message.
  std::vector<float> Rewards(const kappa::v1::VerifyRequest& request) {
    kappa::v1::VerifyResponse response;
    const grpc::Status status = Verify(request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.rewards().begin(), response.rewards().end()};
  }

  // A boxed 2 under each family; the reference is 2 throughout.
  static kappa::v1::VerifyRequest BoxedTwo() {
    kappa::v1::VerifyRequest request;
    AddItem(&request, "arithmetic", "2", "so $\\boxed{2}$");
    AddItem(&request, "", "2", "so $\\boxed{2}$");
    AddItem(&request, "math", "2", "so $\\boxed{2}$");
    AddItem(&request, "math_strict", "2", "the answer is 2");
    return request;
  }
};

TEST_F(VerifierRewardTest, MathScoresEveryItemAsMath) {
  StartWithConfig({"verifier.reward=math"});
  EXPECT_EQ(Rewards(BoxedTwo()), (std::vector<float>{1, 1, 1, 1}));
  // The task field is not read at all: an unknown family is scored as math too.
  kappa::v1::VerifyRequest request;
  AddItem(&request, "chess", "\\frac{1}{2}", "\\boxed{0.5}");
  EXPECT_EQ(Rewards(request), std::vector<float>{1});
}

TEST_F(VerifierRewardTest, DefaultKeepsEachItemsFamily) {
  StartWithConfig({});
  EXPECT_EQ(Rewards(BoxedTwo()), (std::vector<float>{0, 0, 1, 0}));
}

TEST_F(VerifierRewardTest, TaskIsTheDefault) {
  StartWithConfig({"verifier.reward=task"});
  EXPECT_EQ(Rewards(BoxedTwo()), (std::vector<float>{0, 0, 1, 0}));
}

TEST_F(VerifierRewardTest, MathStrictRequiresTheBoxOfEveryItem) {
  StartWithConfig({"verifier.reward=math_strict"});
  EXPECT_EQ(Rewards(BoxedTwo()), (std::vector<float>{1, 1, 1, 0}));
}

TEST_F(VerifierRewardTest, ExactScoresEveryItemAsArithmetic) {
  StartWithConfig({"verifier.reward=exact"});
  EXPECT_EQ(Rewards(BoxedTwo()), (std::vector<float>{0, 0, 0, 1}));
  // A reference is checked as the override's: a math answer is no integer.
  kappa::v1::VerifyRequest request;
  AddItem(&request, "math", "\\frac{1}{2}", "\\boxed{0.5}");
  kappa::v1::VerifyResponse response;
  const grpc::Status status = Verify(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "items[0].reference_answer: '\\frac{1}{2}' is not an integer answer");
}

TEST(VerifierRewardConfigTest, BadValuesAreRefusedNamingTheKey) {
  for (const char* value : {"maths", "Math", "arithmetic", "exact_match"}) {
    absl::StatusOr<services::Config> config =
        services::ParseConfig(absl::StrCat("verifier:\n  reward: ", value, "\n"), "run.yaml");
    ASSERT_TRUE(config.ok()) << config.status();  // any string parses; the verifier checks it
    VerifierOptions options;
    const absl::Status status = ApplyVerifierConfig(*config, &options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_EQ(status.message(),
              absl::StrCat("verifier.reward: unknown reward '", value,
                           "' (known: \"\" or task, exact, math, math_strict, code)"));
  }
}

TEST(VerifierRewardConfigTest, NamesMapToFamilies) {
  const std::pair<const char*, std::optional<std::string>> cases[] = {
      {"", std::nullopt}, {"task", std::nullopt},         {"exact", "arithmetic"},
      {"math", "math"},   {"math_strict", "math_strict"}, {"code", "code"},
  };
  for (const auto& [reward, family] : cases) {
    services::Config config;
    config.verifier.reward = reward;
    config.verifier.max_items = 5;
    VerifierOptions options;
    options.code.enabled = true;  // --enable-code: "code" is accepted
    ASSERT_TRUE(ApplyVerifierConfig(config, &options).ok()) << reward;
    EXPECT_EQ(options.reward_family, family) << reward;
    EXPECT_EQ(options.max_items, 5);
  }
}

TEST(VerifierRewardConfigTest, CodeNeedsTheSandbox) {
  services::Config config;
  config.verifier.reward = "code";
  VerifierOptions options;  // code scoring is off by default
  const absl::Status status = ApplyVerifierConfig(config, &options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "verifier.reward: 'code' runs model-written code in the sandbox, which is off; pass "
            "--enable-code to kappa-verifier (see docs/security.md)");
  // ScoreRequest without a sandbox names the key, not the item's task.
  options.reward_family = "code";
  kappa::v1::VerifyRequest request;
  kappa::v1::VerifyItem* item = request.add_items();
  item->set_task("math");
  item->set_reference_answer("assert True\n");
  item->set_response_text("pass\n");
  const absl::StatusOr<std::vector<float>> rewards = ScoreRequest(request, options);
  EXPECT_EQ(rewards.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rewards.status().message(),
            "verifier.reward: code tasks are disabled on this verifier (start kappa-verifier "
            "with --enable-code)");
}

TEST_F(VerifierServiceTest, ShutdownStopsServing) {
  server_->Shutdown(absl::Milliseconds(100));
  EXPECT_EQ(services::CheckHealth(address_, absl::Milliseconds(500)).code(),
            absl::StatusCode::kUnavailable);
  server_.reset();
}

}  // namespace
}  // namespace kappa::verifier
