// The same-host weight broadcast (issue 19): dist/weight_group.h on
// its own (three ranks in threads over a real TCPStore and Gloo), then the
// real LearnerService + WeightBroadcaster with PolicyWatchers that take
// rollout.weight_transport: c10d, on loopback: versions arrive bit for bit
// without a WatchPolicy stream, the double buffer holds, a member that
// leaves sends the others back to WatchPolicy, bad joins are refused by name.
#include "dist/weight_group.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kappa/v1/learner.grpc.pb.h"
#include "learner/coordinator.h"
#include "learner/learner_service.h"
#include "learner/policy_publisher.h"
#include "learner/weight_broadcaster.h"
#include "learner/work_config.h"
#include "model/checkpoint.h"
#include "rollout_worker/policy_watcher.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "tests/rollout/test_policy.h"
#include "tests/rollout/weight_test_util.h"

namespace kappa::rollout {
namespace {

using dist::WeightGroup;
using learner::PolicyPublisher;
using learner::PolicySnapshot;
using learner::WeightBroadcaster;
using learner::WeightBroadcastOptions;
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

// A loopback store on a port the kernel chooses when rank 0 binds it.
constexpr char kAnyPortStore[] = "tcp://127.0.0.1:0";

TEST(WeightGroupTest, VersionsGoOutInOrderAndLeaveAndCloseAreSeen) {
  // Rank 0 listens first and tells the others its port (no port is picked
  // by one party and bound by another).
  const dist::WeightGroupOptions root_options{kAnyPortStore, 0, 3, torch::kCPU,
                                              std::chrono::seconds(30)};
  c10::intrusive_ptr<::c10d::Store> root_store = dist::ServeTcpStore(root_options);
  const std::string store = dist::BoundStoreUrl(root_options, root_store);
  EXPECT_NE(store, kAnyPortStore);
  torch::manual_seed(1);
  const std::vector<torch::Tensor> first = {torch::randn({3, 5}), torch::randn({7})};
  const std::vector<torch::Tensor> second = {torch::randn({3, 5}), torch::randn({7})};
  std::vector<std::vector<torch::Tensor>> received(3);
  std::vector<std::string> manifests(3);
  std::vector<dist::WeightGroup::Poll> after_close(3);
  bool left_seen = false;

  std::thread root([&] {
    auto group = dist::WeightGroup::Form(root_store, root_options);
    group->Send(1, "first", first);
    group->Send(2, "second", second);
    // Rank 2 leaves after the second version; rank 0 learns it from the store.
    left_seen = Eventually([&] { return group->AnyoneLeft(); });
    group->Close();
  });
  std::vector<std::thread> members;
  for (int rank = 1; rank <= 2; ++rank) {
    members.emplace_back([&, rank] {
      auto group =
          dist::WeightGroup::Connect({store, rank, 3, torch::kCPU, std::chrono::seconds(30)});
      for (int64_t sequence = 1; sequence <= 2; ++sequence) {
        std::string manifest;
        while (group->PollManifest(sequence, &manifest) != dist::WeightGroup::Poll::kReady) {
          absl::SleepFor(absl::Milliseconds(2));
        }
        manifests[rank] += manifest;
        const std::vector<torch::Tensor> into = {torch::empty({3, 5}), torch::empty({7})};
        group->Receive({into[0]});  // one tensor per call is the same broadcast
        group->Receive({into[1]});
        received[rank].insert(received[rank].end(), into.begin(), into.end());
      }
      if (rank == 2) group->Leave();
      std::string manifest;
      dist::WeightGroup::Poll poll;
      while ((poll = group->PollManifest(3, &manifest)) == dist::WeightGroup::Poll::kNotYet) {
        absl::SleepFor(absl::Milliseconds(2));
      }
      after_close[rank] = poll;
    });
  }
  root.join();
  for (std::thread& member : members) member.join();
  EXPECT_TRUE(left_seen);
  for (int rank = 1; rank <= 2; ++rank) {
    EXPECT_EQ(manifests[rank], "firstsecond");
    ASSERT_EQ(received[rank].size(), 4u);
    EXPECT_TRUE(SameBytes(received[rank][0], first[0]));
    EXPECT_TRUE(SameBytes(received[rank][1], first[1]));
    EXPECT_TRUE(SameBytes(received[rank][2], second[0]));
    EXPECT_TRUE(SameBytes(received[rank][3], second[1]));
    EXPECT_EQ(after_close[rank], dist::WeightGroup::Poll::kClosed);
  }
}

TEST(WeightGroupTest, AStoreThatIsNotTcpIsRefused) {
  EXPECT_THROW(dist::WeightGroup::Connect({"file:///tmp/x", 0, 2, torch::kCPU}),
               std::invalid_argument);
}

// Every tensor moved by 1e-3·N(0,1): an optimizer-like step on all of them.
Weights Perturbed(const Weights& weights, uint64_t seed) {
  torch::manual_seed(seed);
  Weights next;
  for (const auto& [name, tensor] : weights) {
    next.emplace(name, tensor + 1e-3 * torch::randn_like(tensor));
  }
  return next;
}

class WeightGroupSyncTest : public ::testing::Test {
 protected:
  // A learner offering a group of `workers` (none with 0) in `dtype`.
  void Serve(int workers, torch::ScalarType dtype = torch::kFloat32,
             std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    publisher_ = std::make_unique<PolicyPublisher>();
    learner::WorkTemplate work;
    work.group_size = 2;
    work.max_new_tokens = 4;
    work.max_outstanding_limit = 4;
    coordinator_ = std::make_unique<learner::Coordinator>(1, 1, 0, learner::CoordinatorOptions{});
    service_ = std::make_unique<learner::LearnerService>(
        dataset_, [](size_t) { return std::vector<int32_t>{1}; }, work,
        learner::GroupExpectationsFor(work, 51), coordinator_.get(), publisher_.get());
    if (workers > 0) {
      WeightBroadcastOptions options;
      options.workers = workers;
      options.store = kAnyPortStore;
      options.dtype = dtype;
      options.timeout = timeout;
      broadcaster_ = std::make_unique<WeightBroadcaster>(publisher_.get(), options);
      service_->set_weight_broadcaster(broadcaster_.get());
      ASSERT_TRUE(broadcaster_->Start().ok());
    }
    auto server = services::GrpcServer::Start("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    watchers_.clear();
    if (service_) service_->Shutdown();
    if (broadcaster_) broadcaster_->Stop();
    if (publisher_) publisher_->Shutdown();
    if (server_) server_->Shutdown(absl::Milliseconds(200));
  }
  PolicyWatcher* Watcher(const std::string& id, c10::ScalarType dtype, WeightSyncOptions sync) {
    PolicyWatcherOptions options{id, absl::Milliseconds(20), absl::Milliseconds(200)};
    options.dtype = dtype;
    sync.c10d = true;
    watchers_.push_back(
        std::make_unique<PolicyWatcher>(services::MakeChannel(address_), options, sync));
    watchers_.back()->Start();
    return watchers_.back().get();
  }
  grpc::Status Join(const std::string& id, kappa::v1::DType dtype) {
    auto stub = kappa::v1::Learner::NewStub(services::MakeChannel(address_));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    kappa::v1::JoinWeightGroupRequest request;
    request.set_worker_id(id);
    request.set_weights_dtype(dtype);
    kappa::v1::JoinWeightGroupResponse response;
    return stub->JoinWeightGroup(&context, request, &response);
  }

  EmptyDataset dataset_;
  std::unique_ptr<PolicyPublisher> publisher_;
  std::unique_ptr<learner::Coordinator> coordinator_;
  std::unique_ptr<learner::LearnerService> service_;
  std::unique_ptr<WeightBroadcaster> broadcaster_;
  std::unique_ptr<services::GrpcServer> server_;
  std::string address_;
  std::vector<std::unique_ptr<PolicyWatcher>> watchers_;
};

class WeightGroupDtypeTest : public WeightGroupSyncTest,
                             public ::testing::WithParamInterface<c10::ScalarType> {};

TEST_P(WeightGroupDtypeTest, EveryMemberGetsEveryVersionWithoutAWatchPolicyStream) {
  const c10::ScalarType wire = GetParam();
  Serve(2, wire);
  model::Decoder source = MakeDecoder(TinyConfig(), 3);
  const Weights v0 = CopyWeights(source);
  const Weights v1 = Perturbed(v0, 1);
  const Weights v2 = Perturbed(v1, 2);
  publisher_->Publish(Snapshot(0, v0));
  // A float32 model under a bfloat16 wire goes through the scratch buffer;
  // a bfloat16 one is written in place.
  PolicyWatcher* in_fp32 = Watcher("w0", torch::kFloat32, {wire, false});
  PolicyWatcher* in_wire = Watcher("w1", wire, {wire, false});
  for (PolicyWatcher* watcher : {in_fp32, in_wire}) {
    ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());
  }
  ExpectModelHolds(*in_fp32->Current().model, v0, wire);
  ExpectModelHolds(*in_wire->Current().model, v0, wire);
  // A sampler holds v0 while v1 and v2 arrive: it is never written.
  const Policy held = in_wire->Current();

  publisher_->Publish(Snapshot(1, v1));
  for (PolicyWatcher* watcher : {in_fp32, in_wire}) {
    ASSERT_TRUE(watcher->WaitForVersion(1, absl::Now() + kWait).ok());
  }
  publisher_->Publish(Snapshot(2, v2));
  for (PolicyWatcher* watcher : {in_fp32, in_wire}) {
    ASSERT_TRUE(watcher->WaitForVersion(2, absl::Now() + kWait).ok());
    ExpectModelHolds(*watcher->Current().model, v2, wire);
    EXPECT_EQ(watcher->group_versions(), 3);
    EXPECT_EQ(watcher->rejected_versions(), 0);
  }
  ExpectModelHolds(*held.model, v0, wire);
  EXPECT_EQ(in_fp32->models_allocated(), 2);  // the double buffer
  EXPECT_EQ(in_wire->models_allocated(), 3);  // v0 was held: a third copy
  EXPECT_EQ(in_fp32->bytes_received(), 3 * publisher_->Encode(Snapshot(0, v0), wire)->bytes);
  // Nothing went over WatchPolicy; the broadcaster sent each version once.
  EXPECT_EQ(service_->counters().policy_versions_full.load(), 0);
  EXPECT_TRUE(Eventually([&] { return broadcaster_->counters().versions.load() == 3; }));
  EXPECT_TRUE(broadcaster_->counters().formed.load());
}

INSTANTIATE_TEST_SUITE_P(WireDtypes, WeightGroupDtypeTest,
                         ::testing::Values(torch::kFloat32, torch::kBFloat16));

TEST_F(WeightGroupSyncTest, AMemberThatLeavesSendsTheOthersBackToWatchPolicy) {
  Serve(2);
  model::Decoder source = MakeDecoder(TinyConfig(), 4);
  const Weights v0 = CopyWeights(source);
  const Weights v1 = Perturbed(v0, 1);
  publisher_->Publish(Snapshot(0, v0));
  PolicyWatcher* staying = Watcher("w0", torch::kFloat32, {});
  PolicyWatcher* leaving = Watcher("w1", torch::kFloat32, {});
  ASSERT_TRUE(staying->WaitForVersion(0, absl::Now() + kWait).ok());
  ASSERT_TRUE(leaving->WaitForVersion(0, absl::Now() + kWait).ok());
  leaving->Stop();
  ASSERT_TRUE(Eventually([&] { return broadcaster_->counters().closed.load(); }));

  publisher_->Publish(Snapshot(1, v1));
  ASSERT_TRUE(staying->WaitForVersion(1, absl::Now() + kWait).ok());
  ExpectModelHolds(*staying->Current().model, v1, torch::kFloat32);
  EXPECT_EQ(staying->group_versions(), 1);  // v0 in the group, v1 over WatchPolicy
  EXPECT_TRUE(Eventually([&] { return service_->counters().policy_versions_full.load() == 1; }));
  // A closed group takes nobody.
  const grpc::Status late = Join("w2", kappa::v1::DTYPE_FLOAT32);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(late.error_message().find("the weight group is closed"), std::string::npos)
      << late.error_message();
}

TEST_F(WeightGroupSyncTest, AWorkerAskingALearnerWithoutAGroupUsesWatchPolicy) {
  Serve(0);
  model::Decoder source = MakeDecoder(TinyConfig(), 5);
  const Weights v0 = CopyWeights(source);
  publisher_->Publish(Snapshot(0, v0));
  PolicyWatcher* watcher = Watcher("w0", torch::kFloat32, {});
  ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());
  ExpectModelHolds(*watcher->Current().model, v0, torch::kFloat32);
  EXPECT_EQ(watcher->group_versions(), 0);
  const grpc::Status refused = Join("w1", kappa::v1::DTYPE_FLOAT32);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("learner.weight_group_workers is 0"), std::string::npos)
      << refused.error_message();
}

TEST_F(WeightGroupSyncTest, AMemberWhoseGroupNeverFillsUsesWatchPolicy) {
  Serve(2);  // the second member never comes
  model::Decoder source = MakeDecoder(TinyConfig(), 6);
  const Weights v0 = CopyWeights(source);
  publisher_->Publish(Snapshot(0, v0));
  WeightSyncOptions sync;
  sync.group_timeout = absl::Seconds(1);
  PolicyWatcher* watcher = Watcher("w0", torch::kFloat32, sync);
  ASSERT_TRUE(watcher->WaitForVersion(0, absl::Now() + kWait).ok());
  ExpectModelHolds(*watcher->Current().model, v0, torch::kFloat32);
  EXPECT_EQ(watcher->group_versions(), 0);
  EXPECT_FALSE(broadcaster_->counters().formed.load());
}

TEST_F(WeightGroupSyncTest, BadJoinsAreRefusedNamingTheReason) {
  // w0 joins by RPC only and never meets the group: its rendezvous times out.
  Serve(1, torch::kFloat32, std::chrono::seconds(2));
  const grpc::Status no_id = Join("", kappa::v1::DTYPE_FLOAT32);
  EXPECT_EQ(no_id.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(no_id.error_message().find("worker_id: empty"), std::string::npos);
  const grpc::Status bad_dtype = Join("w0", kappa::v1::DTYPE_INT32);
  EXPECT_EQ(bad_dtype.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad_dtype.error_message().find("weights_dtype: DTYPE_INT32"), std::string::npos);
  const grpc::Status other_dtype = Join("w0", kappa::v1::DTYPE_BFLOAT16);
  EXPECT_EQ(other_dtype.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(other_dtype.error_message().find("the worker asks for BFloat16, the weight group "
                                             "broadcasts Float"),
            std::string::npos)
      << other_dtype.error_message();
  EXPECT_TRUE(Join("w0", kappa::v1::DTYPE_FLOAT32).ok());
  EXPECT_TRUE(Join("w0", kappa::v1::DTYPE_FLOAT32).ok());  // the same rank again
  const grpc::Status full = Join("w1", kappa::v1::DTYPE_FLOAT32);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(full.error_message().find("all 1 ranks of the weight group are taken"),
            std::string::npos)
      << full.error_message();
}

// The backend is fixed by the last member to join: NCCL only when every
// rank has a GPU of its own.
TEST(WeightGroupBackendTest, NcclOnlyWhenEveryRankHasItsOwnGpu) {
  PolicyPublisher publisher;
  const auto last_answer = [&](torch::Device learner, std::vector<torch::Device> members) {
    WeightBroadcastOptions options;
    options.workers = static_cast<int>(members.size());
    options.store = "tcp://127.0.0.1:1";
    options.device = learner;
    WeightBroadcaster broadcaster(&publisher, options);  // never started
    kappa::v1::JoinWeightGroupResponse response;
    for (size_t i = 0; i < members.size(); ++i) {
      absl::StatusOr<kappa::v1::JoinWeightGroupResponse> joined =
          broadcaster.Join("w" + std::to_string(i), members[i], torch::kFloat32);
      EXPECT_TRUE(joined.ok()) << joined.status();
      if (i + 1 < members.size()) {
        EXPECT_FALSE(joined->nccl());  // not decided yet
      }
      response = *joined;
    }
    EXPECT_EQ(response.joined(), static_cast<int>(members.size()));
    EXPECT_EQ(broadcaster.nccl(), response.nccl());
    return response.nccl();
  };
  const torch::Device gpu0(torch::kCUDA, 0), gpu1(torch::kCUDA, 1), gpu2(torch::kCUDA, 2);
  EXPECT_TRUE(last_answer(gpu0, {gpu1, gpu2}));
  EXPECT_FALSE(last_answer(gpu0, {gpu1, gpu0}));                   // a GPU shared with the learner
  EXPECT_FALSE(last_answer(gpu0, {gpu1, gpu1}));                   // two members on one GPU
  EXPECT_FALSE(last_answer(gpu0, {gpu1, torch::kCPU}));            // a CPU member
  EXPECT_FALSE(last_answer(torch::kCPU, {gpu1, gpu2}));            // a CPU learner
  EXPECT_FALSE(last_answer(torch::Device(torch::kCUDA), {gpu0}));  // no index: device 0
}

// Start() binds the store before any worker asks: a port-0 store is
// answered with the port bound, and an address already in use is refused
// naming the key.
TEST(WeightGroupBackendTest, StartBindsTheStoreAndJoinHandsOutItsPort) {
  PolicyPublisher publisher;
  WeightBroadcastOptions options;
  options.workers = 2;
  options.store = kAnyPortStore;
  WeightBroadcaster first(&publisher, options);
  EXPECT_TRUE(absl::IsUnavailable(first.Join("w0", torch::kCPU, torch::kFloat32).status()));
  ASSERT_TRUE(first.Start().ok());
  absl::StatusOr<kappa::v1::JoinWeightGroupResponse> joined =
      first.Join("w0", torch::kCPU, torch::kFloat32);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_NE(joined->store(), kAnyPortStore);
  EXPECT_EQ(joined->store().rfind("tcp://127.0.0.1:", 0), 0u) << joined->store();

  options.store = joined->store();
  WeightBroadcaster second(&publisher, options);
  const absl::Status busy = second.Start();
  EXPECT_TRUE(absl::IsUnavailable(busy)) << busy;
  EXPECT_NE(busy.message().find("learner.weight_group_store: cannot listen on " + joined->store()),
            std::string::npos)
      << busy;
  publisher.Shutdown();
}

TEST(WeightGroupConfigTest, OptionsComeFromTheKeysAndABadStoreIsNamed) {
  services::Config config;
  absl::StatusOr<std::optional<WeightBroadcastOptions>> none =
      learner::WeightBroadcastOptionsFromConfig(config, torch::kCPU);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  config.learner.weight_group_workers = 3;
  config.learner.weight_group_store = "127.0.0.1:29500";
  absl::StatusOr<std::optional<WeightBroadcastOptions>> bad =
      learner::WeightBroadcastOptionsFromConfig(config, torch::kCPU);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(
                "learner.weight_group_store: '127.0.0.1:29500' is not tcp://HOST:PORT"),
            std::string::npos)
      << bad.status();
  config.learner.weight_group_store = "tcp://127.0.0.1:29500";
  config.student.dtype = services::ModelDtype::kBFloat16;
  absl::StatusOr<std::optional<WeightBroadcastOptions>> options =
      learner::WeightBroadcastOptionsFromConfig(config, torch::kCPU);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ((*options)->workers, 3);
  EXPECT_EQ((*options)->dtype, torch::kBFloat16);  // auto: the workers' student.dtype
  config.rollout.weights_dtype = services::ModelDtype::kFloat32;
  EXPECT_EQ((*learner::WeightBroadcastOptionsFromConfig(config, torch::kCPU))->dtype,
            torch::kFloat32);
}

}  // namespace
}  // namespace kappa::rollout
