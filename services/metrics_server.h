// Serves a metrics Registry at GET /metrics over HTTP/1.1, on its own port
// beside the process's gRPC port, for Prometheus to scrape.
//
// Why not civetweb (which the plan named): Debian's libcivetweb starts its
// threads with a fixed 100 KiB stack (0x19000, compiled in), and a process
// that links libtorch carries more static TLS than that (OpenBLAS alone has
// 60 KiB, glog 30 KiB), so pthread_create fails ("Cannot create threads")
// in every libtorch process. A scrape endpoint is one accept loop; this is it,
// on one std::thread with the default stack, one connection at a time, each
// given at most kConnectionDeadline to send its request and read the answer
// (a slow or stalled client is dropped; the next scrape is served).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "services/metrics.h"

namespace kappa::services::metrics {

// How long one connection may take, request and answer together.
inline constexpr std::chrono::seconds kConnectionDeadline{5};

class MetricsServer {
 public:
  // `address` is HOST:PORT; port 0 picks a free port (see port()). The
  // registry must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                               const Registry* registry);
  ~MetricsServer();  // stops serving (within ~200 ms)

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // HOST:PORT as asked for, with the port actually bound (never 0).
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  void Serve();
  void HandleConnection(int client) const;

  int listen_fd_ = -1;
  const Registry* registry_ = nullptr;
  int port_ = 0;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// What every binary does with its --metrics-address: nullptr when `address`
// is empty (no endpoint asked for), else a started server, logged with its
// URL.
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetricsIfRequested(const std::string& address,
                                                                        const Registry* registry);

// The address `server` listens on; "" for nullptr (no endpoint asked for).
inline std::string BoundAddress(const MetricsServer* server) {
  return server == nullptr ? std::string() : server->address();
}

}  // namespace kappa::services::metrics
