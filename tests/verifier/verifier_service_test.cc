// The verifier behind a real gRPC server on a loopback port.
#include "verifier/verifier_service.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
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

TEST_F(VerifierServiceTest, ShutdownStopsServing) {
  server_->Shutdown(absl::Milliseconds(100));
  EXPECT_EQ(services::CheckHealth(address_, absl::Milliseconds(500)).code(),
            absl::StatusCode::kUnavailable);
  server_.reset();
}

}  // namespace
}  // namespace kappa::verifier
