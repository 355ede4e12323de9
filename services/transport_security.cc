#include "services/transport_security.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

// Authentication and authorization of every call on a server that checks
// tokens: the caller's token must be one `accepted` names, and its role must
// admit the method (:path). Each comparison runs in constant time and all
// of them run, so timing says nothing about which token came close.
class RoleTokenChecker final : public grpc::AuthMetadataProcessor {
 public:
  explicit RoleTokenChecker(const std::vector<AcceptedToken>& accepted) {
    for (const AcceptedToken& token : accepted) {
      accepted_.push_back({token.role, BearerValue(token.token)});
    }
  }

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    const auto it = auth_metadata.find(kAuthorizationKey);
    if (it == auth_metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing bearer token (metadata 'authorization: Bearer ...')");
    }
    const std::string_view presented(it->second.data(), it->second.size());
    std::optional<Role> role;
    for (const AcceptedToken& token : accepted_) {
      if (ConstantTimeEquals(presented, token.token)) role = token.role;
    }
    if (!role.has_value()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
    }
    const auto path = auth_metadata.find(":path");
    const std::string_view method =
        path == auth_metadata.end() ? ""
                                    : std::string_view(path->second.data(), path->second.size());
    if (!RoleMayCall(*role, method)) {
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("the ", std::string(RoleName(*role)), " credential may not call ",
                       method.empty() ? "this method" : std::string(method),
                       " (it needs a worker token)"));
    }
    // Consumed: the handlers never see the token.
    consumed_auth_metadata->insert({kAuthorizationKey, std::string(presented)});
    return grpc::Status::OK;
  }

 private:
  std::vector<AcceptedToken> accepted_;  // tokens as "Bearer <token>"
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

// The <role>.token files of security.tokens_dir, by role; other files are
// not read.
absl::StatusOr<std::vector<AcceptedToken>> ReadTokensDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::directory_iterator it(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tokens_dir: cannot list '", dir, "': ", error.message()));
  }
  std::vector<std::filesystem::path> files;
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (it->path().extension() == ".token") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  std::vector<AcceptedToken> accepted;
  for (const std::filesystem::path& file : files) {
    const std::string stem = file.stem().string();
    const std::optional<Role> role = RoleFromName(stem);
    if (!role.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("security.tokens_dir: '", file.string(),
                                                     "': unknown role '", stem,
                                                     "' (the roles are worker and observer)"));
    }
    absl::StatusOr<std::string> contents = ReadSecurityFile("security.tokens_dir", file.string());
    if (!contents.ok()) return contents.status();
    const std::string token(absl::StripTrailingAsciiWhitespace(*contents));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("security.tokens_dir: '", file.string(), "' holds only whitespace"));
    }
    for (const AcceptedToken& earlier : accepted) {
      if (earlier.token == token) {
        return absl::InvalidArgumentError(
            absl::StrCat("security.tokens_dir: '", file.string(), "' holds the same token as ",
                         std::string(RoleName(earlier.role)), ".token; each role needs its own"));
      }
    }
    accepted.push_back({*role, token});
  }
  if (accepted.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tokens_dir: '", dir,
                     "' holds no <role>.token file (worker.token, observer.token)"));
  }
  return accepted;
}

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

  if (!config.tokens_dir.empty()) {
    absl::StatusOr<std::vector<AcceptedToken>> accepted = ReadTokensDir(config.tokens_dir);
    if (!accepted.ok()) return accepted.status();
    security.accepted_tokens = *std::move(accepted);
  } else if (!security.bearer_token.empty()) {
    security.accepted_tokens.push_back({Role::kWorker, security.bearer_token});
  }

  if (!security.tls) {
    if (security.mutual_tls) {
      return absl::InvalidArgumentError("security.mutual_tls needs security.tls=true");
    }
    if (!security.bearer_token.empty() || !security.accepted_tokens.empty()) {
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
  std::vector<std::string> roles;
  for (const AcceptedToken& token : security.accepted_tokens) {
    roles.emplace_back(RoleName(token.role));
  }
  const bool roles_of_their_own = !(security.accepted_tokens.size() == 1 &&
                                    security.accepted_tokens[0].token == security.bearer_token);
  return absl::StrCat(!security.tls         ? "plain text"
                      : security.mutual_tls ? "mutual TLS"
                                            : "TLS",
                      roles.empty() ? ""
                      : roles_of_their_own
                          ? absl::StrCat(" + tokens for ", absl::StrJoin(roles, ", "))
                          : " + bearer token");
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
  if (!security.accepted_tokens.empty()) {
    credentials->SetAuthMetadataProcessor(
        std::make_shared<RoleTokenChecker>(security.accepted_tokens));
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
