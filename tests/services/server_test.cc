#include "services/server.h"

#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kappa/v1/verifier.grpc.pb.h"

namespace kappa::services {
namespace {

// Any synchronous service will do: the server itself is under test. One
// instance per server, as gRPC requires.
kappa::v1::Verifier::Service service_a;
kappa::v1::Verifier::Service service_b;
const std::vector<grpc::Service*> kServices = {&service_a};

TEST(GrpcServerTest, PicksAPortAndServesHealth) {
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start("127.0.0.1:0", kServices);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  EXPECT_TRUE(CheckHealth(address, absl::Seconds(5)).ok());

  (*server)->Shutdown(absl::Milliseconds(100));
  const absl::Status after = CheckHealth(address, absl::Milliseconds(500));
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
  (*server)->Shutdown();  // idempotent
}

TEST(GrpcServerTest, PortInUseIsAnError) {
  absl::StatusOr<std::unique_ptr<GrpcServer>> first = GrpcServer::Start("127.0.0.1:0", kServices);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<GrpcServer>> second = GrpcServer::Start(address, {&service_b});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(CheckHealth(address, absl::Seconds(5)).ok());
}

TEST(GrpcServerTest, BadAddressIsAnError) {
  EXPECT_FALSE(GrpcServer::Start("not an address", kServices).ok());
  EXPECT_EQ(GrpcServer::Start("127.0.0.1:0", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckHealthTest, NothingListeningIsUnavailable) {
  // Reserve a port, then free it, so nothing listens there.
  int port = 0;
  {
    absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start("127.0.0.1:0", kServices);
    ASSERT_TRUE(server.ok());
    port = (*server)->port();
  }
  const absl::Status status =
      CheckHealth(absl::StrCat("127.0.0.1:", port), absl::Milliseconds(500));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("health check of"), std::string::npos) << status;
}

TEST(TerminationSignalTest, SigtermWakesTheWaiter) {
  InstallTerminationHandlers();
  ASSERT_FALSE(TerminationRequested());
  std::thread waiter([] { WaitForTerminationSignal(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(std::raise(SIGTERM), 0);  // handled, so the test process lives on
  waiter.join();
  EXPECT_TRUE(TerminationRequested());
  WaitForTerminationSignal();  // already requested: returns at once
}

}  // namespace
}  // namespace kappa::services
