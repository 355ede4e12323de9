// Server bootstrap shared by every kappa service: binds, registers the
// services plus grpc.health.v1 (SERVING once started), and shuts down within
// a deadline.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/loopback.h"
#include "services/grpc_util.h"
#include "services/transport_security.h"

namespace kappa::services {

struct ServerOptions {
  int max_message_bytes = 64 << 20;  // larger requests fail with RESOURCE_EXHAUSTED
  TransportSecurity security;        // default: plain text, no token
  // The server pings idle clients at this rate too (a worker that vanished
  // is noticed and its stream ended), and accepts client pings up to twice
  // as often as keepalive.time_ms.
  Keepalive keepalive;
  // security.allow_insecure: a server on a non-loopback address without
  // client authentication (TransportSecurity::AuthenticatesClients) starts
  // anyway and logs a warning at start and every `insecure_warning_every`.
  bool allow_insecure = false;
  // Bounds under load: threads serving calls (a ResourceQuota; a call
  // beyond them is RESOURCE_EXHAUSTED) and concurrent streams per client
  // connection (HTTP/2 MAX_CONCURRENT_STREAMS).
  int max_threads = 512;
  int max_concurrent_streams = 100;
  absl::Duration insecure_warning_every = absl::Minutes(1);
};

// Whether `address` ("host:port", "[v6]:port", "unix:...") can only be
// reached from this machine: 127.0.0.0/8, ::1, localhost, a Unix socket
// (base/loopback.h, which the c10d group's binding reads too).
using base::IsLoopbackAddress;

// The configuration's message size limit, keepalive and transport security
// (reads the certificate and token files; errors as LoadTransportSecurity,
// INVALID_ARGUMENT naming the key for an out-of-range limit).
absl::StatusOr<ServerOptions> ServerOptionsFromConfig(const Config& config);

class GrpcServer {
 public:
  // `address` "host:port"; port 0 picks a free port (see port()). `services`
  // (at least one, synchronous) must outlive the server. Errors: UNAVAILABLE
  // when the address cannot be bound (also when the port is in use: no
  // SO_REUSEPORT), INVALID_ARGUMENT for an empty service list,
  // FAILED_PRECONDITION naming security.allow_insecure for a non-loopback
  // address without client authentication (anyone who reaches the port
  // could lease prompts, read the policy and steer training).
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const std::string& address, const std::vector<grpc::Service*>& services,
      const ServerOptions& options = {});
  ~GrpcServer();

  int port() const { return port_; }
  // Marks health NOT_SERVING, then shuts down; in-flight calls get `grace`
  // before they are cancelled.
  void Shutdown(absl::Duration grace = absl::Seconds(2));
  grpc::Server* server() { return server_.get(); }

 private:
  GrpcServer() = default;
  // Logs the insecure-listener warning every `every` until Shutdown().
  void WarnWhileInsecure(const std::string& address, absl::Duration every);

  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex warning_mu_;
  bool shutting_down_ ABSL_GUARDED_BY(warning_mu_) = false;
  std::thread insecure_warning_;
};

// Installs the SIGINT/SIGTERM handlers (idempotent). Call early in main() so
// a signal that arrives during startup is not fatal; the two functions below
// also install them on first use.
void InstallTerminationHandlers();
// Blocks until SIGINT or SIGTERM arrives (installs handlers on first call).
void WaitForTerminationSignal();
// True once SIGINT/SIGTERM arrived (for loops that poll).
bool TerminationRequested();

// grpc.health.v1.Health/Check against `address` (overall service ""):
// OK when SERVING; UNAVAILABLE otherwise. Backs every binary's
// `--health-check ADDR` mode.
absl::Status CheckHealth(const std::string& address, absl::Duration timeout,
                         const TransportSecurity& security = {});

}  // namespace kappa::services
