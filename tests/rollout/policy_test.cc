// PolicyAssembler rules and PolicyWatcher against an in-process fake learner.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "model/checkpoint.h"
#include "rollout_worker/policy_assembler.h"
#include "rollout_worker/policy_watcher.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "tests/rollout/fake_learner.h"
#include "tests/rollout/test_policy.h"

namespace kappa::rollout {
namespace {

using testing::ChunkWeights;
using testing::FakeLearner;
using testing::MakeDecoder;
using testing::TinyConfig;

// Feeds every chunk; returns the completed policy or the first error.
absl::StatusOr<std::optional<AssembledPolicy>> FeedAll(
    PolicyAssembler& assembler, const std::vector<kappa::v1::PolicyChunk>& chunks) {
  std::optional<AssembledPolicy> done;
  for (const kappa::v1::PolicyChunk& chunk : chunks) {
    absl::StatusOr<std::optional<AssembledPolicy>> added = assembler.Add(chunk);
    if (!added.ok()) return added.status();
    if (added->has_value()) done = std::move(*added);
  }
  return done;
}

TEST(PolicyAssemblerTest, ReassemblesMultiChunkParametersExactly) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 7);
  const std::vector<kappa::v1::PolicyChunk> chunks = ChunkWeights(3, decoder, 300);
  const auto weights = model::NamedWeights(decoder);
  ASSERT_GT(chunks.size(), weights.size());  // some parameters span several chunks

  PolicyAssembler assembler;
  absl::StatusOr<std::optional<AssembledPolicy>> result = FeedAll(assembler, chunks);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->has_value());
  const AssembledPolicy& policy = **result;
  EXPECT_EQ(policy.version, 3);
  EXPECT_EQ(policy.model_config_json, decoder->config().ToJson());
  ASSERT_EQ(policy.weights.size(), weights.size());
  for (const auto& [name, tensor] : weights) {
    ASSERT_TRUE(policy.weights.count(name)) << name;
    EXPECT_TRUE(torch::equal(policy.weights.at(name), tensor.detach())) << name;
  }
  EXPECT_EQ(assembler.pending_version(), -1);
}

TEST(PolicyAssemblerTest, OutOfOrderChunksAreAccepted) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 7);
  std::vector<kappa::v1::PolicyChunk> chunks = ChunkWeights(0, decoder, 300);
  // Swap the 2nd and 3rd chunks (both of the first large parameter or adjacent ones).
  std::swap(chunks[1], chunks[2]);
  PolicyAssembler assembler;
  auto result = FeedAll(assembler, chunks);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->has_value());
}

TEST(PolicyAssemblerTest, UnknownDtypeDiscardsTheVersionAndTheNextVersionLoads) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 7);
  std::vector<kappa::v1::PolicyChunk> bad = ChunkWeights(1, decoder);
  bad[0].set_dtype(static_cast<kappa::v1::DType>(42));
  PolicyAssembler assembler;
  absl::StatusOr<std::optional<AssembledPolicy>> first = assembler.Add(bad[0]);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(first.status().message().find("unknown dtype"), std::string::npos)
      << first.status();
  // The rest of version 1 is skipped silently, never completing it.
  for (size_t i = 1; i < bad.size(); ++i) {
    auto added = assembler.Add(bad[i]);
    ASSERT_TRUE(added.ok()) << added.status();
    EXPECT_FALSE(added->has_value());
  }
  auto next = FeedAll(assembler, ChunkWeights(2, decoder));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(next->has_value());
  EXPECT_EQ((*next)->version, 2);
}

TEST(PolicyAssemblerTest, OffsetBeyondShapeIsRejected) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 7);
  std::vector<kappa::v1::PolicyChunk> chunks = ChunkWeights(1, decoder);
  chunks[0].set_byte_offset(1 << 20);
  PolicyAssembler assembler;
  auto result = FeedAll(assembler, chunks);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("beyond"), std::string::npos) << result.status();
}

TEST(PolicyAssemblerTest, OverlappingChunksAreRejected) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 7);
  std::vector<kappa::v1::PolicyChunk> chunks = ChunkWeights(1, decoder, 300);
  ASSERT_EQ(chunks[0].name(), chunks[1].name());
  chunks[1].set_byte_offset(chunks[1].byte_offset() - 4);
  PolicyAssembler assembler;
  auto result = FeedAll(assembler, chunks);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("overlaps"), std::string::npos) << result.status();
}

TEST(PolicyAssemblerTest, IncompleteVersionIsRejected) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 7);
  {  // a chunk in the middle of a parameter is missing
    std::vector<kappa::v1::PolicyChunk> chunks = ChunkWeights(1, decoder, 300);
    ASSERT_EQ(chunks[0].name(), chunks[1].name());
    chunks.erase(chunks.begin() + 1);
    PolicyAssembler assembler;
    auto result = FeedAll(assembler, chunks);
    ASSERT_FALSE(result.ok());
    EXPECT_NE(result.status().message().find("incomplete"), std::string::npos)
        << result.status();
  }
  {  // a whole parameter is missing (num_parameters says so)
    std::vector<kappa::v1::PolicyChunk> chunks = ChunkWeights(1, decoder, 1 << 20);
    chunks.erase(chunks.begin() + 1);  // the first chunk carries the config: keep it
    PolicyAssembler assembler;
    auto result = FeedAll(assembler, chunks);
    ASSERT_FALSE(result.ok());
    EXPECT_NE(result.status().message().find("expected"), std::string::npos)
        << result.status();
  }
}

TEST(PolicyAssemblerTest, NewVersionMidwayDiscardsTheIncompleteOne) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 7);
  std::vector<kappa::v1::PolicyChunk> v1 = ChunkWeights(1, decoder);
  PolicyAssembler assembler;
  for (size_t i = 0; i + 1 < v1.size() / 2; ++i) ASSERT_TRUE(assembler.Add(v1[i]).ok());
  EXPECT_EQ(assembler.pending_version(), 1);
  auto result = FeedAll(assembler, ChunkWeights(2, decoder));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->has_value());
  EXPECT_EQ((*result)->version, 2);
}

TEST(PolicyAssemblerTest, NonFiniteWeightsAreRejected) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 7);
  std::vector<kappa::v1::PolicyChunk> chunks = ChunkWeights(1, decoder);
  std::string data = chunks[0].data();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(data.data(), &nan, sizeof(nan));
  chunks[0].set_data(data);
  PolicyAssembler assembler;
  auto result = FeedAll(assembler, chunks);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("non-finite"), std::string::npos) << result.status();
}

class PolicyWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = services::GrpcServer::Start("127.0.0.1:0", {&learner_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    learner_.Close();
    if (server_) server_->Shutdown(absl::Milliseconds(200));
  }

  FakeLearner learner_;
  std::unique_ptr<services::GrpcServer> server_;
  std::string address_;
};

TEST_F(PolicyWatcherTest, RejectsCorruptVersionsAndPublishesTheNextGoodOne) {
  const model::ModelConfig config = TinyConfig();
  model::Decoder good = MakeDecoder(config, 11);

  // Version 0: a chunk's offset points past its parameter.
  std::vector<kappa::v1::PolicyChunk> corrupt = ChunkWeights(0, good);
  corrupt[1].set_byte_offset(1 << 24);
  learner_.Publish(0, corrupt);
  // Version 1: assembles fine but a parameter has the wrong shape for the config.
  model::ModelConfig wider = config;
  wider.hidden_size = 48;
  wider.intermediate_size = 96;
  model::Decoder wrong = MakeDecoder(wider, 11);
  std::vector<kappa::v1::PolicyChunk> mismatched = ChunkWeights(1, wrong);
  mismatched[0].set_model_config_json(config.ToJson());
  learner_.Publish(1, mismatched);
  // Version 2: good.
  learner_.Publish(2, ChunkWeights(2, good));

  PolicyWatcher watcher(services::MakeChannel(address_), PolicyWatcherOptions{"w-test"});
  EXPECT_EQ(watcher.Current().version, -1);
  watcher.Start();
  absl::StatusOr<Policy> policy = watcher.WaitForVersion(0, absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->version, 2);
  EXPECT_EQ(watcher.rejected_versions(), 2);
  EXPECT_EQ(watcher.published_versions(), 1);

  // The published model carries exactly the good weights.
  const auto expected = model::NamedWeights(good);
  const auto loaded = model::NamedWeights(*policy->model);
  for (const auto& [name, tensor] : expected) {
    EXPECT_TRUE(torch::equal(loaded.at(name), tensor.detach())) << name;
  }
  // Waiting for a version that never comes times out; Stop() cancels waiters.
  absl::StatusOr<Policy> later = watcher.WaitForVersion(3, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kDeadlineExceeded);
  watcher.Stop();
  EXPECT_EQ(watcher.WaitForVersion(3, absl::Now() + absl::Seconds(5)).status().code(),
            absl::StatusCode::kCancelled);
}

TEST_F(PolicyWatcherTest, ReconnectsWithItsKnownVersion) {
  model::Decoder decoder = MakeDecoder(TinyConfig(), 5);
  learner_.Publish(0, ChunkWeights(0, decoder));
  PolicyWatcher watcher(services::MakeChannel(address_),
                        PolicyWatcherOptions{"w-test", absl::Milliseconds(20),
                                             absl::Milliseconds(200)});
  watcher.Start();
  ASSERT_TRUE(watcher.WaitForVersion(0, absl::Now() + absl::Seconds(20)).ok());

  // Restart the server on the same port with a newer version.
  const int port = server_->port();
  learner_.Close();
  server_->Shutdown(absl::Milliseconds(100));
  server_.reset();
  FakeLearner second;
  second.Publish(0, ChunkWeights(0, decoder));
  second.Publish(1, ChunkWeights(1, decoder));
  auto restarted = services::GrpcServer::Start("127.0.0.1:" + std::to_string(port), {&second});
  ASSERT_TRUE(restarted.ok()) << restarted.status();

  absl::StatusOr<Policy> policy = watcher.WaitForVersion(1, absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->version, 1);
  ASSERT_FALSE(second.watch_known_versions().empty());
  EXPECT_EQ(second.watch_known_versions().front(), 0);  // it asked only for newer versions
  watcher.Stop();
  second.Close();
  (*restarted)->Shutdown(absl::Milliseconds(100));
}

}  // namespace
}  // namespace kappa::rollout
