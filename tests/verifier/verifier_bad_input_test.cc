// Malformed Verify requests sent to a real VerifierService behind a real
// gRPC server on loopback (max message size set small on purpose). Each gets
// a precise status; a bad request scores nothing, and the good request sent
// before it is answered the same afterwards. (verifier_service_test pins the
// messages for bad references, unknown tasks, empty and too-many-item
// requests; this table adds the classes it does not cover.)
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/verifier/served_verifier.h"

namespace kappa::verifier {
namespace {

constexpr int kMaxMessageBytes = 16 << 10;

class VerifierBadInputTest : public testing::ServedVerifierTest {
 protected:
  void SetUp() override {
    VerifierOptions options;
    options.max_items = 8;
    options.code.enabled = false;
    services::ServerOptions server_options;
    server_options.max_message_bytes = kMaxMessageBytes;
    StartVerifier(options, server_options);
  }

  // Three arithmetic items, rewards {1, 0, 1}.
  static kappa::v1::VerifyRequest Good() {
    kappa::v1::VerifyRequest request;
    AddItem(&request, "arithmetic", "46", "46");
    AddItem(&request, "arithmetic", "7", "8");
    AddItem(&request, "", "-3", "-3");
    return request;
  }
};

struct BadVerify {
  const char* name;
  std::function<void(kappa::v1::VerifyRequest&)> mutate;
  grpc::StatusCode code;
  std::string message;  // must appear in the status message
};

TEST_F(VerifierBadInputTest, EachMalformedRequestGetsAPreciseStatusAndNothingIsLost) {
  const std::vector<BadVerify> table = {
      {"code task on a verifier without the sandbox",
       [](auto& r) { r.mutable_items(1)->set_task("code"); },
       grpc::StatusCode::FAILED_PRECONDITION,
       "items[1].task: code tasks are disabled on this verifier"},
      {"oversized message",
       [](auto& r) { r.mutable_items(2)->set_response_text(std::string(kMaxMessageBytes, '9')); },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "larger than max"},
      // bytes on the wire (verifier.proto), so the handler names the field.
      {"non-UTF-8 response text",
       [](auto& r) { r.mutable_items(1)->set_response_text("8 \xff\xfe"); },
       grpc::StatusCode::INVALID_ARGUMENT, "items[1].response_text: not valid UTF-8"},
      {"non-UTF-8 reference answer",
       [](auto& r) { r.mutable_items(0)->set_reference_answer("4\xc3"); },
       grpc::StatusCode::INVALID_ARGUMENT, "items[0].reference_answer: not valid UTF-8"},
      {"non-UTF-8 task",
       [](auto& r) { r.mutable_items(2)->set_task("arith\xffmetic"); },
       grpc::StatusCode::INVALID_ARGUMENT, "items[2].task: not valid UTF-8"},
  };

  kappa::v1::VerifyResponse before;
  ASSERT_TRUE(Verify(Good(), &before).ok());
  ASSERT_EQ(std::vector<float>(before.rewards().begin(), before.rewards().end()),
            (std::vector<float>{1.0f, 0.0f, 1.0f}));

  for (const BadVerify& bad : table) {
    kappa::v1::VerifyRequest request = Good();
    bad.mutate(request);
    kappa::v1::VerifyResponse response;
    const grpc::Status status = Verify(request, &response);
    EXPECT_EQ(status.error_code(), bad.code) << bad.name << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(bad.message), std::string::npos)
        << bad.name << ": " << status.error_message();
    EXPECT_EQ(response.rewards_size(), 0) << bad.name;  // no partial answer
  }

  kappa::v1::VerifyResponse after;
  ASSERT_TRUE(Verify(Good(), &after).ok());
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString());
  EXPECT_TRUE(services::CheckHealth(address_, absl::Seconds(2)).ok());
}

}  // namespace
}  // namespace kappa::verifier
