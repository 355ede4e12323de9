// Weight sync (issue 19): bfloat16 on the wire, versions streamed straight
// into the worker's inactive model copy, lossless XOR deltas, against the
// real LearnerService + PolicyPublisher on loopback (and a fake learner whose
// stream breaks mid-version).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "kappa/v1/learner.grpc.pb.h"
#include "learner/coordinator.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/policy_snapshot_dtype.h"
#include "learner/work_config.h"
#include "model/checkpoint.h"
#include "rollout_worker/policy_assembler.h"
#include "rollout_worker/policy_watcher.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "tests/rollout/test_policy.h"
#include "tests/rollout/weight_test_util.h"

namespace kappa::rollout {
namespace {

using learner::PolicyPublisher;
using learner::PolicySnapshot;
using learner::PublisherOptions;
using testing::ChunkWeights;
using testing::CopyWeights;
using testing::EmptyDataset;
using testing::Eventually;
using testing::ExpectModelHolds;
using testing::kWait;
using testing::MakeDecoder;
using testing::SameBytes;
using testing::Snapshot;
using testing::TinyConfig;
using testing::Weights;

// An optimizer-like step on a few tensors: small changes to every element of two.
Weights Updated(const Weights& weights, uint64_t seed) {
  torch::manual_seed(seed);
  Weights next;
  int changed = 0;
  for (const auto& [name, tensor] : weights) {
    torch::Tensor copy = tensor.clone();
    if (tensor.dim() == 2 && changed < 2) {
      copy += 1e-3 * torch::randn_like(copy);
      ++changed;
    }
    next.emplace(name, copy);
  }
  return next;
}

int64_t WireBytes(const Weights& weights, int64_t element_bytes) {
  int64_t total = 0;
  for (const auto& [name, tensor] : weights) total += tensor.numel() * element_bytes;
  return total;
}

class WeightSyncTest : public ::testing::Test {
 protected:
  void Serve(PublisherOptions options = {}) {
    publisher_ = std::make_unique<PolicyPublisher>(options);
    learner::WorkTemplate work;
    work.group_size = 2;
    work.max_new_tokens = 4;
    work.max_outstanding_limit = 4;
    coordinator_ = std::make_unique<learner::Coordinator>(1, 1, 0, learner::CoordinatorOptions{});
    service_ = std::make_unique<learner::LearnerService>(
        dataset_, [](size_t) { return std::vector<int32_t>{1}; }, work,
        learner::GroupExpectationsFor(work, 51), coordinator_.get(), publisher_.get());
    auto server = services::GrpcServer::Start("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    if (service_) service_->Shutdown();
    if (publisher_) publisher_->Shutdown();
    if (server_) server_->Shutdown(absl::Milliseconds(200));
  }
  std::unique_ptr<PolicyWatcher> Watcher(c10::ScalarType dtype, WeightSyncOptions sync) {
    PolicyWatcherOptions options{"w", absl::Milliseconds(20), absl::Milliseconds(200)};
    options.dtype = dtype;
    auto watcher = std::make_unique<PolicyWatcher>(services::MakeChannel(address_), options, sync);
    watcher->Start();
    return watcher;
  }
  // The first version a raw WatchPolicy stream sends for `request`.
  std::vector<kappa::v1::PolicyChunk> FirstVersion(const kappa::v1::WatchPolicyRequest& request) {
    auto stub = kappa::v1::Learner::NewStub(services::MakeChannel(address_));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    auto reader = stub->WatchPolicy(&context, request);
    std::vector<kappa::v1::PolicyChunk> chunks;
    kappa::v1::PolicyChunk chunk;
    while (reader->Read(&chunk)) {
      chunks.push_back(chunk);
      if (chunk.last_of_version()) break;
    }
    context.TryCancel();
    reader->Finish();
    return chunks;
  }

  EmptyDataset dataset_;
  std::unique_ptr<PolicyPublisher> publisher_;
  std::unique_ptr<learner::Coordinator> coordinator_;
  std::unique_ptr<learner::LearnerService> service_;
  std::unique_ptr<services::GrpcServer> server_;
  std::string address_;
};

TEST_F(WeightSyncTest, Bfloat16OnTheWireIsTheLearnersWeightsRoundedAndHalfTheBytes) {
  Serve();
  model::Decoder source = MakeDecoder(TinyConfig(), 3);
  const Weights v0 = CopyWeights(source);
  publisher_->Publish(Snapshot(0, v0));

  auto fp32 = Watcher(torch::kFloat32, {torch::kFloat32, false});
  auto bf16_into_fp32 = Watcher(torch::kFloat32, {torch::kBFloat16, false});
  auto bf16_auto = Watcher(torch::kBFloat16, {});  // auto: the model's bfloat16
  for (PolicyWatcher* watcher : {fp32.get(), bf16_into_fp32.get(), bf16_auto.get()}) {
    absl::StatusOr<Policy> policy = watcher->WaitForVersion(0, absl::Now() + kWait);
    ASSERT_TRUE(policy.ok()) << policy.status();
  }
  ExpectModelHolds(*fp32->Current().model, v0, torch::kFloat32);
  ExpectModelHolds(*bf16_into_fp32->Current().model, v0, torch::kBFloat16);
  ExpectModelHolds(*bf16_auto->Current().model, v0, torch::kBFloat16);
  EXPECT_EQ(model::NamedWeights(*bf16_auto->Current().model).begin()->second.scalar_type(),
            torch::kBFloat16);

  EXPECT_EQ(fp32->bytes_received(), WireBytes(v0, 4));
  EXPECT_EQ(bf16_into_fp32->bytes_received(), WireBytes(v0, 2));
  EXPECT_EQ(bf16_auto->bytes_received(), WireBytes(v0, 2));
  EXPECT_TRUE(Eventually([&] { return service_->counters().policy_versions_full.load() == 3; }));
  EXPECT_EQ(service_->counters().policy_bytes_full.load(), WireBytes(v0, 4) + 2 * WireBytes(v0, 2));
  EXPECT_EQ(service_->counters().policy_bytes_saved_bfloat16.load(), 2 * WireBytes(v0, 2));
  // One conversion per dtype, however many workers asked for it.
  EXPECT_EQ(publisher_->encodings_made(), 2);
}

TEST_F(WeightSyncTest, UnknownWireDtypeIsRefusedNamingTheField) {
  Serve();
  auto stub = kappa::v1::Learner::NewStub(services::MakeChannel(address_));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  kappa::v1::WatchPolicyRequest request;
  request.set_known_version(-1);
  request.set_weights_dtype(kappa::v1::DTYPE_INT32);
  auto reader = stub->WatchPolicy(&context, request);
  kappa::v1::PolicyChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("weights_dtype: DTYPE_INT32"), std::string::npos)
      << status.error_message();
}

// A learner whose workers all ask for bfloat16 snapshots straight into
// bfloat16 (issue 38: no float32 copy per version); the workers get exactly
// those bytes, and a float32 request is refused rather than sent widened.
TEST_F(WeightSyncTest, ABfloat16SnapshotTravelsAsItIsAndFloat32IsRefused) {
  Serve();
  model::Decoder source = MakeDecoder(TinyConfig(), 3);
  const Weights v0 = CopyWeights(source);
  auto snapshot = std::make_shared<PolicySnapshot>(*Snapshot(0, v0));
  snapshot->dtype = torch::kBFloat16;
  for (auto& [name, tensor] : snapshot->weights) tensor = tensor.to(torch::kBFloat16);
  publisher_->Publish(snapshot);

  auto bf16 = Watcher(torch::kBFloat16, {torch::kBFloat16, false});
  ASSERT_TRUE(bf16->WaitForVersion(0, absl::Now() + kWait).ok());
  ExpectModelHolds(*bf16->Current().model, v0, torch::kBFloat16);
  // The snapshot's own tensors are the encoding: no conversion was made.
  EXPECT_EQ(publisher_->Encode(snapshot, torch::kBFloat16)->weights.front().second.data_ptr(),
            snapshot->weights.front().second.data_ptr());

  auto stub = kappa::v1::Learner::NewStub(services::MakeChannel(address_));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  kappa::v1::WatchPolicyRequest request;
  request.set_known_version(-1);
  request.set_weights_dtype(kappa::v1::DTYPE_FLOAT32);
  auto reader = stub->WatchPolicy(&context, request);
  kappa::v1::PolicyChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("rollout.weights_dtype"), std::string::npos)
      << status.error_message();
}

TEST(WeightSyncConfigTest, TheSnapshotIsBfloat16OnlyWhenEveryWorkerAsksForIt) {
  services::Config config;
  EXPECT_EQ(learner::PolicySnapshotDtype(config), torch::kFloat32);  // auto, auto
  config.student.dtype = services::ModelDtype::kBFloat16;
  EXPECT_EQ(learner::PolicySnapshotDtype(config), torch::kBFloat16);  // auto follows the model
  config.rollout.weights_dtype = services::ModelDtype::kFloat32;
  EXPECT_EQ(learner::PolicySnapshotDtype(config), torch::kFloat32);
  config.student.dtype = services::ModelDtype::kAuto;  // a worker resolves it on its own host
  config.rollout.weights_dtype = services::ModelDtype::kBFloat16;
  EXPECT_EQ(learner::PolicySnapshotDtype(config), torch::kBFloat16);
}

// (A name that is none of them is refused when the configuration loads.)
TEST(WeightSyncConfigTest, WeightsDtypeValuesAreTheWireDtype) {
  EXPECT_FALSE(WeightsDtype(services::ModelDtype::kAuto).has_value());
  EXPECT_EQ(*WeightsDtype(services::ModelDtype::kFloat32), torch::kFloat32);
  EXPECT_EQ(*WeightsDtype(services::ModelDtype::kBFloat16), torch::kBFloat16);
  EXPECT_EQ(WireDtype({}, torch::kBFloat16), torch::kBFloat16);
  EXPECT_EQ(WireDtype({}, torch::kFloat16), torch::kFloat32);
  EXPECT_EQ(WireDtype({torch::kBFloat16, false}, torch::kFloat32), torch::kBFloat16);
}

TEST(WeightSyncConfigTest, TheWorkerBinaryRefusesABadWeightsDtypeAtStartUp) {
  const std::string command = std::string(KAPPA_ROLLOUT_WORKER_BINARY) +
                              " --learner=127.0.0.1:1 rollout.weights_dtype=fp16 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  size_t read = 0;
  while ((read = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, read);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_NE(output.find("key 'rollout.weights_dtype' expects one of auto, float32, bfloat16, "
                        "got 'fp16'"),
            std::string::npos)
      << output;
}

class DeltaTest : public WeightSyncTest, public ::testing::WithParamInterface<c10::ScalarType> {};

TEST_P(DeltaTest, DeltaVersionsReconstructBitIdenticalWeights) {
  const c10::ScalarType wire = GetParam();
  Serve(PublisherOptions{true});
  model::Decoder source = MakeDecoder(TinyConfig(), 5);
  const Weights v0 = CopyWeights(source);
  const Weights v1 = Updated(v0, 1);
  const Weights v2 = Updated(v1, 2);
  publisher_->Publish(Snapshot(0, v0));
  auto watcher = Watcher(torch::kFloat32, {wire, true});
  ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());
  ExpectModelHolds(*watcher->Current().model, v0, wire);
  const int64_t full = watcher->bytes_received();
  EXPECT_EQ(watcher->delta_versions(), 0);

  publisher_->Publish(Snapshot(1, v1));
  ASSERT_TRUE(watcher->WaitForVersion(1, absl::Now() + kWait).ok());
  ExpectModelHolds(*watcher->Current().model, v1, wire);
  publisher_->Publish(Snapshot(2, v2));
  ASSERT_TRUE(watcher->WaitForVersion(2, absl::Now() + kWait).ok());
  ExpectModelHolds(*watcher->Current().model, v2, wire);

  EXPECT_EQ(watcher->delta_versions(), 2);
  const int64_t delta_bytes = watcher->bytes_received() - full;
  EXPECT_GT(delta_bytes, 0);
  EXPECT_LT(delta_bytes, full);  // two versions of two changed tensors, less than one full
  EXPECT_TRUE(Eventually([&] { return service_->counters().policy_versions_delta.load() == 2; }));
  EXPECT_EQ(service_->counters().policy_bytes_delta.load(), delta_bytes);
  EXPECT_EQ(service_->counters().policy_bytes_saved_delta.load(), 2 * full - delta_bytes);
  // v2 went into v0's model: the double buffer, no third copy.
  EXPECT_EQ(watcher->models_allocated(), 2);
}

INSTANTIATE_TEST_SUITE_P(WireDtypes, DeltaTest,
                         ::testing::Values(torch::kFloat32, torch::kBFloat16));

// LoRA's frozen weights (PolicySnapshot.frozen_weights): converted to the
// wire dtype once and shared by every version's encoding, so a delta skips
// them by pointer and carries only the adapters.
TEST(PolicyPublisherTest, FrozenWeightsAreConvertedOnceAndDeltasCarryTheRest) {
  PolicyPublisher publisher(PublisherOptions{true});
  torch::manual_seed(3);
  const torch::Tensor frozen = torch::randn({64, 64});
  auto snapshot = [&](int64_t version) {
    auto s = std::make_shared<PolicySnapshot>();
    s->version = version;
    s->model_config_json = "{}";
    s->weights = {{"w", frozen}, {"w.lora_A.weight", torch::randn({4, 64})}};
    s->frozen_weights = 1;
    return s;
  };
  const auto s1 = snapshot(1);
  publisher.Publish(s1);
  const auto e1 = publisher.Encode(s1, torch::kBFloat16);
  const auto s2 = snapshot(2);
  publisher.Publish(s2);
  const auto e2 = publisher.Encode(s2, torch::kBFloat16);
  EXPECT_EQ(e1->weights[0].second.data_ptr(), e2->weights[0].second.data_ptr());
  EXPECT_TRUE(torch::equal(e2->weights[0].second, frozen.to(torch::kBFloat16)));
  EXPECT_NE(e1->weights[1].second.data_ptr(), e2->weights[1].second.data_ptr());

  const auto delta = publisher.Delta(s2, torch::kBFloat16, 1, publisher.PolicyId(1));
  ASSERT_NE(delta, nullptr);
  ASSERT_EQ(delta->parameters.size(), 2u);
  ASSERT_EQ(delta->parameters[0].segments.size(), 1u);
  EXPECT_TRUE(delta->parameters[0].segments[0].unchanged);
  EXPECT_EQ(delta->parameters[0].segments[0].size, 64 * 64 * 2);
  EXPECT_EQ(delta->bytes, 4 * 64 * 2);  // the adapter, every byte changed
}

TEST_F(WeightSyncTest, AnOlderOrUnknownBaseGetsAFullVersion) {
  Serve(PublisherOptions{true});
  model::Decoder source = MakeDecoder(TinyConfig(), 5);
  const Weights v0 = CopyWeights(source);
  const Weights v1 = Updated(v0, 1);
  const Weights v2 = Updated(v1, 2);
  publisher_->Publish(Snapshot(0, v0));
  auto s1 = Snapshot(1, v1);
  publisher_->Publish(s1);
  publisher_->Encode(s1, torch::kFloat32);  // as a stream sending v1 would
  publisher_->Publish(Snapshot(2, v2));

  const auto request = [&](int64_t known, uint64_t id, bool accept) {
    kappa::v1::WatchPolicyRequest r;
    r.set_known_version(known);
    r.set_known_policy_id(id);
    r.set_accept_delta(accept);
    r.set_weights_dtype(kappa::v1::DTYPE_FLOAT32);
    return r;
  };
  const auto is_delta = [](const std::vector<kappa::v1::PolicyChunk>& chunks) {
    for (const auto& chunk : chunks) {
      if (chunk.encoding() != kappa::v1::PolicyChunk::RAW) return true;
    }
    return false;
  };
  const std::vector<kappa::v1::PolicyChunk> delta =
      FirstVersion(request(1, publisher_->PolicyId(1), true));
  ASSERT_FALSE(delta.empty());
  EXPECT_TRUE(is_delta(delta));
  EXPECT_EQ(delta.front().base_version(), 1);
  EXPECT_EQ(delta.front().version(), 2);
  // v0 is no longer kept as a base; an id from another learner process; no delta asked.
  for (const auto& r :
       {request(0, publisher_->PolicyId(0), true), request(1, publisher_->PolicyId(1) ^ 1, true),
        request(1, publisher_->PolicyId(1), false)}) {
    const std::vector<kappa::v1::PolicyChunk> full = FirstVersion(r);
    ASSERT_FALSE(full.empty());
    EXPECT_FALSE(is_delta(full)) << r.ShortDebugString();
    PolicyAssembler assembler;
    std::optional<AssembledPolicy> done;
    for (const auto& chunk : full) {
      auto added = assembler.Add(chunk);
      ASSERT_TRUE(added.ok()) << added.status();
      if (added->has_value()) done = std::move(*added);
    }
    ASSERT_TRUE(done.has_value());
    for (const auto& [name, tensor] : v2) EXPECT_TRUE(SameBytes(done->weights.at(name), tensor));
  }

  // The delta against the right base rebuilds v2 exactly; against any other it is rejected.
  const auto feed = [&](PolicyBase base) -> absl::StatusOr<std::optional<AssembledPolicy>> {
    PolicyAssembler assembler;
    assembler.SetBase(std::move(base));
    std::optional<AssembledPolicy> done;
    for (const auto& chunk : delta) {
      auto added = assembler.Add(chunk);
      if (!added.ok()) return added.status();
      if (added->has_value()) done = std::move(*added);
    }
    return done;
  };
  auto rebuilt = feed(PolicyBase{1, publisher_->PolicyId(1), v1});
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  ASSERT_TRUE(rebuilt->has_value());
  EXPECT_TRUE((*rebuilt)->delta);
  for (const auto& [name, tensor] : v2) {
    EXPECT_TRUE(SameBytes((*rebuilt)->weights.at(name), tensor)) << name;
  }
  auto wrong_version = feed(PolicyBase{0, publisher_->PolicyId(0), v0});
  ASSERT_FALSE(wrong_version.ok());
  EXPECT_NE(wrong_version.status().message().find(
                "a delta against version 1, but this worker holds version 0"),
            std::string::npos)
      << wrong_version.status();
  auto wrong_weights = feed(PolicyBase{1, publisher_->PolicyId(1) ^ 1, v0});
  ASSERT_FALSE(wrong_weights.ok());
  EXPECT_NE(wrong_weights.status().message().find("with other weights"), std::string::npos)
      << wrong_weights.status();
  auto no_base = feed(PolicyBase{});
  ASSERT_FALSE(no_base.ok());
  EXPECT_NE(no_base.status().message().find("holds no base version"), std::string::npos)
      << no_base.status();
}

TEST_F(WeightSyncTest, AModelBeingSampledFromIsNeverWritten) {
  Serve();
  model::Decoder source = MakeDecoder(TinyConfig(), 9);
  std::vector<Weights> versions = {CopyWeights(source)};
  for (int v = 1; v < 4; ++v) versions.push_back(Updated(versions.back(), v));
  publisher_->Publish(Snapshot(0, versions[0]));
  auto watcher = Watcher(torch::kFloat32, {});
  absl::StatusOr<Policy> held = watcher->WaitForVersion(0, absl::Now() + kWait);
  ASSERT_TRUE(held.ok()) << held.status();  // a sampler holds v0 throughout

  publisher_->Publish(Snapshot(1, versions[1]));
  ASSERT_TRUE(watcher->WaitForVersion(1, absl::Now() + kWait).ok());
  const model::Decoder* v1_model = watcher->Current().model.get();
  publisher_->Publish(Snapshot(2, versions[2]));  // the inactive copy (v0's) is still held
  ASSERT_TRUE(watcher->WaitForVersion(2, absl::Now() + kWait).ok());
  EXPECT_NE(watcher->Current().model.get(), held->model.get());
  EXPECT_EQ(watcher->models_allocated(), 3);  // so a fresh one was allocated
  ExpectModelHolds(*held->model, versions[0], torch::kFloat32);
  ExpectModelHolds(*watcher->Current().model, versions[2], torch::kFloat32);

  publisher_->Publish(Snapshot(3, versions[3]));  // v1's model is free again: reused
  ASSERT_TRUE(watcher->WaitForVersion(3, absl::Now() + kWait).ok());
  EXPECT_EQ(watcher->Current().model.get(), v1_model);
  EXPECT_EQ(watcher->models_allocated(), 3);
  ExpectModelHolds(*watcher->Current().model, versions[3], torch::kFloat32);
  ExpectModelHolds(*held->model, versions[0], torch::kFloat32);
  EXPECT_EQ(held->version, 0);
}

// Sends v0 and half of v1, then breaks the stream; the next stream waits for
// the test, then sends v1 whole.
class BreakingLearner final : public kappa::v1::Learner::Service {
 public:
  std::vector<kappa::v1::PolicyChunk> v0, v1;
  absl::Notification second_stream, release;
  std::atomic<int64_t> second_known{-2};

  grpc::Status WatchPolicy(grpc::ServerContext* context,
                           const kappa::v1::WatchPolicyRequest* request,
                           grpc::ServerWriter<kappa::v1::PolicyChunk>* writer) override {
    if (calls_++ == 0) {
      for (const auto& chunk : v0) writer->Write(chunk);
      for (size_t i = 0; i < v1.size() / 2; ++i) writer->Write(v1[i]);
      return {grpc::StatusCode::UNAVAILABLE, "broken on purpose"};
    }
    second_known = request->known_version();
    second_stream.Notify();
    release.WaitForNotificationWithTimeout(kWait);
    if (request->known_version() < 1) {
      for (const auto& chunk : v1) writer->Write(chunk);
    }
    while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return grpc::Status::OK;
  }

 private:
  std::atomic<int> calls_{0};
};

TEST(WeightSyncStreamTest, AVersionWhoseStreamBreaksMidwayIsNeverPublished) {
  model::Decoder first = MakeDecoder(TinyConfig(), 1);
  model::Decoder second = MakeDecoder(TinyConfig(), 2);
  BreakingLearner learner;
  learner.v0 = ChunkWeights(0, first, 256);
  learner.v1 = ChunkWeights(1, second, 256);
  ASSERT_GT(learner.v1.size(), 4u);
  auto server = services::GrpcServer::Start("127.0.0.1:0", {&learner});
  ASSERT_TRUE(server.ok()) << server.status();
  PolicyWatcherOptions options{"w", absl::Milliseconds(20), absl::Milliseconds(200)};
  PolicyWatcher watcher(services::MakeChannel("127.0.0.1:" + std::to_string((*server)->port())),
                        options, WeightSyncOptions{});
  watcher.Start();
  ASSERT_TRUE(learner.second_stream.WaitForNotificationWithTimeout(kWait));
  // Half of v1 was written into the inactive copy; v0 is still what samplers get.
  EXPECT_EQ(learner.second_known.load(), 0);
  Policy current = watcher.Current();
  EXPECT_EQ(current.version, 0);
  ExpectModelHolds(*current.model, CopyWeights(first), torch::kFloat32);
  EXPECT_EQ(watcher.published_versions(), 1);
  EXPECT_EQ(watcher.models_allocated(), 2);
  current = Policy{};  // no sampler holds v0 any more

  learner.release.Notify();
  absl::StatusOr<Policy> v1 = watcher.WaitForVersion(1, absl::Now() + kWait);
  ASSERT_TRUE(v1.ok()) << v1.status();
  ExpectModelHolds(*v1->model, CopyWeights(second), torch::kFloat32);
  EXPECT_EQ(watcher.models_allocated(), 2);  // the half-written copy was rewritten whole
  watcher.Stop();
  (*server)->Shutdown(absl::Milliseconds(100));
}

}  // namespace
}  // namespace kappa::rollout
