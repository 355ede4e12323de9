// Transport security of every gRPC server and channel: TLS, optional mutual
// TLS, and a bearer token each call carries and each server checks, which
// grants the caller a role (services/rpc_roles.h). The one
// place credentials are built; GrpcServer, MakeChannel and CheckHealth take a
// TransportSecurity and never construct credentials themselves.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/config.h"
#include "services/rpc_roles.h"

namespace kappa::services {

// A token a server accepts and the role it grants.
struct AcceptedToken {
  Role role = Role::kWorker;
  std::string token;
};

// Default: plain text, no token (loopback runs, tests).
struct TransportSecurity {
  bool tls = false;
  std::string certificate_chain;  // PEM: this process's certificate (server; client under mutual TLS)
  std::string private_key;        // PEM key of certificate_chain
  std::string root_certificates;  // PEM CAs the peer's certificate must chain to
  bool mutual_tls = false;        // servers require and verify a client certificate
  std::string server_name;        // clients verify this name instead of the target's host
  std::string bearer_token;       // what this process's calls carry; empty: none
  // What servers accept, each token with its role (security.tokens_dir, else
  // bearer_token as a worker's). Empty: servers check no token.
  std::vector<AcceptedToken> accepted_tokens;

  // Whether a server checks who calls: a client certificate or a token.
  bool AuthenticatesClients() const { return mutual_tls || !accepted_tokens.empty(); }
};

// The environment variable a bearer token may come from instead of
// security.token_file.
inline constexpr char kAuthTokenEnvironmentVariable[] = "KAPPA_AUTH_TOKEN";

// Reads the files `security` names. The token this process presents comes
// from security.token_file or, when that is empty, from $KAPPA_AUTH_TOKEN
// (`environ`-style array, so tests pass their own); the tokens servers
// accept from security.tokens_dir's <role>.token files, else that same
// token as a worker's. Trailing whitespace is stripped. INVALID_ARGUMENT
// naming the key (and file) for: an unreadable or empty file, both token
// sources set, a tokens_dir without any <role>.token or with one of an
// unknown role, two roles with one token, mutual_tls or a token without tls
// (a token in plain text can be read by anyone on the path), tls without
// cert_file/key_file/ca_file.
absl::StatusOr<TransportSecurity> LoadTransportSecurity(const Config::Security& security,
                                                        const char* const* environment);
// The same, from this process's environment.
absl::StatusOr<TransportSecurity> LoadTransportSecurity(const Config::Security& security);

// For start-up logs: "plain text", "TLS", "mutual TLS", each possibly
// followed by " + bearer token" or " + tokens for worker, observer".
std::string DescribeTransport(const TransportSecurity& security);

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportSecurity& security);
// Target-independent part of a channel; MakeChannel adds server_name.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const TransportSecurity& security);

}  // namespace kappa::services
