// TLS, mutual TLS and the bearer token, against a real server on loopback
// with certificates made by `openssl` for this test.
#include "services/transport_security.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kappa/v1/learner.grpc.pb.h"
#include "kappa/v1/teacher.grpc.pb.h"
#include "kappa/v1/verifier.grpc.pb.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "tests/services/test_pki.h"

namespace kappa::services {
namespace {

using ::kappa::testing::MakeTestPki;
using ::kappa::testing::TestPki;

const char* const kNoEnvironment[] = {nullptr};

class TransportSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/kappa_pki_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    pki_ = new TestPki(MakeTestPki(dir));
    ASSERT_FALSE(pki_->dir.empty()) << "openssl failed; see " << dir << "/openssl.log";
  }
  static void TearDownTestSuite() {
    if (pki_ != nullptr && !pki_->dir.empty()) std::filesystem::remove_all(pki_->dir);
    delete pki_;
    pki_ = nullptr;
  }

  // The settings a process would load: this process's certificate and key
  // (`identity` = "server", "client" or "rogue-client"), the CA it trusts.
  static Config::Security Settings(const std::string& identity, const std::string& ca = "ca") {
    Config::Security settings;
    settings.tls = true;
    settings.cert_file = pki_->Path(identity + ".crt");
    settings.key_file = pki_->Path(identity + ".key");
    settings.ca_file = pki_->Path(ca + ".crt");
    return settings;
  }
  static TransportSecurity Load(const Config::Security& settings,
                                const char* const* environment = kNoEnvironment) {
    absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(settings, environment);
    EXPECT_TRUE(security.ok()) << security.status();
    return security.ok() ? *security : TransportSecurity{};
  }

  void Serve(const TransportSecurity& security) {
    ServerOptions options;
    options.security = security;
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::Start("127.0.0.1:0", {&service_}, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  std::string Address() const { return absl::StrCat("127.0.0.1:", server_->port()); }

  // A Verify call. The service is the generated base class, so a call that
  // gets through transport and authentication ends UNIMPLEMENTED.
  grpc::Status Call(const TransportSecurity& client) {
    auto stub = kappa::v1::Verifier::NewStub(MakeChannel(Address(), client));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    kappa::v1::VerifyRequest request;
    kappa::v1::VerifyResponse response;
    return stub->Verify(&context, request, &response);
  }

  static TestPki* pki_;
  kappa::v1::Verifier::Service service_;
  std::unique_ptr<GrpcServer> server_;
};

TestPki* TransportSecurityTest::pki_ = nullptr;

constexpr grpc::StatusCode kReachedTheHandler = grpc::StatusCode::UNIMPLEMENTED;

TEST_F(TransportSecurityTest, TlsServerTalksOnlyToClientsThatTrustItsCa) {
  Serve(Load(Settings("server")));
  Config::Security client;
  client.tls = true;
  client.ca_file = pki_->Path("ca.crt");
  // A client needs no certificate of its own without mutual TLS; the loader
  // still wants all three files, so give it the client's.
  client.cert_file = pki_->Path("client.crt");
  client.key_file = pki_->Path("client.key");
  EXPECT_EQ(Call(Load(client)).error_code(), kReachedTheHandler);
  EXPECT_TRUE(CheckHealth(Address(), absl::Seconds(5), Load(client)).ok());

  EXPECT_EQ(Call(TransportSecurity{}).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a plain-text client must not get through";
  client.ca_file = pki_->Path("rogue-ca.crt");
  EXPECT_EQ(Call(Load(client)).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client must refuse a server its CA did not sign";
}

TEST_F(TransportSecurityTest, ServerNameIsWhatTheClientVerifies) {
  Serve(Load(Settings("server")));
  TransportSecurity client = Load(Settings("client"));
  client.server_name = "localhost";  // in the certificate's subjectAltName
  EXPECT_EQ(Call(client).error_code(), kReachedTheHandler);
  client.server_name = "learner.example.com";  // not in it
  EXPECT_EQ(Call(client).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TransportSecurityTest, MutualTlsWantsAClientCertificateFromTheCa) {
  Config::Security server = Settings("server");
  server.mutual_tls = true;
  Serve(Load(server));

  Config::Security client = Settings("client");
  client.mutual_tls = true;
  EXPECT_EQ(Call(Load(client)).error_code(), kReachedTheHandler);

  client.mutual_tls = false;  // TLS, but no client certificate presented
  EXPECT_EQ(Call(Load(client)).error_code(), grpc::StatusCode::UNAVAILABLE);

  Config::Security rogue = Settings("rogue-client");  // trusts our CA, signed by another
  rogue.ca_file = pki_->Path("ca.crt");
  rogue.mutual_tls = true;
  EXPECT_EQ(Call(Load(rogue)).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TransportSecurityTest, BearerTokenMissingOrWrongIsUnauthenticated) {
  const std::string token_file = pki_->Path("token");
  std::ofstream(token_file) << "s3cret-token\n";  // the newline is stripped
  Config::Security server = Settings("server");
  server.token_file = token_file;
  Serve(Load(server));

  const char* const right[] = {"KAPPA_AUTH_TOKEN=s3cret-token", nullptr};
  EXPECT_EQ(Call(Load(Settings("client"), right)).error_code(), kReachedTheHandler);
  EXPECT_TRUE(CheckHealth(Address(), absl::Seconds(5), Load(Settings("client"), right)).ok());

  const grpc::Status missing = Call(Load(Settings("client")));
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED) << missing.error_message();
  EXPECT_NE(missing.error_message().find("missing bearer token"), std::string::npos)
      << missing.error_message();
  const char* const wrong[] = {"KAPPA_AUTH_TOKEN=s3cret-tokem", nullptr};
  const grpc::Status rejected = Call(Load(Settings("client"), wrong));
  EXPECT_EQ(rejected.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << rejected.error_message();
  EXPECT_EQ(rejected.error_message(), "wrong bearer token");
  EXPECT_FALSE(CheckHealth(Address(), absl::Seconds(5), Load(Settings("client"), wrong)).ok());
}

// Issue 45: roles. A worker token reaches every RPC; an observer token only
// health (and Teacher.Info): WatchPolicy (the full weights) and Rollout (the
// gold answers) refuse it with PERMISSION_DENIED naming the method, before
// any handler runs; no token or a foreign one is UNAUTHENTICATED.
TEST_F(TransportSecurityTest, EachTokenGrantsItsRoleAndTheRoleDecidesTheMethods) {
  const std::string dir = pki_->Path("tokens");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/worker.token") << "worker-secret\n";
  std::ofstream(dir + "/observer.token") << "observer-secret";
  std::ofstream(dir + "/ca.crt") << "not a token: ignored";
  Config::Security server = Settings("server");
  server.tokens_dir = dir;
  server.mutual_tls = true;
  kappa::v1::Learner::Service learner;
  {
    ServerOptions options;
    options.security = Load(server);
    ASSERT_EQ(options.security.accepted_tokens.size(), 2u);
    EXPECT_EQ(DescribeTransport(options.security), "mutual TLS + tokens for observer, worker");
    absl::StatusOr<std::unique_ptr<GrpcServer>> started =
        GrpcServer::Start("127.0.0.1:0", {&service_, &learner}, options);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
  }
  auto client = [&](const std::string& token) {
    Config::Security settings = Settings("client");
    settings.mutual_tls = true;
    const std::string variable = "KAPPA_AUTH_TOKEN=" + token;
    const char* const environment[] = {variable.c_str(), nullptr};
    return Load(settings, token.empty() ? kNoEnvironment : environment);
  };
  auto watch = [&](const TransportSecurity& security) {
    auto stub = kappa::v1::Learner::NewStub(MakeChannel(Address(), security));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    kappa::v1::WatchPolicyRequest request;
    auto reader = stub->WatchPolicy(&context, request);
    kappa::v1::PolicyChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  auto rollout = [&](const TransportSecurity& security) {
    auto stub = kappa::v1::Learner::NewStub(MakeChannel(Address(), security));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto stream = stub->Rollout(&context);
    stream->WritesDone();
    kappa::v1::LearnerMessage message;
    while (stream->Read(&message)) {
    }
    return stream->Finish();
  };

  const TransportSecurity worker = client("worker-secret");
  EXPECT_EQ(Call(worker).error_code(), kReachedTheHandler);
  EXPECT_EQ(watch(worker).error_code(), kReachedTheHandler);
  EXPECT_EQ(rollout(worker).error_code(), kReachedTheHandler);
  EXPECT_TRUE(CheckHealth(Address(), absl::Seconds(5), worker).ok());

  const TransportSecurity observer = client("observer-secret");
  EXPECT_TRUE(CheckHealth(Address(), absl::Seconds(5), observer).ok());
  for (const auto& [method, status] : {std::pair{"/kappa.v1.Learner/WatchPolicy", watch(observer)},
                                       std::pair{"/kappa.v1.Learner/Rollout", rollout(observer)},
                                       std::pair{"/kappa.v1.Verifier/Verify", Call(observer)}}) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << method;
    EXPECT_EQ(status.error_message(), absl::StrCat("the observer credential may not call ", method,
                                                   " (it needs a worker token)"));
  }

  for (const TransportSecurity& stranger : {client(""), client("worker-secreT")}) {
    EXPECT_EQ(watch(stranger).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Call(stranger).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_FALSE(CheckHealth(Address(), absl::Seconds(5), stranger).ok());
  }
}

// Every RPC kappa serves admits a worker; of them an observer may call only
// Teacher.Info (a new RPC is worker-only until the table says otherwise).
TEST(RpcRolesTest, EveryKappaRpcAdmitsWorkersAndObserversOnlyInfoAndHealth) {
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  kappa::v1::Learner::Service learner;  // links the descriptors in
  kappa::v1::Teacher::Service teacher;
  kappa::v1::Verifier::Service verifier;
  int methods = 0;
  for (const char* name : {"kappa.v1.Learner", "kappa.v1.Teacher", "kappa.v1.Verifier"}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string path = absl::StrCat("/", name, "/", service->method(i)->name());
      ++methods;
      EXPECT_TRUE(RoleMayCall(Role::kWorker, path)) << path;
      EXPECT_EQ(RoleMayCall(Role::kObserver, path), path == "/kappa.v1.Teacher/Info") << path;
    }
  }
  EXPECT_GE(methods, 7);
  EXPECT_TRUE(RoleMayCall(Role::kObserver, "/grpc.health.v1.Health/Check"));
  EXPECT_FALSE(RoleMayCall(Role::kObserver, ""));
  EXPECT_EQ(RoleFromName("observer"), Role::kObserver);
  EXPECT_EQ(RoleFromName("admin"), std::nullopt);
}

TEST(LoadTransportSecurityTest, PlainTextByDefault) {
  absl::StatusOr<TransportSecurity> security =
      LoadTransportSecurity(Config::Security{}, kNoEnvironment);
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_FALSE(security->tls);
  EXPECT_TRUE(security->bearer_token.empty());
}

TEST(LoadTransportSecurityTest, BadSettingsNameTheKey) {
  const char* const token[] = {"KAPPA_AUTH_TOKEN=abc", nullptr};
  const char* const empty_token[] = {"KAPPA_AUTH_TOKEN=", nullptr};
  struct Case {
    std::string name;
    Config::Security settings;
    const char* const* environment;
    std::string message;
  };
  Config::Security tls;
  tls.tls = true;
  Config::Security missing_file = tls;
  missing_file.cert_file = missing_file.key_file = missing_file.ca_file = "/nonexistent/x.pem";
  Config::Security mutual_plain;
  mutual_plain.mutual_tls = true;
  Config::Security token_file_and_variable;
  token_file_and_variable.token_file = "/nonexistent/token";
  const std::vector<Case> cases = {
      {"tls without files", tls, kNoEnvironment,
       "security.cert_file is required when security.tls=true"},
      {"unreadable certificate", missing_file, kNoEnvironment,
       "security.cert_file: cannot read '/nonexistent/x.pem'"},
      {"token in plain text", Config::Security{}, token, "a bearer token needs security.tls=true"},
      {"mutual without tls", mutual_plain, kNoEnvironment,
       "security.mutual_tls needs security.tls=true"},
      {"two token sources", token_file_and_variable, token,
       "security.token_file and $KAPPA_AUTH_TOKEN are both set"},
      {"unreadable token file", token_file_and_variable, kNoEnvironment,
       "security.token_file: cannot read '/nonexistent/token'"},
      {"empty token variable", Config::Security{}, empty_token, "$KAPPA_AUTH_TOKEN is set but empty"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(c.settings, c.environment);
    EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(security.status().message().find(c.message), std::string::npos)
        << c.name << ": " << security.status();
  }
}

TEST(LoadTransportSecurityTest, BadTokensDirNamesTheFile) {
  char root[] = "/tmp/kappa_tokens_XXXXXX";
  ASSERT_NE(mkdtemp(root), nullptr);
  auto dir_with = [&](const std::string& name,
                      const std::vector<std::pair<std::string, std::string>>& files) {
    const std::string dir = std::string(root) + "/" + name;
    std::filesystem::create_directories(dir);
    for (const auto& [file, contents] : files) std::ofstream(dir + "/" + file) << contents;
    return dir;
  };
  struct Case {
    std::string dir;
    std::string message;
  };
  const std::vector<Case> cases = {
      {dir_with("unknown", {{"worker.token", "a"}, {"admin.token", "b"}}),
       "security.tokens_dir: '" + std::string(root) +
           "/unknown/admin.token': unknown role 'admin' (the roles are worker and observer)"},
      {dir_with("none", {{"ca.crt", "x"}}), "/none' holds no <role>.token file"},
      {dir_with("blank", {{"observer.token", " \n"}}),
       "/blank/observer.token' holds only whitespace"},
      {dir_with("shared", {{"observer.token", "same"}, {"worker.token", "same\n"}}),
       "/shared/worker.token' holds the same token as observer.token; each role needs its own"},
      {std::string(root) + "/missing", "security.tokens_dir: cannot list '"},
  };
  for (const Case& c : cases) {
    Config::Security settings;
    settings.tokens_dir = c.dir;
    absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(settings, kNoEnvironment);
    EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument) << c.dir;
    EXPECT_NE(security.status().message().find(c.message), std::string::npos)
        << c.dir << ": " << security.status();
  }
  // Good tokens, but in plain text.
  Config::Security plain;
  plain.tokens_dir = dir_with("good", {{"worker.token", "w"}});
  EXPECT_NE(LoadTransportSecurity(plain, kNoEnvironment)
                .status()
                .message()
                .find("a bearer token needs security.tls=true"),
            std::string::npos);
  std::filesystem::remove_all(root);
}

TEST(ServerOptionsFromConfigTest, MessageLimitMustFitGrpc) {
  Config config;
  config.security.max_message_bytes = 1 << 20;
  absl::StatusOr<ServerOptions> options = ServerOptionsFromConfig(config);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->max_message_bytes, 1 << 20);
  config.security.max_message_bytes = int64_t{1} << 40;
  options = ServerOptionsFromConfig(config);
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("security.max_message_bytes"), std::string::npos);
}

TEST(ServerOptionsFromConfigTest, KeepaliveComesFromTheConfigWithinBounds) {
  Config config;
  absl::StatusOr<ServerOptions> options = ServerOptionsFromConfig(config);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->keepalive.time_ms, 20000);
  EXPECT_EQ(options->keepalive.timeout_ms, 10000);
  config.security.keepalive_time_ms = 5000;
  config.security.keepalive_timeout_ms = 2000;
  options = ServerOptionsFromConfig(config);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->keepalive.time_ms, 5000);
  EXPECT_EQ(options->keepalive.timeout_ms, 2000);
  config.security.keepalive_time_ms = 10;  // a ping storm
  options = ServerOptionsFromConfig(config);
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("security.keepalive_time_ms"), std::string::npos);
  config.security.keepalive_time_ms = 5000;
  config.security.keepalive_timeout_ms = 0;
  options = ServerOptionsFromConfig(config);
  EXPECT_NE(options.status().message().find("security.keepalive_timeout_ms"), std::string::npos);
}

}  // namespace
}  // namespace kappa::services
