// The one place statuses convert between abseil and gRPC.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "services/transport_security.h"

namespace kappa::services {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Channel to `target` ("host:port" or "dns:///name:port") with round-robin
// load balancing, keepalive, the credentials of `security`, and the given
// max message size.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const TransportSecurity& security = {},
                                           int max_message_bytes = 64 << 20);

}  // namespace kappa::services
