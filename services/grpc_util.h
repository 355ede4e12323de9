// The one place statuses convert between abseil and gRPC.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "services/transport_security.h"

namespace kappa::services {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// HTTP/2 keepalive (security.keepalive_*_ms): a ping after `time_ms`
// without traffic, the connection closed when its ack takes longer than
// `timeout_ms`. A peer that vanished without closing the connection is
// noticed within time_ms + timeout_ms.
struct Keepalive {
  int time_ms = 20000;
  int timeout_ms = 10000;
};

// Channel to `target` ("host:port" or "dns:///name:port") with round-robin
// load balancing, `keepalive`, the credentials of `security`, and the given
// max message size.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const TransportSecurity& security = {},
                                           int max_message_bytes = 64 << 20,
                                           const Keepalive& keepalive = {});

}  // namespace kappa::services
