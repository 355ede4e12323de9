#include "services/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <limits>
#include <mutex>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/grpc_util.h"

namespace kappa::services {

absl::StatusOr<ServerOptions> ServerOptionsFromConfig(const Config& config) {
  absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(config.security);
  if (!security.ok()) return security.status();
  const int64_t max_message_bytes = config.security.max_message_bytes;
  if (max_message_bytes <= 0 || max_message_bytes > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.max_message_bytes: expected 1..",
                     std::numeric_limits<int>::max(), ", got ", max_message_bytes));
  }
  ServerOptions options;
  options.max_message_bytes = static_cast<int>(max_message_bytes);
  for (auto [key, value, low, high, unit, out] :
       {std::tuple{"security.keepalive_time_ms", config.security.keepalive_time_ms, 1000, 3600000,
                   " ms", &options.keepalive.time_ms},
        std::tuple{"security.keepalive_timeout_ms", config.security.keepalive_timeout_ms, 1000,
                   600000, " ms", &options.keepalive.timeout_ms},
        std::tuple{"security.server_max_threads", config.security.server_max_threads, 4, 1000000,
                   "", &options.max_threads},
        std::tuple{"security.max_concurrent_streams", config.security.max_concurrent_streams, 1,
                   1000000, "", &options.max_concurrent_streams}}) {
    if (value < low || value > high) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": expected ", low, "..", high, unit, ", got ", value));
    }
    *out = static_cast<int>(value);
  }
  options.security = *std::move(security);
  options.allow_insecure = config.security.allow_insecure;
  return options;
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const ServerOptions& options) {
  if (services.empty()) {
    // gRPC's synchronous server refuses to start without a service of its own.
    return absl::InvalidArgumentError("GrpcServer::Start: no services to serve");
  }
  // Reachable from other machines, and no client proves who it is.
  const bool insecure = !IsLoopbackAddress(address) && !options.security.AuthenticatesClients();
  if (insecure && !options.allow_insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", address,
        " without client authentication: anyone who reaches it could lease prompts, read the "
        "policy and steer training. Set security.tls with security.mutual_tls or tokens "
        "(security.tokens_dir, security.token_file; scripts/deploy_secrets.sh makes them), bind "
        "a loopback address, or set security.allow_insecure: true to accept the risk"));
  }
  // Process-wide switch read by ServerBuilder's constructor.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, MakeServerCredentials(options.security), &port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Accept the client keepalive of MakeChannel (one ping per
  // keepalive.time_ms) with room to spare, and ping idle clients at the same
  // rate, so a client that vanished without closing its connection is
  // noticed and its streams end.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             options.keepalive.time_ms / 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive.time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive.timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Two servers on one port would split traffic silently; make it an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Bounded under load: a flood of calls or streams gets RESOURCE_EXHAUSTED
  // (or waits for a stream) instead of a thread each.
  grpc::ResourceQuota quota("kappa-server");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);

  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", address, "'"));
  }
  server->port_ = port;
  if (grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
  }
  if (insecure) {
    GrpcServer* raw = server.get();
    server->insecure_warning_ = std::thread([raw, address, every = options.insecure_warning_every] {
      raw->WarnWhileInsecure(address, every);
    });
  }
  return server;
}

void GrpcServer::WarnWhileInsecure(const std::string& address, absl::Duration every) {
  absl::MutexLock lock(&warning_mu_);
  do {
    spdlog::warn(
        "serving on {} WITHOUT client authentication (security.allow_insecure): anyone who "
        "reaches this address can call every RPC",
        address);
  } while (!warning_mu_.AwaitWithTimeout(absl::Condition(&shutting_down_), every));
}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&warning_mu_);
    shutting_down_ = true;
  }
  if (insecure_warning_.joinable()) insecure_warning_.join();
  if (server_ == nullptr) return;
  // Health first, so load balancers stop routing here while in-flight calls
  // drain; Shutdown() of the health service also freezes it at NOT_SERVING.
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->Shutdown();
  }
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  server_->Wait();
  server_.reset();
}

// --- termination signals: the self-pipe trick, so the handler only does
// async-signal-safe work (an atomic store and a write()).
namespace {

std::atomic<bool> g_termination_requested{false};
int g_signal_pipe[2] = {-1, -1};
std::once_flag g_handlers_once;

extern "C" void OnTerminationSignal(int) {
  const int saved_errno = errno;
  g_termination_requested.store(true);
  const char byte = 1;
  [[maybe_unused]] ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

}  // namespace

void InstallTerminationHandlers() {
  std::call_once(g_handlers_once, [] {
    if (pipe(g_signal_pipe) == 0) {
      for (int fd : g_signal_pipe) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        fcntl(fd, F_SETFD, FD_CLOEXEC);
      }
    }
    struct sigaction action = {};
    action.sa_handler = OnTerminationSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGTERM, &action, nullptr);
  });
}

void WaitForTerminationSignal() {
  InstallTerminationHandlers();
  while (!g_termination_requested.load()) {
    pollfd fd = {g_signal_pipe[0], POLLIN, 0};
    // The timeout only guards against a pipe that failed to open.
    if (poll(&fd, 1, g_signal_pipe[0] >= 0 ? 1000 : 100) > 0) {
      char buffer[16];
      while (read(g_signal_pipe[0], buffer, sizeof(buffer)) > 0) {
      }
    }
  }
}

bool TerminationRequested() {
  InstallTerminationHandlers();
  return g_termination_requested.load();
}

absl::Status CheckHealth(const std::string& address, absl::Duration timeout,
                         const TransportSecurity& security) {
  auto channel = MakeChannel(address, security);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  grpc::health::v1::HealthCheckRequest request;  // service "": the whole server
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("health check of ", address, " failed: ",
                                               FromGrpcStatus(status).ToString()));
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(
        address, " is ",
        grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())));
  }
  return absl::OkStatus();
}

}  // namespace kappa::services
