#include "services/server.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kappa/v1/learner.grpc.pb.h"
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

TEST(GrpcServerTest, LoopbackIsWhatOnlyThisMachineReaches) {
  for (const char* address : {"127.0.0.1:50051", "127.8.9.1:0", "localhost:1", "[::1]:50051",
                              "ipv4:127.0.0.1:5", "unix:/tmp/kappa.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  }
  for (const char* address :
       {"0.0.0.0:50051", "[::]:50051", "10.0.0.7:1", "learner:50051", "128.0.0.1:1", "[::2]:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
}

// Every message logged through it, readable while others log.
class LineSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // Messages containing `text`.
  int Count(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(std::count_if(
        lines_.begin(), lines_.end(),
        [&](const std::string& line) { return line.find(text) != std::string::npos; }));
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    lines_.emplace_back(message.payload.data(), message.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;  // guarded by base_sink's mutex_
};

// Issue 45: a server anyone on the network can reach, and no client
// authentication, does not start unless security.allow_insecure says so;
// then it warns at start and every insecure_warning_every until shut down.
TEST(GrpcServerTest, AnOpenNonLoopbackServerIsRefusedUnlessAllowedAndThenWarns) {
  const absl::StatusOr<std::unique_ptr<GrpcServer>> refused =
      GrpcServer::Start("0.0.0.0:0", kServices);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find(
                "refusing to listen on 0.0.0.0:0 without client authentication"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("security.allow_insecure: true"), std::string::npos);

  auto lines = std::make_shared<LineSink>();
  const std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", lines));
  const std::string warning = "WITHOUT client authentication (security.allow_insecure)";
  {
    // Loopback: nobody else can reach it, so no warning.
    absl::StatusOr<std::unique_ptr<GrpcServer>> local = GrpcServer::Start("127.0.0.1:0", kServices);
    ASSERT_TRUE(local.ok()) << local.status();
    (*local)->Shutdown(absl::ZeroDuration());
  }
  EXPECT_EQ(lines->Count(warning), 0);
  ServerOptions options;
  options.allow_insecure = true;
  options.insecure_warning_every = absl::Milliseconds(50);
  absl::StatusOr<std::unique_ptr<GrpcServer>> allowed =
      GrpcServer::Start("0.0.0.0:0", {&service_b}, options);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(CheckHealth(absl::StrCat("127.0.0.1:", (*allowed)->port()), absl::Seconds(5)).ok());
  // At start and then again and again (polled: no fixed window to miss).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (lines->Count(warning) < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (*allowed)->Shutdown(absl::ZeroDuration());
  const int at_shutdown = lines->Count(warning);
  EXPECT_GE(at_shutdown, 3);
  EXPECT_GE(lines->Count("serving on 0.0.0.0:0 WITHOUT client authentication"), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(lines->Count(warning), at_shutdown) << "the warning outlived Shutdown()";
  spdlog::set_default_logger(previous);
}

// A learner whose WatchPolicy holds its stream (and its thread) until the
// client goes away.
class HoldingLearner final : public kappa::v1::Learner::Service {
 public:
  grpc::Status WatchPolicy(grpc::ServerContext* context, const kappa::v1::WatchPolicyRequest*,
                           grpc::ServerWriter<kappa::v1::PolicyChunk>*) override {
    while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return grpc::Status::CANCELLED;
  }
};

// Issue 45: a flood of held streams is bounded by the server's threads
// (ServerOptions.max_threads, a ResourceQuota): the calls beyond it get
// RESOURCE_EXHAUSTED instead of a thread each, and once the flood is gone
// the server serves again.
TEST(GrpcServerTest, HeldStreamsBeyondTheThreadBoundAreRefused) {
  HoldingLearner learner;
  ServerOptions options;
  options.max_threads = 6;
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start("127.0.0.1:0", {&learner}, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  constexpr int kStreams = 16;
  std::vector<grpc::StatusCode> codes(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      auto stub = kappa::v1::Learner::NewStub(MakeChannel(address));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
      kappa::v1::WatchPolicyRequest request;
      auto reader = stub->WatchPolicy(&context, request);
      kappa::v1::PolicyChunk chunk;
      while (reader->Read(&chunk)) {
      }
      codes[i] = reader->Finish().error_code();
    });
  }
  for (std::thread& client : clients) client.join();
  const int held =
      static_cast<int>(std::count(codes.begin(), codes.end(), grpc::StatusCode::DEADLINE_EXCEEDED));
  const int refused = static_cast<int>(
      std::count(codes.begin(), codes.end(), grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_EQ(held + refused, kStreams);
  EXPECT_GE(held, 1);
  EXPECT_LT(held, options.max_threads) << "more streams held than the server has threads";
  EXPECT_GE(refused, kStreams - options.max_threads);
  EXPECT_TRUE(CheckHealth(address, absl::Seconds(5)).ok()) << "the server serves again";
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
