#include "services/transport_security.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace kappa::services {
namespace {

absl::StatusOr<std::string> ReadSecurityFile(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (contents.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": '", path, "' is empty"));
  }
  return contents.str();
}

const char* FindVariable(const char* const* environment, const std::string& name) {
  const std::string prefix = name + "=";
  for (const char* const* entry = environment; entry != nullptr && *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, prefix.c_str(), prefix.size()) == 0) return *entry + prefix.size();
  }
  return nullptr;
}

// Comparing in constant time, so response timing does not reveal how many
// leading bytes of a guessed token were right.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

constexpr char kAuthorizationKey[] = "authorization";

std::string BearerValue(const std::string& token) { return absl::StrCat("Bearer ", token); }

class BearerTokenChecker final : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenChecker(const std::string& token) : expected_(BearerValue(token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    const auto it = auth_metadata.find(kAuthorizationKey);
    if (it == auth_metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing bearer token (metadata 'authorization: Bearer ...')");
    }
    if (!ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()),
                            expected_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
    }
    // Consumed: the handlers never see the token.
    consumed_auth_metadata->insert({kAuthorizationKey, expected_});
    return grpc::Status::OK;
  }

 private:
  const std::string expected_;
};

class BearerTokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerTokenPlugin(const std::string& token) : value_(BearerValue(token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status GetMetadata(grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
                           const grpc::AuthContext& /*channel_auth_context*/,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({kAuthorizationKey, value_});
    return grpc::Status::OK;
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<TransportSecurity> LoadTransportSecurity(const Config::Security& config,
                                                        const char* const* environment) {
  TransportSecurity security;
  security.tls = config.tls;
  security.mutual_tls = config.mutual_tls;
  security.server_name = config.server_name;

  const char* token_variable = FindVariable(environment, kAuthTokenEnvironmentVariable);
  if (!config.token_file.empty() && token_variable != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.token_file and $", kAuthTokenEnvironmentVariable,
                     " are both set; set one"));
  }
  if (!config.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSecurityFile("security.token_file", config.token_file);
    if (!token.ok()) return token.status();
    security.bearer_token = std::string(absl::StripTrailingAsciiWhitespace(*token));
    if (security.bearer_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("security.token_file: '", config.token_file, "' holds only whitespace"));
    }
  } else if (token_variable != nullptr) {
    security.bearer_token = std::string(absl::StripTrailingAsciiWhitespace(token_variable));
    if (security.bearer_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("$", kAuthTokenEnvironmentVariable, " is set but empty"));
    }
  }

  if (!security.tls) {
    if (security.mutual_tls) {
      return absl::InvalidArgumentError("security.mutual_tls needs security.tls=true");
    }
    if (!security.bearer_token.empty()) {
      return absl::InvalidArgumentError(
          "a bearer token needs security.tls=true: in plain text it can be read by anyone "
          "on the network path");
    }
    return security;
  }
  for (const auto& [key, path, target] :
       {std::tuple{"security.cert_file", &config.cert_file, &security.certificate_chain},
        std::tuple{"security.key_file", &config.key_file, &security.private_key},
        std::tuple{"security.ca_file", &config.ca_file, &security.root_certificates}}) {
    if (path->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(key, " is required when security.tls=true"));
    }
    absl::StatusOr<std::string> contents = ReadSecurityFile(key, *path);
    if (!contents.ok()) return contents.status();
    *target = *std::move(contents);
  }
  return security;
}

absl::StatusOr<TransportSecurity> LoadTransportSecurity(const Config::Security& security) {
  return LoadTransportSecurity(security, environ);
}

std::string DescribeTransport(const TransportSecurity& security) {
  return absl::StrCat(!security.tls ? "plain text" : security.mutual_tls ? "mutual TLS" : "TLS",
                      security.bearer_token.empty() ? "" : " + bearer token");
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportSecurity& security) {
  if (!security.tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      security.mutual_tls ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (security.mutual_tls) options.pem_root_certs = security.root_certificates;
  options.pem_key_cert_pairs.push_back({security.private_key, security.certificate_chain});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  // An AuthMetadataProcessor rather than a server interceptor: a synchronous
  // server's interceptors cannot fail a call before its handler runs, and the
  // processor is gRPC's hook for exactly this check. It needs secure
  // credentials, which a token requires anyway (LoadTransportSecurity).
  if (!security.bearer_token.empty()) {
    credentials->SetAuthMetadataProcessor(
        std::make_shared<BearerTokenChecker>(security.bearer_token));
  }
  return credentials;
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const TransportSecurity& security) {
  if (!security.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = security.root_certificates;
  if (security.mutual_tls) {
    options.pem_private_key = security.private_key;
    options.pem_cert_chain = security.certificate_chain;
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  if (security.bearer_token.empty()) return credentials;
  return grpc::CompositeChannelCredentials(
      credentials, grpc::MetadataCredentialsFromPlugin(
                       std::make_unique<BearerTokenPlugin>(security.bearer_token)));
}

}  // namespace kappa::services
