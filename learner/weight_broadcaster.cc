#include "learner/weight_broadcaster.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <exception>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dist/weight_group.h"
#include "services/torch_runtime.h"
#include "services/torch_tensor_codec.h"

namespace kappa::learner {
namespace {

// How often the loop looks for a newer version, a member that left and Stop().
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

// NCCL takes one rank per GPU: the learner's and every member's device must
// be CUDA and pairwise distinct (an unset index is device 0).
bool DistinctGpus(torch::Device learner, const std::vector<torch::Device>& members) {
  const auto index = [](torch::Device device) { return device.has_index() ? device.index() : 0; };
  if (!learner.is_cuda()) return false;
  std::set<int> seen = {index(learner)};
  for (const torch::Device& device : members) {
    if (!device.is_cuda() || !seen.insert(index(device)).second) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::optional<WeightBroadcastOptions>> WeightBroadcastOptionsFromConfig(
    const services::Config& config, torch::Device learner_device) {
  if (config.learner.weight_group_workers <= 0) return std::optional<WeightBroadcastOptions>();
  WeightBroadcastOptions options;
  options.workers = static_cast<int>(config.learner.weight_group_workers);
  options.store = config.learner.weight_group_store;
  options.device = learner_device;
  if (options.store.rfind("tcp://", 0) != 0 || options.store.rfind(':') <= 6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner.weight_group_store: '", options.store,
        "' is not tcp://HOST:PORT (learner.weight_group_workers is ", options.workers, ")"));
  }
  switch (config.rollout.weights_dtype) {
    case services::ModelDtype::kFloat32:
      options.dtype = torch::kFloat32;
      break;
    case services::ModelDtype::kBFloat16:
      options.dtype = torch::kBFloat16;
      break;
    case services::ModelDtype::kAuto: {
      absl::StatusOr<torch::Device> worker_device =
          services::ResolveDevice(config.rollout.device, "rollout.device");
      if (!worker_device.ok()) return worker_device.status();
      options.dtype = services::ResolveModelDtype(config.student.dtype, *worker_device);
      break;
    }
  }
  return std::optional<WeightBroadcastOptions>(options);
}

WeightBroadcaster::WeightBroadcaster(PolicyPublisher* publisher, WeightBroadcastOptions options)
    : publisher_(publisher), options_(std::move(options)) {}

WeightBroadcaster::~WeightBroadcaster() { Stop(); }

absl::StatusOr<kappa::v1::JoinWeightGroupResponse> WeightBroadcaster::Join(
    const std::string& worker_id, torch::Device worker_device, torch::ScalarType worker_dtype) {
  if (worker_id.empty()) return absl::InvalidArgumentError("worker_id: empty");
  if (worker_dtype != options_.dtype) {
    return absl::FailedPreconditionError(
        absl::StrCat("weights_dtype: the worker asks for ", c10::toString(worker_dtype),
                     ", the weight group broadcasts ", c10::toString(options_.dtype),
                     " (rollout.weights_dtype and student.dtype must agree across the processes)"));
  }
  if (counters_.closed.load()) {
    return absl::FailedPreconditionError(
        "the weight group is closed (a member left or a broadcast failed); versions go over "
        "WatchPolicy");
  }
  absl::MutexLock lock(&mu_);
  auto found = ranks_.find(worker_id);
  if (found == ranks_.end()) {
    if (counters_.formed.load()) {
      return absl::FailedPreconditionError(
          "the weight group has formed without this worker; a c10d group takes no new member");
    }
    if (static_cast<int>(ranks_.size()) >= options_.workers) {
      return absl::ResourceExhaustedError(
          absl::StrCat("all ", options_.workers,
                       " ranks of the weight group are taken (learner.weight_group_workers)"));
    }
    const int rank = static_cast<int>(ranks_.size()) + 1;
    found = ranks_.emplace(worker_id, rank).first;
    member_devices_.push_back(worker_device);
    if (rank == options_.workers) nccl_ = DistinctGpus(options_.device, member_devices_);
    spdlog::info("weight group: worker '{}' is rank {} of {} (on {})", worker_id, rank,
                 options_.workers + 1, worker_device.str());
  }
  if (store_url_.empty() && absl::EndsWith(options_.store, ":0")) {
    return absl::UnavailableError("the weight group's store has no port yet (before Start)");
  }
  kappa::v1::JoinWeightGroupResponse response;
  response.set_store(store_url_.empty() ? options_.store : store_url_);
  response.set_rank(found->second);
  response.set_world_size(options_.workers + 1);
  response.set_joined(static_cast<int32_t>(ranks_.size()));
  response.set_nccl(nccl_);
  response.set_weights_dtype(services::ToWireDType(options_.dtype));
  return response;
}

absl::Status WeightBroadcaster::Start() {
  if (thread_.joinable()) return absl::OkStatus();
  const dist::WeightGroupOptions group{options_.store, 0, options_.workers + 1, torch::kCPU,
                                       options_.timeout};
  try {
    c10::intrusive_ptr<::c10d::Store> store = dist::ServeTcpStore(group);
    const std::string url = dist::BoundStoreUrl(group, store);
    absl::MutexLock lock(&mu_);
    store_ = std::move(store);
    store_url_ = url;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("learner.weight_group_store: cannot listen on ",
                                               options_.store, ": ", e.what()));
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void WeightBroadcaster::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool WeightBroadcaster::nccl() const {
  absl::MutexLock lock(&mu_);
  return nccl_;
}

bool WeightBroadcaster::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool WeightBroadcaster::WaitForMembers() {
  absl::MutexLock lock(&mu_);
  const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || static_cast<int>(ranks_.size()) == options_.workers;
  };
  mu_.Await(absl::Condition(&ready));
  return !stopping_;
}

void WeightBroadcaster::Loop() {
  if (!WaitForMembers()) {
    counters_.closed = true;
    return;
  }
  c10::intrusive_ptr<::c10d::Store> store;
  std::string url;
  {
    absl::MutexLock lock(&mu_);
    store = store_;
    url = store_url_;
  }
  std::unique_ptr<dist::WeightGroup> group;
  try {
    const bool use_nccl = nccl();
    group = dist::WeightGroup::Form(
        store, {url, 0, options_.workers + 1,
                use_nccl ? options_.device : torch::Device(torch::kCPU), options_.timeout});
    counters_.formed = true;
    spdlog::info("weight group formed at {}: {} workers, {} on {} tensors", url, options_.workers,
                 nccl() ? "NCCL" : "Gloo", c10::toString(options_.dtype));
    BroadcastVersions(*group);
  } catch (const std::exception& e) {
    spdlog::error("weight group: {}; versions go over WatchPolicy from now on", e.what());
  }
  counters_.closed = true;
  if (group != nullptr) {
    try {
      group->Close();
    } catch (const std::exception& e) {
      spdlog::warn("weight group: closing: {}", e.what());
    }
  }
}

void WeightBroadcaster::BroadcastVersions(dist::WeightGroup& group) {
  int64_t sent_version = -1;
  int64_t sequence = 0;
  while (!stopping()) {
    const absl::Time deadline = absl::Now() + kPollInterval;
    std::shared_ptr<const PolicySnapshot> snapshot = publisher_->WaitNewer(sent_version, deadline);
    if (group.AnyoneLeft()) {
      spdlog::warn("weight group: a member left; versions go over WatchPolicy from now on");
      return;
    }
    if (snapshot == nullptr) {
      // Asked, not inferred from the clock: a timed-out wait can end a
      // little before `deadline`, and reading that as a shutdown closed
      // the group after the first slow step.
      if (publisher_->shut_down()) return;
      continue;
    }
    SendVersion(group, ++sequence, snapshot);
    sent_version = snapshot->version;
  }
}

void WeightBroadcaster::SendVersion(dist::WeightGroup& group, int64_t sequence,
                                    const std::shared_ptr<const PolicySnapshot>& snapshot) {
  const absl::Time start = absl::Now();
  // Converted once per version and dtype, shared with WatchPolicy streams.
  const std::shared_ptr<const EncodedPolicy> encoded = publisher_->Encode(snapshot, options_.dtype);
  kappa::v1::WeightGroupManifest manifest;
  manifest.set_version(encoded->version);
  manifest.set_policy_id(encoded->policy_id);
  manifest.set_model_config_json(encoded->model_config_json);
  manifest.set_adapter_config_json(encoded->adapter_config_json);
  manifest.set_dtype(services::ToWireDType(encoded->dtype));
  std::vector<torch::Tensor> tensors;
  tensors.reserve(encoded->weights.size());
  for (const auto& [name, tensor] : encoded->weights) {
    kappa::v1::WeightGroupManifest::Parameter* parameter = manifest.add_parameters();
    parameter->set_name(name);
    for (int64_t size : tensor.sizes()) parameter->add_shape(size);
    tensors.push_back(tensor.to(group.device()).contiguous());
  }
  group.Send(sequence, manifest.SerializeAsString(), tensors);
  ++counters_.versions;
  counters_.bytes += encoded->bytes;
  counters_.microseconds += absl::ToInt64Microseconds(absl::Now() - start);
  spdlog::info("weight group: version {} sent to {} workers ({} {} bytes, {:.1f} ms)",
               encoded->version, options_.workers, encoded->bytes, c10::toString(encoded->dtype),
               absl::ToDoubleMilliseconds(absl::Now() - start));
}

}  // namespace kappa::learner
