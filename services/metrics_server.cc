#include "services/metrics_server.h"

#include <civetweb.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace kappa::services::metrics {
namespace {

// The content type of the text exposition format, version 0.0.4.
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// civetweb reports why mg_start failed only through this callback.
thread_local std::string last_civetweb_error;

int RecordCivetwebError(const mg_connection*, const char* message) {
  last_civetweb_error = message != nullptr ? message : "";
  return 1;
}

void InitLibraryOnce() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    const Registry* registry) {
  InitLibraryOnce();
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = registry;
  const char* options[] = {"listening_ports", address.c_str(), "num_threads", "2", nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = &RecordCivetwebError;
  last_civetweb_error.clear();
  server->context_ = mg_start(&callbacks, nullptr, options);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ", last_civetweb_error));
  }
  mg_set_request_handler(server->context_, "/metrics$", &MetricsServer::HandleMetrics,
                         server.get());
  mg_server_port ports[4];
  const int n = mg_get_server_ports(server->context_, 4, ports);
  if (n < 1) return absl::InternalError("metrics: civetweb reports no listening port");
  server->port_ = ports[0].port;
  return server;
}

MetricsServer::~MetricsServer() {
  if (context_ != nullptr) mg_stop(context_);
}

int MetricsServer::HandleMetrics(::mg_connection* connection, void* self) {
  const auto* server = static_cast<const MetricsServer*>(self);
  const std::string body = server->registry_->Serialize();
  mg_printf(connection,
            "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Connection: close\r\n\r\n",
            kContentType, body.size());
  mg_write(connection, body.data(), body.size());
  return 200;
}

}  // namespace kappa::services::metrics
