// Serves a metrics Registry at GET /metrics over HTTP (civetweb), on its own
// port beside the process's gRPC port, for Prometheus to scrape.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/metrics.h"

struct mg_context;
struct mg_connection;

namespace kappa::services::metrics {

class MetricsServer {
 public:
  // `address` is host:port; port 0 picks a free port (see port()). The
  // registry must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                               const Registry* registry);
  ~MetricsServer();  // stops serving

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsServer() = default;
  static int HandleMetrics(::mg_connection* connection, void* self);

  ::mg_context* context_ = nullptr;
  const Registry* registry_ = nullptr;
  int port_ = 0;
};

}  // namespace kappa::services::metrics
