#include "services/grpc_util.h"

#include <gtest/gtest.h>

namespace kappa::services {
namespace {

TEST(GrpcUtilTest, EveryCodeRoundTripsWithItsMessage) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), code == 0 ? "" : "why");
    const grpc::Status grpc_status = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(grpc_status.error_code()), code);
    EXPECT_EQ(grpc_status.error_message(), code == 0 ? "" : "why");
    EXPECT_EQ(FromGrpcStatus(grpc_status), status);
  }
}

TEST(GrpcUtilTest, NamedCodesMatch) {
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "late")),
            absl::DeadlineExceededError("late"));
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcUtilTest, OutOfRangeCodesBecomeUnknown) {
  EXPECT_EQ(FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(77), "odd")),
            absl::UnknownError("odd"));
}

TEST(GrpcUtilTest, MakeChannelReturnsAChannel) {
  auto channel = MakeChannel("127.0.0.1:1", {}, 1 << 20);
  ASSERT_NE(channel, nullptr);
  // Nothing listens on port 1: the channel must not claim to be ready.
  EXPECT_FALSE(channel->WaitForConnected(std::chrono::system_clock::now() +
                                         std::chrono::milliseconds(200)));
}

}  // namespace
}  // namespace kappa::services
