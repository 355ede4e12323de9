// Malformed Score and Generate requests sent to a real TeacherService behind
// a real gRPC server on loopback (max message size set small on purpose).
// Each gets a precise status naming the field; a good Score already in the
// batcher while they arrive still returns the teacher's log-probs, and the
// server keeps serving. (teacher_service_test checks the field names of
// more malformed requests; this table pins whole messages per class of bad
// input, oversized messages included.)
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kappa/v1/teacher.grpc.pb.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "teacher_server/teacher_service.h"

namespace kappa::teacher {
namespace {

constexpr int kVocab = 21;
constexpr int kMaxPositions = 32;
constexpr int kMaxNewTokens = 16;
constexpr int kMaxRequestSequences = 8;
constexpr int kMaxMessageBytes = 16 << 10;

model::Decoder SmallModel() {
  model::ModelConfig config;
  config.name = "bad-input-teacher";
  config.vocab_size = kVocab;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.max_position_embeddings = kMaxPositions;
  torch::manual_seed(5);
  return model::Decoder(config);
}

// Three sequences the teacher scores.
kappa::v1::ScoreRequest GoodScore() {
  kappa::v1::ScoreRequest request;
  request.set_vocab_size(kVocab);
  const std::vector<std::vector<int32_t>> prompts = {{1, 3}, {1}, {1, 4, 5}};
  const std::vector<std::vector<int32_t>> responses = {{6, 2}, {7, 8}, {9}};
  for (size_t i = 0; i < prompts.size(); ++i) {
    kappa::v1::ScoreSequence* sequence = request.add_sequences();
    for (int32_t token : prompts[i]) sequence->add_prompt_tokens(token);
    for (int32_t token : responses[i]) sequence->add_response_tokens(token);
  }
  return request;
}

kappa::v1::GenerateRequest GoodGenerate() {
  kappa::v1::GenerateRequest request;
  for (int32_t token : {1, 4, 5}) request.add_prompt_tokens(token);
  request.set_num_samples(2);
  request.set_max_new_tokens(4);
  request.set_seed(7);
  return request;
}

class TeacherBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TeacherOptions options;
    options.batching.max_batch_sequences = 8;
    // A long wait keeps the good Score in the batcher while the bad ones arrive.
    options.batching.max_wait = absl::Milliseconds(300);
    options.max_request_sequences = kMaxRequestSequences;
    options.max_new_tokens = kMaxNewTokens;
    auto service = TeacherService::Create(SmallModel(), options);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    services::ServerOptions server_options;
    server_options.max_message_bytes = kMaxMessageBytes;
    auto server = services::GrpcServer::Start("127.0.0.1:0", {service_.get()}, server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    stub_ = kappa::v1::Teacher::NewStub(services::MakeChannel(address_));
  }

  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
    if (service_) service_->Shutdown();
  }

  grpc::Status Score(const kappa::v1::ScoreRequest& request, kappa::v1::ScoreResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub_->Score(&context, request, response);
  }

  grpc::Status Generate(const kappa::v1::GenerateRequest& request,
                        kappa::v1::GenerateResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub_->Generate(&context, request, response);
  }

  std::unique_ptr<TeacherService> service_;
  std::unique_ptr<services::GrpcServer> server_;
  std::string address_;
  std::unique_ptr<kappa::v1::Teacher::Stub> stub_;
};

// The whole message for our own refusals; gRPC's own (an oversized
// message) is matched by a substring, since it carries the byte counts.
void ExpectRefused(const grpc::Status& status, grpc::StatusCode code, const std::string& message,
                   const char* name) {
  EXPECT_EQ(status.error_code(), code) << name << ": " << status.error_message();
  if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    EXPECT_NE(status.error_message().find(message), std::string::npos)
        << name << ": " << status.error_message();
  } else {
    EXPECT_EQ(status.error_message(), message) << name;
  }
}

struct BadScore {
  const char* name;
  std::function<void(kappa::v1::ScoreRequest&)> mutate;
  grpc::StatusCode code;
  std::string message;  // the whole message, or (oversized) a part of gRPC's own
};

TEST_F(TeacherBadInputTest, EachMalformedScoreIsRefusedByNameAndNothingIsLost) {
  const std::vector<BadScore> table = {
      {"wrong dtype", [](auto& r) { r.set_value_dtype(kappa::v1::DTYPE_INT32); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "value_dtype: int32 unsupported; use DTYPE_FLOAT32 or DTYPE_BFLOAT16"},
      {"vocabulary mismatch", [](auto& r) { r.set_vocab_size(20); },
       grpc::StatusCode::INVALID_ARGUMENT, "vocab_size: student has 20, teacher has 21"},
      {"empty response", [](auto& r) { r.mutable_sequences(2)->clear_response_tokens(); },
       grpc::StatusCode::INVALID_ARGUMENT, "sequences[2].response_tokens: empty"},
      {"response longer than the context",
       [](auto& r) {
         for (int i = 0; i < 36; ++i) r.mutable_sequences(1)->add_response_tokens(3);
       },
       grpc::StatusCode::INVALID_ARGUMENT,
       "sequences[1]: 39 tokens (prompt 1 + response 38) exceed max_position_embeddings 32"},
      {"token id out of range", [](auto& r) { r.mutable_sequences(1)->set_response_tokens(1, 999); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "sequences[1].response_tokens[1]: token id 999 out of range [0, 21)"},
      {"too many sequences",
       [](auto& r) {
         while (r.sequences_size() <= kMaxRequestSequences) *r.add_sequences() = r.sequences(0);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "sequences: 9 exceed the limit of 8 per request"},
      {"oversized message",
       [](auto& r) {
         for (int i = 0; i < kMaxMessageBytes; ++i) r.mutable_sequences(0)->add_prompt_tokens(1);
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "larger than max"},
  };

  // The good request's answer, then the same request again, in flight while
  // the bad ones arrive (the batcher holds it for max_wait).
  kappa::v1::ScoreResponse before;
  ASSERT_TRUE(Score(GoodScore(), &before).ok());
  kappa::v1::ScoreResponse during;
  std::future<grpc::Status> in_flight =
      std::async(std::launch::async, [&] { return Score(GoodScore(), &during); });

  for (const BadScore& bad : table) {
    kappa::v1::ScoreRequest request = GoodScore();
    bad.mutate(request);
    kappa::v1::ScoreResponse response;
    const grpc::Status status = Score(request, &response);
    ExpectRefused(status, bad.code, bad.message, bad.name);
    EXPECT_EQ(response.sequences_size(), 0) << bad.name;
  }

  const grpc::Status in_flight_status = in_flight.get();
  ASSERT_TRUE(in_flight_status.ok()) << in_flight_status.error_message();
  EXPECT_EQ(during.SerializeAsString(), before.SerializeAsString());
  kappa::v1::ScoreResponse after;
  ASSERT_TRUE(Score(GoodScore(), &after).ok());
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString());
  EXPECT_TRUE(services::CheckHealth(address_, absl::Seconds(2)).ok());
}

struct BadGenerate {
  const char* name;
  std::function<void(kappa::v1::GenerateRequest&)> mutate;
  grpc::StatusCode code;
  std::string message;
};

TEST_F(TeacherBadInputTest, EachMalformedGenerateIsRefusedByName) {
  const std::vector<BadGenerate> table = {
      {"empty prompt", [](auto& r) { r.clear_prompt_tokens(); },
       grpc::StatusCode::INVALID_ARGUMENT, "prompt_tokens: empty"},
      {"token id out of range", [](auto& r) { r.set_prompt_tokens(1, -4); },
       grpc::StatusCode::INVALID_ARGUMENT, "prompt_tokens[1]: token id -4 out of range [0, 21)"},
      {"longer than the configured max", [](auto& r) { r.set_max_new_tokens(kMaxNewTokens + 1); },
       grpc::StatusCode::INVALID_ARGUMENT, "max_new_tokens: must be in [1, 16], got 17"},
      {"NaN temperature", [](auto& r) { r.set_temperature(std::nanf("")); },
       grpc::StatusCode::INVALID_ARGUMENT, "temperature: must be > 0 (0 means 1.0), got nan"},
      {"oversized message",
       [](auto& r) {
         for (int i = 0; i < kMaxMessageBytes; ++i) r.add_prompt_tokens(1);
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "larger than max"},
  };
  for (const BadGenerate& bad : table) {
    kappa::v1::GenerateRequest request = GoodGenerate();
    bad.mutate(request);
    kappa::v1::GenerateResponse response;
    const grpc::Status status = Generate(request, &response);
    ExpectRefused(status, bad.code, bad.message, bad.name);
    EXPECT_EQ(response.samples_size(), 0) << bad.name;
  }
  kappa::v1::GenerateResponse response;
  ASSERT_TRUE(Generate(GoodGenerate(), &response).ok());
  EXPECT_EQ(response.samples_size(), 2);
}

}  // namespace
}  // namespace kappa::teacher
