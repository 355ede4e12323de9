// A VerifierService behind a real gRPC server on a loopback port, with its
// metrics registry, for the tests that talk to the verifier over the wire.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/grpc_util.h"
#include "services/metrics.h"
#include "services/server.h"
#include "verifier/verifier_metrics.h"
#include "verifier/verifier_service.h"

namespace kappa::verifier::testing {

class ServedVerifierTest : public ::testing::Test {
 protected:
  // Call from SetUp (fatal failures return from it).
  // As kappa-verifier does, options.callers_authenticated follows
  // server_options (mutual TLS or tokens); `client` is the stub's side.
  void StartVerifier(VerifierOptions options, const services::ServerOptions& server_options = {},
                     const services::TransportSecurity& client = {}) {
    options.callers_authenticated = server_options.security.AuthenticatesClients();
    metrics_ = std::make_unique<VerifierMetrics>(registry_);
    service_ = std::make_unique<VerifierService>(options, metrics_.get());
    auto server = services::GrpcServer::Start("127.0.0.1:0", {service_.get()}, server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    stub_ = kappa::v1::Verifier::NewStub(services::MakeChannel(address_, client));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
  }

  grpc::Status Verify(const kappa::v1::VerifyRequest& request,
                      kappa::v1::VerifyResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + verify_deadline_);
    return stub_->Verify(&context, request, response);
  }

  static void AddItem(kappa::v1::VerifyRequest* request, const std::string& task,
                      const std::string& reference, const std::string& response,
                      const std::string& example_id = "") {
    kappa::v1::VerifyItem* item = request->add_items();
    item->set_task(task);
    item->set_reference_answer(reference);
    item->set_response_text(response);
    item->set_example_id(example_id);
  }

  services::metrics::Registry registry_;
  std::unique_ptr<VerifierMetrics> metrics_;
  std::unique_ptr<VerifierService> service_;
  std::unique_ptr<services::GrpcServer> server_;
  std::string address_;
  std::unique_ptr<kappa::v1::Verifier::Stub> stub_;
  std::chrono::seconds verify_deadline_{10};  // per Verify call
};

}  // namespace kappa::verifier::testing
