// The teacher over a real gRPC server on loopback, with a small random-init
// model saved to (and loaded from) a temporary checkpoint.
#include "teacher_server/teacher_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kappa/v1/teacher.grpc.pb.h"
#include "model/checkpoint.h"
#include "model/model_config.h"
#include "services/server.h"
#include "services/tensor_codec.h"
#include "services/torch_tensor_codec.h"
#include "tests/services/promtool.h"

namespace kappa::teacher {
namespace {

constexpr int kVocab = 21;
constexpr int kMaxPositions = 32;

model::ModelConfig SmallConfig() {
  model::ModelConfig config;
  config.name = "test-teacher";
  config.vocab_size = kVocab;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.max_position_embeddings = kMaxPositions;
  return config;
}

std::vector<float> Floats(const kappa::v1::Tensor& t) {
  if (t.dtype() == kappa::v1::DTYPE_FLOAT32) return services::GetFloat32(t);
  // bfloat16: the upper half of a binary32.
  std::vector<float> out(t.data().size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t half;
    std::memcpy(&half, t.data().data() + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    std::memcpy(&out[i], &bits, 4);
  }
  return out;
}

std::vector<int32_t> Ints(const kappa::v1::Tensor& t) {
  std::vector<int32_t> out(t.data().size() / 4);
  std::memcpy(out.data(), t.data().data(), t.data().size());
  return out;
}

std::vector<int64_t> Shape(const kappa::v1::Tensor& t) { return {t.shape().begin(), t.shape().end()}; }

class TeacherServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    checkpoint_dir_ = new std::string(
        (std::filesystem::temp_directory_path() / ("kappa_teacher_test_" + std::to_string(getpid())))
            .string());
    torch::manual_seed(3);
    model::Decoder model(SmallConfig());
    model::SaveCheckpoint(*checkpoint_dir_, model);

    TeacherOptions options;
    options.batching.max_batch_sequences = 8;
    options.batching.max_wait = absl::Milliseconds(5);
    options.max_new_tokens = 16;
    registry_ = new services::metrics::Registry();
    metrics_ = new TeacherMetrics(*registry_);
    auto service =
        TeacherService::Create(model::LoadCheckpoint(*checkpoint_dir_), options, metrics_);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = service->release();
    auto server = services::GrpcServer::Start("127.0.0.1:0", {service_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    reference_ = new model::Decoder(model::LoadCheckpoint(*checkpoint_dir_));
    (*reference_)->eval();
  }

  static void TearDownTestSuite() {
    server_->Shutdown(absl::Seconds(1));
    delete server_;
    delete service_;
    delete metrics_;
    delete registry_;
    delete reference_;
    std::filesystem::remove_all(*checkpoint_dir_);
    delete checkpoint_dir_;
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  std::unique_ptr<kappa::v1::Teacher::Stub> Stub() const {
    return kappa::v1::Teacher::NewStub(
        grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
  }

  static void SetDeadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  // Teacher log-probs [T, V] of one sequence, computed directly.
  static torch::Tensor Reference(const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& response) {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> ids(prompt.begin(), prompt.end());
    ids.insert(ids.end(), response.begin(), response.end());
    torch::Tensor logits = (*reference_)->forward(torch::tensor(ids, torch::kLong).unsqueeze(0))[0];
    const int64_t p = static_cast<int64_t>(prompt.size());
    return torch::log_softmax(
        logits.slice(0, p - 1, p - 1 + static_cast<int64_t>(response.size())), -1);
  }

  static kappa::v1::ScoreRequest Request(const std::vector<std::vector<int32_t>>& prompts,
                                         const std::vector<std::vector<int32_t>>& responses) {
    kappa::v1::ScoreRequest request;
    request.set_vocab_size(kVocab);
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto* s = request.add_sequences();
      for (int32_t t : prompts[i]) s->add_prompt_tokens(t);
      for (int32_t t : responses[i]) s->add_response_tokens(t);
    }
    return request;
  }

  grpc::Status Score(const kappa::v1::ScoreRequest& request, kappa::v1::ScoreResponse* response) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return Stub()->Score(&ctx, request, response);
  }

  grpc::Status Generate(const kappa::v1::GenerateRequest& request,
                        kappa::v1::GenerateResponse* response) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return Stub()->Generate(&ctx, request, response);
  }

  static std::string* checkpoint_dir_;
  static TeacherService* service_;
  static services::GrpcServer* server_;
  static model::Decoder* reference_;
  static services::metrics::Registry* registry_;
  static TeacherMetrics* metrics_;
};

std::string* TeacherServiceTest::checkpoint_dir_ = nullptr;
TeacherService* TeacherServiceTest::service_ = nullptr;
services::GrpcServer* TeacherServiceTest::server_ = nullptr;
model::Decoder* TeacherServiceTest::reference_ = nullptr;
services::metrics::Registry* TeacherServiceTest::registry_ = nullptr;
TeacherMetrics* TeacherServiceTest::metrics_ = nullptr;

TEST_F(TeacherServiceTest, HealthIsServing) {
  EXPECT_TRUE(services::CheckHealth(Address(), absl::Seconds(5)).ok());
}

TEST_F(TeacherServiceTest, InfoReportsModel) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  kappa::v1::InfoResponse info;
  ASSERT_TRUE(Stub()->Info(&ctx, kappa::v1::InfoRequest(), &info).ok());
  EXPECT_EQ(info.vocab_size(), kVocab);
  EXPECT_EQ(info.max_sequence_length(), kMaxPositions);
  EXPECT_EQ(info.model_name(), "test-teacher");
}

TEST_F(TeacherServiceTest, ConcurrentScoreReturnsTheTeachersLogProbs) {
  constexpr int kClients = 4;
  constexpr int kRounds = 3;
  std::atomic<int> checked{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        // Different lengths per client and round, 3 sequences per request.
        std::vector<std::vector<int32_t>> prompts, responses;
        for (int s = 0; s < 3; ++s) {
          std::vector<int32_t> p = {1}, y;
          for (int k = 0; k < 1 + (c + s) % 4; ++k) p.push_back(3 + (c * 5 + k + r) % 17);
          for (int k = 0; k < 2 + (c + r + s) % 5; ++k) y.push_back(3 + (c + 7 * k + s) % 17);
          y.push_back(2);
          prompts.push_back(p);
          responses.push_back(y);
        }
        kappa::v1::ScoreResponse response;
        const grpc::Status status = Score(Request(prompts, responses), &response);
        ASSERT_TRUE(status.ok()) << status.error_message();
        ASSERT_EQ(response.vocab_size(), kVocab);
        ASSERT_EQ(response.sequences_size(), 3);
        for (int s = 0; s < 3; ++s) {
          const auto& lp = response.sequences(s).logprobs();
          const int64_t t = static_cast<int64_t>(responses[s].size());
          ASSERT_EQ(lp.dtype(), kappa::v1::DTYPE_FLOAT32);
          ASSERT_EQ(Shape(lp), (std::vector<int64_t>{t, kVocab}));
          ASSERT_TRUE(services::ValidateTensor(lp, "logprobs").ok());
          const std::vector<float> got = Floats(lp);
          const torch::Tensor want = Reference(prompts[s], responses[s]).contiguous();
          const float* w = want.data_ptr<float>();
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_NEAR(got[i], w[i], 1e-5) << "client " << c << " seq " << s << " elem " << i;
          }
          ++checked;
        }
      }
    });
  }
  for (auto& client : clients) client.join();
  EXPECT_EQ(checked.load(), kClients * kRounds * 3);
}

// SCORE_FORM_HIDDEN: the final-normed hidden states whose head rows give
// the FULL form's log-probs, at D values a position, in either wire dtype;
// HIDDEN and FULL requests batched together each get their own form.
TEST_F(TeacherServiceTest, HiddenFormReturnsTheStatesTheHeadReads) {
  grpc::ClientContext info_ctx;
  SetDeadline(&info_ctx);
  kappa::v1::InfoResponse info;
  ASSERT_TRUE(Stub()->Info(&info_ctx, kappa::v1::InfoRequest(), &info).ok());
  const int64_t width = (*reference_)->config().hidden_size;
  EXPECT_EQ(info.hidden_size(), width);

  const std::vector<std::vector<int32_t>> prompts = {{1, 4, 5}, {1}};
  const std::vector<std::vector<int32_t>> responses = {{6, 7, 2}, {9, 2}};
  for (const auto dtype : {kappa::v1::DTYPE_FLOAT32, kappa::v1::DTYPE_BFLOAT16}) {
    kappa::v1::ScoreRequest hidden_request = Request(prompts, responses);
    hidden_request.set_form(kappa::v1::SCORE_FORM_HIDDEN);
    hidden_request.set_value_dtype(dtype);
    kappa::v1::ScoreResponse hidden, full;
    std::thread full_client([&] { ASSERT_TRUE(Score(Request(prompts, responses), &full).ok()); });
    ASSERT_TRUE(Score(hidden_request, &hidden).ok());
    full_client.join();
    ASSERT_EQ(hidden.sequences_size(), 2);
    for (int s = 0; s < 2; ++s) {
      const kappa::v1::ScoredSequence& rows = hidden.sequences(s);
      EXPECT_FALSE(rows.has_logprobs());
      const int64_t t = static_cast<int64_t>(responses[s].size());
      ASSERT_EQ(rows.hidden().dtype(), dtype);
      ASSERT_EQ(Shape(rows.hidden()), (std::vector<int64_t>{t, width}));
      const torch::Tensor h = *services::DecodeTensor(rows.hidden(), "hidden");
      // The head applied here, from the published semantics: log_softmax(h Wᵀ).
      torch::NoGradGuard no_grad;
      const torch::Tensor rebuilt = torch::log_softmax(
          torch::matmul(h.to(torch::kFloat32), (*reference_)->OutputWeight().t()), -1);
      const torch::Tensor want = Reference(prompts[s], responses[s]);
      const double tolerance = dtype == kappa::v1::DTYPE_FLOAT32 ? 1e-5 : 5e-2;
      EXPECT_LT((rebuilt - want).abs().max().item<double>(), tolerance) << "sequence " << s;
      EXPECT_EQ(Shape(full.sequences(s).logprobs()), (std::vector<int64_t>{t, kVocab}));
    }
  }
}

TEST_F(TeacherServiceTest, TopKAndSampledForms) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 4, 5}, {1}};
  const std::vector<std::vector<int32_t>> responses = {{6, 7, 2}, {9, 2}};

  kappa::v1::ScoreRequest request = Request(prompts, responses);
  request.set_form(kappa::v1::SCORE_FORM_TOPK);
  request.set_top_k(3);
  kappa::v1::ScoreResponse topk;
  ASSERT_TRUE(Score(request, &topk).ok());

  // The same with bfloat16 values: the tail mass stays float32.
  request.set_value_dtype(kappa::v1::DTYPE_BFLOAT16);
  kappa::v1::ScoreResponse topk_bf16;
  ASSERT_TRUE(Score(request, &topk_bf16).ok());

  request.set_form(kappa::v1::SCORE_FORM_SAMPLED);
  kappa::v1::ScoreResponse sampled;
  ASSERT_TRUE(Score(request, &sampled).ok());

  for (int s = 0; s < 2; ++s) {
    const int64_t t = static_cast<int64_t>(responses[s].size());
    const torch::Tensor want = Reference(prompts[s], responses[s]);

    const auto& values = topk.sequences(s).logprobs();
    const auto& ids = topk.sequences(s).topk_ids();
    ASSERT_EQ(Shape(values), (std::vector<int64_t>{t, 3}));
    ASSERT_EQ(Shape(ids), (std::vector<int64_t>{t, 3}));
    ASSERT_EQ(ids.dtype(), kappa::v1::DTYPE_INT32);
    const std::vector<float> v = Floats(values);
    const std::vector<int32_t> id = Ints(ids);
    for (int64_t row = 0; row < t; ++row) {
      const torch::Tensor expected = std::get<0>(want[row].topk(3));
      for (int j = 0; j < 3; ++j) {
        EXPECT_NEAR(v[row * 3 + j], expected[j].item<float>(), 1e-5);
        EXPECT_NEAR(v[row * 3 + j], want[row][id[row * 3 + j]].item<float>(), 1e-5);
      }
    }
    // log q(T): the reference row's mass outside its top 3, in double.
    for (const kappa::v1::ScoreResponse* response : {&topk, &topk_bf16}) {
      const kappa::v1::Tensor& tail = response->sequences(s).tail_logmass();
      ASSERT_EQ(tail.dtype(), kappa::v1::DTYPE_FLOAT32);
      ASSERT_EQ(Shape(tail), (std::vector<int64_t>{t}));
      const std::vector<float> got = Floats(tail);
      for (int64_t row = 0; row < t; ++row) {
        const torch::Tensor q = want[row].to(torch::kFloat64).exp();
        const double outside = 1.0 - std::get<0>(q.topk(3)).sum().item<double>();
        EXPECT_NEAR(got[row], std::log(outside), 1e-4) << "sequence " << s << " row " << row;
      }
    }

    const auto& lp = sampled.sequences(s).logprobs();
    ASSERT_EQ(lp.dtype(), kappa::v1::DTYPE_BFLOAT16);
    ASSERT_EQ(Shape(lp), (std::vector<int64_t>{t}));
    EXPECT_FALSE(sampled.sequences(s).has_topk_ids());
    const std::vector<float> got = Floats(lp);
    for (int64_t row = 0; row < t; ++row) {
      const float expected = want[row][responses[s][row]].item<float>();
      EXPECT_NEAR(got[row], expected, 0.01 * std::abs(expected) + 1e-3);  // bf16 precision
    }
  }
}

TEST_F(TeacherServiceTest, RequestLargerThanABatchIsSplit) {
  // 20 sequences with max_batch_sequences 8: three units, one response.
  std::vector<std::vector<int32_t>> prompts, responses;
  for (int i = 0; i < 20; ++i) {
    prompts.push_back({1, 3 + i % 10});
    responses.push_back({4 + i % 9, 2});
  }
  kappa::v1::ScoreRequest request = Request(prompts, responses);
  request.set_form(kappa::v1::SCORE_FORM_SAMPLED);
  kappa::v1::ScoreResponse response;
  ASSERT_TRUE(Score(request, &response).ok());
  ASSERT_EQ(response.sequences_size(), 20);
  for (int i = 0; i < 20; ++i) {
    const std::vector<float> got = Floats(response.sequences(i).logprobs());
    const torch::Tensor want = Reference(prompts[i], responses[i]);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_NEAR(got[0], want[0][responses[i][0]].item<float>(), 1e-5) << i;
  }
  EXPECT_LE(service_->batcher_stats().largest_batch, 8);
}

TEST_F(TeacherServiceTest, MetricsRecordCallsBatchesPositionsAndErrors) {
  using kappa::testing::SampleValue;
  const std::string before = registry_->Serialize();
  std::vector<std::vector<int32_t>> prompts, responses;
  for (int i = 0; i < 20; ++i) {
    prompts.push_back({1, 3 + i % 10});
    responses.push_back({4 + i % 9, 2, 5});
  }
  kappa::v1::ScoreRequest request = Request(prompts, responses);
  request.set_form(kappa::v1::SCORE_FORM_SAMPLED);
  kappa::v1::ScoreResponse response;
  ASSERT_TRUE(Score(request, &response).ok());
  kappa::v1::ScoreRequest bad = request;
  bad.mutable_sequences(0)->clear_response_tokens();
  EXPECT_FALSE(Score(bad, &response).ok());

  const std::string after = registry_->Serialize();
  auto delta = [&](const std::string& series) {
    return SampleValue(after, series) - SampleValue(before, series);
  };
  EXPECT_EQ(delta("kappa_teacher_requests_total{method=\"score\"}"), 2) << after;
  EXPECT_EQ(delta("kappa_teacher_request_errors_total{method=\"score\"}"), 1) << after;
  EXPECT_EQ(delta("kappa_teacher_score_seconds_count"), 2) << after;
  EXPECT_EQ(delta("kappa_teacher_tokens_total"), 60) << after;  // 20 responses x 3 positions
  // 20 sequences at max_batch_sequences 8: at least three forwards, none over 8.
  EXPECT_GE(delta("kappa_teacher_batch_size_count"), 3) << after;
  EXPECT_EQ(delta("kappa_teacher_batch_size_bucket{le=\"8\"}"),
            delta("kappa_teacher_batch_size_count"));
  EXPECT_EQ(delta("kappa_teacher_batch_size_sum"), 20);
  const auto [status, complaints] = kappa::testing::PromtoolCheckMetrics(after);
  EXPECT_EQ(complaints, "");
}

struct BadScore {
  const char* what;
  std::function<void(kappa::v1::ScoreRequest*)> mutate;
  const char* field;  // must appear in the error message
};

TEST_F(TeacherServiceTest, MalformedScoreRequestsAreInvalidArgument) {
  const std::vector<BadScore> cases = {
      {"no sequences", [](auto* r) { r->clear_sequences(); }, "sequences: empty"},
      {"empty response", [](auto* r) { r->mutable_sequences(2)->clear_response_tokens(); },
       "sequences[2].response_tokens: empty"},
      {"empty prompt", [](auto* r) { r->mutable_sequences(0)->clear_prompt_tokens(); },
       "sequences[0].prompt_tokens: empty"},
      {"id too large", [](auto* r) { r->mutable_sequences(1)->set_response_tokens(1, kVocab); },
       "sequences[1].response_tokens[1]"},
      {"negative id", [](auto* r) { r->mutable_sequences(0)->set_prompt_tokens(0, -1); },
       "sequences[0].prompt_tokens[0]"},
      {"vocab mismatch", [](auto* r) { r->set_vocab_size(20); },
       "vocab_size: student has 20, teacher has 21"},
      {"vocab missing", [](auto* r) { r->set_vocab_size(0); }, "vocab_size"},
      {"too long",
       [](auto* r) {
         for (int i = 0; i < kMaxPositions; ++i) r->mutable_sequences(1)->add_response_tokens(3);
       },
       "max_position_embeddings"},
      {"topk without k", [](auto* r) { r->set_form(kappa::v1::SCORE_FORM_TOPK); }, "top_k"},
      {"topk k > vocab",
       [](auto* r) {
         r->set_form(kappa::v1::SCORE_FORM_TOPK);
         r->set_top_k(kVocab + 1);
       },
       "top_k"},
      {"int32 values", [](auto* r) { r->set_value_dtype(kappa::v1::DTYPE_INT32); }, "value_dtype"},
      {"float16 values", [](auto* r) { r->set_value_dtype(kappa::v1::DTYPE_FLOAT16); },
       "value_dtype"},
      {"unknown form", [](auto* r) { r->set_form(static_cast<kappa::v1::ScoreForm>(9)); },
       "form"},
  };
  for (const BadScore& bad : cases) {
    kappa::v1::ScoreRequest request = Request({{1, 3}, {1}, {1, 4, 5}}, {{6, 2}, {7, 8}, {9}});
    bad.mutate(&request);
    kappa::v1::ScoreResponse response;
    const grpc::Status status = Score(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.what;
    EXPECT_NE(status.error_message().find(bad.field), std::string::npos)
        << bad.what << ": " << status.error_message();
  }
  // The server is still healthy and scoring afterwards.
  kappa::v1::ScoreResponse ok;
  EXPECT_TRUE(Score(Request({{1}}, {{3, 2}}), &ok).ok());
}

TEST_F(TeacherServiceTest, GenerateReturnsKSamplesWithTeacherLogProbs) {
  kappa::v1::GenerateRequest request;
  for (int32_t t : {1, 4, 5, 6}) request.add_prompt_tokens(t);
  request.set_num_samples(5);
  request.set_max_new_tokens(6);
  request.set_seed(1234);
  kappa::v1::GenerateResponse response;
  const grpc::Status status = Generate(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.samples_size(), 5);

  // Each sample: EOS only as the last token, or truncated at max_new_tokens;
  // its log-probs equal the teacher's own score of the same tokens
  // (temperature 1, full distribution).
  for (const auto& sample : response.samples()) {
    const std::vector<int32_t> tokens(sample.tokens().begin(), sample.tokens().end());
    ASSERT_FALSE(tokens.empty());
    ASSERT_LE(tokens.size(), 6u);
    for (size_t i = 0; i + 1 < tokens.size(); ++i) EXPECT_NE(tokens[i], 2);
    EXPECT_TRUE(tokens.back() == 2 || tokens.size() == 6u);
    for (int32_t t : tokens) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, kVocab);
    }
    ASSERT_EQ(sample.logprobs().dtype(), kappa::v1::DTYPE_FLOAT32);
    ASSERT_EQ(Shape(sample.logprobs()), (std::vector<int64_t>{static_cast<int64_t>(tokens.size())}));
    const std::vector<float> lp = Floats(sample.logprobs());
    const torch::Tensor want = Reference({1, 4, 5, 6}, tokens);
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_LE(lp[i], 0.0f);
      // Sampling decodes with a KV cache, the reference runs one full
      // forward: different GEMM shapes round differently (seen: ~1e-4).
      EXPECT_NEAR(lp[i], want[i][tokens[i]].item<float>(), 5e-4) << "position " << i;
    }
  }

  // The same seed reproduces the same samples.
  kappa::v1::GenerateResponse again;
  ASSERT_TRUE(Generate(request, &again).ok());
  ASSERT_EQ(again.samples_size(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(std::vector<int32_t>(again.samples(i).tokens().begin(), again.samples(i).tokens().end()),
              std::vector<int32_t>(response.samples(i).tokens().begin(),
                                   response.samples(i).tokens().end()));
  }
}

struct BadGenerate {
  const char* what;
  std::function<void(kappa::v1::GenerateRequest*)> mutate;
  const char* field;
};

TEST_F(TeacherServiceTest, MalformedGenerateRequestsAreInvalidArgument) {
  const std::vector<BadGenerate> cases = {
      {"empty prompt", [](auto* r) { r->clear_prompt_tokens(); }, "prompt_tokens: empty"},
      {"bad id", [](auto* r) { r->set_prompt_tokens(1, 99); }, "prompt_tokens[1]"},
      {"no samples", [](auto* r) { r->set_num_samples(0); }, "num_samples"},
      {"too many samples", [](auto* r) { r->set_num_samples(100000); }, "num_samples"},
      {"no tokens", [](auto* r) { r->set_max_new_tokens(0); }, "max_new_tokens"},
      {"over server limit", [](auto* r) { r->set_max_new_tokens(17); }, "max_new_tokens"},
      {"past max positions",
       [](auto* r) {
         for (int i = 0; i < 20; ++i) r->add_prompt_tokens(3);
         r->set_max_new_tokens(16);
       },
       "max_position_embeddings"},
      {"negative temperature", [](auto* r) { r->set_temperature(-1); }, "temperature"},
      {"nan temperature", [](auto* r) { r->set_temperature(std::nanf("")); }, "temperature"},
      {"top_p above 1", [](auto* r) { r->set_top_p(1.5f); }, "top_p"},
  };
  for (const BadGenerate& bad : cases) {
    kappa::v1::GenerateRequest request;
    for (int32_t t : {1, 4, 5}) request.add_prompt_tokens(t);
    request.set_num_samples(2);
    request.set_max_new_tokens(4);
    bad.mutate(&request);
    kappa::v1::GenerateResponse response;
    const grpc::Status status = Generate(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.what;
    EXPECT_NE(status.error_message().find(bad.field), std::string::npos)
        << bad.what << ": " << status.error_message();
  }
}

// Issue 45: per-request cost budgets and cancellation. A Score or Generate
// over teacher.max_request_positions is RESOURCE_EXHAUSTED naming the
// budget; a Score whose caller cancels while it waits for a batch is
// withdrawn (the batcher counts it) instead of waiting out its deadline.
TEST(TeacherLimits, BudgetsAndCancellation) {
  torch::manual_seed(3);
  TeacherOptions options;
  options.batching.max_batch_sequences = 64;
  options.batching.max_wait = absl::Seconds(30);  // a lone sequence waits for company
  options.max_new_tokens = 16;
  options.max_request_positions = 40;
  auto created = TeacherService::Create(model::Decoder(SmallConfig()), options);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<TeacherService> service = *std::move(created);
  auto server = services::GrpcServer::Start("127.0.0.1:0", {service.get()});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = kappa::v1::Teacher::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->port()), grpc::InsecureChannelCredentials()));

  kappa::v1::ScoreRequest over;
  over.set_vocab_size(kVocab);
  for (int i = 0; i < 3; ++i) {  // 3 × (5 + 10) = 45 positions
    auto* sequence = over.add_sequences();
    for (int t = 0; t < 5; ++t) sequence->add_prompt_tokens(1 + t);
    for (int t = 0; t < 10; ++t) sequence->add_response_tokens(2 + t);
  }
  {
    grpc::ClientContext context;
    kappa::v1::ScoreResponse response;
    const grpc::Status status = stub->Score(&context, over, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(status.error_message(),
              "sequences: 45 token positions exceed the per-request budget of 40 "
              "(teacher.max_request_positions); split the request");
  }
  {
    kappa::v1::GenerateRequest request;
    for (int32_t t : {1, 4, 5}) request.add_prompt_tokens(t);
    request.set_num_samples(4);
    request.set_max_new_tokens(8);  // 4 × (3 + 8) = 44
    grpc::ClientContext context;
    kappa::v1::GenerateResponse response;
    const grpc::Status status = stub->Generate(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(status.error_message().find("num_samples: 44 token positions exceed"),
              std::string::npos)
        << status.error_message();
  }

  // One sequence, well within budget, waits for a batch that will not fill.
  kappa::v1::ScoreRequest lone;
  lone.set_vocab_size(kVocab);
  auto* sequence = lone.add_sequences();
  for (int32_t t : {1, 4, 5}) sequence->add_prompt_tokens(t);
  sequence->add_response_tokens(6);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::Status lone_status;
  std::thread caller([&] {
    kappa::v1::ScoreResponse response;
    lone_status = stub->Score(&context, lone, &response);
  });
  // Cancelled once the server holds it queued (not before it arrived).
  const auto queued_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (service->batcher_stats().queued_sequences == 0 &&
         std::chrono::steady_clock::now() < queued_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(service->batcher_stats().queued_sequences, 1);
  context.TryCancel();
  caller.join();
  EXPECT_EQ(lone_status.error_code(), grpc::StatusCode::CANCELLED);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (service->batcher_stats().cancelled == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(service->batcher_stats().cancelled, 1) << "the handler kept waiting for its batch";
  EXPECT_EQ(service->batcher_stats().deadline_exceeded, 0);
  (*server)->Shutdown(absl::Seconds(1));
}

// A Qwen-style teacher: more embedding rows (40) than tokenizer ids (32),
// and a generation_config.json with two stop ids. Driven without a server.
TEST(TeacherVocabLimit, StaysBelowTheLimitAndStopsAtTheGenerationConfigIds) {
  constexpr int64_t kRows = 40, kIds = 32;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kappa_teacher_limit_" + std::to_string(getpid()));
  model::ModelConfig config = SmallConfig();
  config.vocab_size = kRows;
  torch::manual_seed(4);
  model::Decoder saved(config);
  model::SaveCheckpoint(dir.string(), saved);
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [5, 6], "do_sample": true})";
  TeacherOptions options;
  options.max_new_tokens = 8;
  options.vocab_limit = kIds;
  auto created = TeacherService::Create(model::LoadCheckpoint(dir.string()), options);
  ASSERT_TRUE(created.ok()) << created.status();
  TeacherService& service = **created;

  grpc::ServerContext context;
  kappa::v1::GenerateRequest generate;
  for (int32_t t : {1, 4, 9}) generate.add_prompt_tokens(t);
  generate.set_num_samples(16);
  generate.set_max_new_tokens(8);
  generate.set_seed(77);
  kappa::v1::GenerateResponse generated;
  ASSERT_TRUE(service.Generate(&context, &generate, &generated).ok());
  int stopped = 0;
  for (const auto& sample : generated.samples()) {
    const std::vector<int32_t> tokens(sample.tokens().begin(), sample.tokens().end());
    for (int32_t t : tokens) EXPECT_LT(t, kIds);  // no padded row
    for (size_t i = 0; i + 1 < tokens.size(); ++i) EXPECT_TRUE(tokens[i] != 5 && tokens[i] != 6);
    const bool at_stop = tokens.back() == 5 || tokens.back() == 6;
    EXPECT_TRUE(at_stop || tokens.size() == 8u);
    stopped += at_stop ? 1 : 0;
  }
  EXPECT_GT(stopped, 0);

  // Score: distributions over the 32 ids, and only a student with the same
  // limit is served.
  kappa::v1::ScoreRequest score;
  score.set_vocab_size(kIds);
  score.set_form(kappa::v1::SCORE_FORM_FULL);
  kappa::v1::ScoreSequence* sequence = score.add_sequences();
  for (int32_t t : {1, 4}) sequence->add_prompt_tokens(t);
  for (int32_t t : {7, 31}) sequence->add_response_tokens(t);
  kappa::v1::ScoreResponse scored;
  ASSERT_TRUE(service.Score(&context, &score, &scored).ok());
  EXPECT_EQ(scored.vocab_size(), kIds);
  EXPECT_EQ(Shape(scored.sequences(0).logprobs()), (std::vector<int64_t>{2, kIds}));
  score.set_vocab_size(kRows);
  EXPECT_NE(service.ValidateScoreRequest(score).message().find("teacher has 32"),
            std::string::npos);
  score.set_vocab_size(kIds);
  score.mutable_sequences(0)->set_response_tokens(1, 35);
  EXPECT_NE(service.ValidateScoreRequest(score).message().find("response_tokens[1]"),
            std::string::npos);
  kappa::v1::InfoResponse info;
  ASSERT_TRUE(service.Info(&context, nullptr, &info).ok());
  EXPECT_EQ(info.vocab_size(), kIds);
  service.Shutdown();

  // A malformed generation_config.json is refused at start, naming it and the key.
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": ["<|im_end|>"]})";
  auto refused = TeacherService::Create(model::LoadCheckpoint(dir.string()), options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("generation_config.json"), std::string::npos);
  EXPECT_NE(refused.status().message().find("eos_token_id"), std::string::npos);
  options.vocab_limit = kRows + 1;
  EXPECT_FALSE(TeacherService::Create(model::LoadCheckpoint(dir.string()), options).ok());
  std::filesystem::remove_all(dir);
}

// The teacher refuses to send log-probs it computed as NaN or ±inf (a
// corrupt checkpoint, an overflow), in every form: INTERNAL naming the
// sequence, the tensor and the row (scorer_test checks the row on a
// hand-made tensor), counted in kappa_teacher_nonfinite_logprobs_total.
// Driven without a server.
TEST(TeacherNonFinite, ScoreRefusesNonFiniteLogProbsNamingTheRow) {
  constexpr int kPoisoned = 9;
  torch::manual_seed(5);
  model::Decoder model(SmallConfig());
  {
    torch::NoGradGuard no_grad;
    // Token 9's embedding is NaN: attention spreads it to every position of
    // a sequence that holds it as an input; other sequences stay finite.
    model->named_parameters()["model.embed_tokens.weight"][kPoisoned].fill_(std::nanf(""));
  }
  services::metrics::Registry registry;
  TeacherMetrics metrics(registry);
  TeacherOptions options;
  options.batching.max_wait = absl::Milliseconds(1);
  auto created = TeacherService::Create(std::move(model), options, &metrics);
  ASSERT_TRUE(created.ok()) << created.status();
  TeacherService& service = **created;
  auto add = [](kappa::v1::ScoreRequest* request, std::vector<int32_t> response) {
    kappa::v1::ScoreSequence* sequence = request->add_sequences();
    for (int32_t t : {1, 4}) sequence->add_prompt_tokens(t);
    for (int32_t t : response) sequence->add_response_tokens(t);
  };

  grpc::ServerContext context;
  kappa::v1::ScoreRequest clean;
  clean.set_vocab_size(kVocab);
  add(&clean, {7, 3});
  add(&clean, {7, kPoisoned});  // token 9 is the last: it predicts nothing returned
  kappa::v1::ScoreResponse scored;
  ASSERT_TRUE(service.Score(&context, &clean, &scored).ok());

  for (kappa::v1::ScoreForm form :
       {kappa::v1::SCORE_FORM_FULL, kappa::v1::SCORE_FORM_TOPK, kappa::v1::SCORE_FORM_SAMPLED}) {
    kappa::v1::ScoreRequest request;
    request.set_vocab_size(kVocab);
    request.set_form(form);
    request.set_top_k(4);
    add(&request, {7, 3});
    add(&request, {7, kPoisoned, 5});  // token 9 is an input: every row is NaN
    kappa::v1::ScoreResponse response;
    const grpc::Status status = service.Score(&context, &request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << form;
    EXPECT_NE(status.error_message().find(
                  "sequences[1].logprobs: non-finite log-prob nan at response position 0"),
              std::string::npos)
        << form << ": " << status.error_message();
  }
  EXPECT_EQ(
      kappa::testing::SampleValue(registry.Serialize(), "kappa_teacher_nonfinite_logprobs_total"),
      3);
  service.Shutdown();
}

}  // namespace
}  // namespace kappa::teacher
