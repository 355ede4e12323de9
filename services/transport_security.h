// Transport security of every gRPC server and channel: TLS, optional mutual
// TLS, and a bearer token each call carries and each server checks. The one
// place credentials are built; GrpcServer, MakeChannel and CheckHealth take a
// TransportSecurity and never construct credentials themselves.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/config.h"

namespace kappa::services {

// Default: plain text, no token (loopback runs, tests).
struct TransportSecurity {
  bool tls = false;
  std::string certificate_chain;  // PEM: this process's certificate (server; client under mutual TLS)
  std::string private_key;        // PEM key of certificate_chain
  std::string root_certificates;  // PEM CAs the peer's certificate must chain to
  bool mutual_tls = false;        // servers require and verify a client certificate
  std::string server_name;        // clients verify this name instead of the target's host
  std::string bearer_token;       // empty: calls carry none and servers check none
};

// The environment variable a bearer token may come from instead of
// security.token_file.
inline constexpr char kAuthTokenEnvironmentVariable[] = "KAPPA_AUTH_TOKEN";

// Reads the files `security` names. The token comes from security.token_file
// or, when that is empty, from $KAPPA_AUTH_TOKEN (`environ`-style array, so
// tests pass their own); trailing whitespace is stripped. INVALID_ARGUMENT
// naming the key for: an unreadable or empty file, both token sources set,
// mutual_tls or a token without tls (a token in plain text can be read by
// anyone on the path), tls without cert_file/key_file/ca_file.
absl::StatusOr<TransportSecurity> LoadTransportSecurity(const Config::Security& security,
                                                        const char* const* environment);
// The same, from this process's environment.
absl::StatusOr<TransportSecurity> LoadTransportSecurity(const Config::Security& security);

// For start-up logs: "plain text", "TLS", "mutual TLS", each possibly
// followed by " + bearer token".
std::string DescribeTransport(const TransportSecurity& security);

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportSecurity& security);
// Target-independent part of a channel; MakeChannel adds server_name.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const TransportSecurity& security);

}  // namespace kappa::services
