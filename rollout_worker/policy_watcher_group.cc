// PolicyWatcher's c10d path: membership of the learner's same-host weight
// group (learner/weight_broadcaster.h, dist/weight_group.h).
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dist/weight_group.h"
#include "model/checkpoint.h"
#include "rollout_worker/backoff.h"
#include "rollout_worker/policy_watcher.h"
#include "services/grpc_util.h"
#include "services/torch_tensor_codec.h"

namespace kappa::rollout {
namespace {

// How often the worker asks whether every member has joined, and polls the
// store for the next version's manifest (a store round trip each).
constexpr absl::Duration kJoinPollInterval = absl::Milliseconds(50);
constexpr absl::Duration kManifestPollInterval = absl::Milliseconds(5);

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

absl::StatusOr<kappa::v1::JoinWeightGroupResponse> PolicyWatcher::JoinGroup(c10::ScalarType wire) {
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  kappa::v1::JoinWeightGroupRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_cuda(options_.device.is_cuda());
  request.set_cuda_index(options_.device.has_index() ? options_.device.index() : 0);
  request.set_weights_dtype(services::ToWireDType(wire));
  // From the first answer on, the other members have this long to join.
  std::optional<absl::Time> give_up;
  kappa::v1::JoinWeightGroupResponse last;  // the latest answer
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    kappa::v1::JoinWeightGroupResponse response;
    const grpc::Status status = stub_->JoinWeightGroup(&context, request, &response);
    if (status.ok() && response.joined() >= response.world_size() - 1) return response;
    if (!status.ok() && !Retryable(status.error_code())) {
      return services::FromGrpcStatus(status);
    }
    if (status.ok()) {
      last = response;
      if (!give_up) give_up = absl::Now() + sync_.group_timeout;
    }
    if (give_up && absl::Now() > *give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("only ", last.joined(), " of ", last.world_size() - 1,
                       " members joined within ", absl::FormatDuration(sync_.group_timeout)));
    }
    if (WaitForStop(status.ok() ? kJoinPollInterval : backoff.Next())) {
      return absl::CancelledError("policy watcher stopped");
    }
  }
}

void PolicyWatcher::ReceiveFromGroup() {
  const c10::ScalarType wire = WireDtype(sync_, options_.dtype);
  absl::StatusOr<kappa::v1::JoinWeightGroupResponse> joined = JoinGroup(wire);
  if (!joined.ok()) {
    if (!absl::IsCancelled(joined.status())) {
      spdlog::warn("weight group: {}; versions come over WatchPolicy",
                   std::string(joined.status().message()));
    }
    return;
  }
  std::unique_ptr<dist::WeightGroup> group;
  try {
    // NCCL on this worker's GPU; Gloo on CPU tensors otherwise (copied to
    // the policy's device parameter by parameter).
    const c10::Device device = joined->nccl() ? options_.device : c10::Device(c10::kCPU);
    group = dist::WeightGroup::Connect({joined->store(), joined->rank(), joined->world_size(),
                                        device, absl::ToChronoMilliseconds(sync_.group_timeout)});
    spdlog::info("weight group: rank {} of {} at {} ({})", joined->rank(), joined->world_size(),
                 joined->store(), joined->nccl() ? "NCCL" : "Gloo");
    for (int64_t sequence = 1;; ++sequence) {
      std::string manifest;
      dist::WeightGroup::Poll poll;
      while ((poll = group->PollManifest(sequence, &manifest)) ==
             dist::WeightGroup::Poll::kNotYet) {
        if (WaitForStop(kManifestPollInterval)) {
          group->Leave();
          return;
        }
      }
      if (poll == dist::WeightGroup::Poll::kClosed) {
        spdlog::warn("weight group closed by the learner; versions come over WatchPolicy");
        return;
      }
      if (absl::Status received = ReceiveVersion(*group, manifest); !received.ok()) {
        rejected_versions_.fetch_add(1);
        spdlog::error("weight group: {}", std::string(received.message()));
      }
    }
  } catch (const std::exception& e) {
    spdlog::error("weight group: {}; versions come over WatchPolicy", e.what());
    if (group != nullptr) {
      try {
        group->Leave();
      } catch (const std::exception&) {
        // The store is gone with the learner: nobody to tell.
      }
    }
  }
}

absl::Status PolicyWatcher::ReceiveVersion(dist::WeightGroup& group,
                                           const std::string& manifest_bytes) {
  const absl::Time start = absl::Now();
  kappa::v1::WeightGroupManifest manifest;
  if (!manifest.ParseFromString(manifest_bytes)) {
    // Without the manifest the tensors cannot be received: the group is lost.
    throw std::runtime_error("a version's manifest does not parse");
  }
  absl::StatusOr<torch::ScalarType> wire = services::ToTorchDType(manifest.dtype());
  if (!wire.ok()) throw std::runtime_error("manifest dtype: " + wire.status().ToString());

  // Where each parameter goes: straight into the inactive copy when it
  // already has the wire's dtype and the group's device; else through one
  // scratch buffer the size of the largest parameter.
  absl::Status problem = absl::OkStatus();
  absl::StatusOr<std::map<std::string, torch::Tensor>> destination =
      Destination(manifest.model_config_json(), manifest.adapter_config_json());
  if (!destination.ok()) problem = destination.status();
  int64_t largest = 0;
  for (const auto& parameter : manifest.parameters()) {
    int64_t numel = 1;
    for (int64_t size : parameter.shape()) numel *= size;
    largest = std::max(largest, numel);
  }
  const torch::Tensor scratch =
      torch::empty({largest}, torch::TensorOptions().dtype(*wire).device(group.device()));
  std::set<std::string> seen;
  int64_t bytes = 0;
  for (const auto& parameter : manifest.parameters()) {
    const std::vector<int64_t> shape(parameter.shape().begin(), parameter.shape().end());
    int64_t numel = 1;
    for (int64_t size : shape) numel *= size;
    torch::Tensor target;
    if (problem.ok()) {
      auto found = destination->find(parameter.name());
      if (found == destination->end() || !found->second.sizes().equals(shape)) {
        problem = absl::InvalidArgumentError(absl::StrCat(
            "version ", manifest.version(), ": parameter '", parameter.name(),
            found == destination->end() ? "' is not in the model" : "' has another shape"));
      } else {
        target = found->second;
        seen.insert(parameter.name());
      }
    }
    const bool in_place = target.defined() && target.scalar_type() == *wire &&
                          target.device() == group.device() && target.is_contiguous();
    torch::Tensor received = in_place ? target : scratch.narrow(0, 0, numel).view(shape);
    group.Receive({received});
    if (target.defined() && !in_place) target.copy_(received);
    bytes += received.numel() * received.element_size();
  }
  if (problem.ok() && seen.size() != destination->size()) {
    problem = absl::InvalidArgumentError(absl::StrCat("version ", manifest.version(), ": ",
                                                      destination->size() - seen.size(),
                                                      " parameters of the model are missing"));
  }
  if (!problem.ok()) return problem;
  bytes_received_.fetch_add(bytes);
  group_versions_.fetch_add(1);
  PublishSpare(manifest.version(), manifest.policy_id());
  spdlog::info("policy version {} loaded on {} from the weight group ({} {} bytes, {:.1f} ms)",
               manifest.version(), options_.device.str(), bytes, c10::toString(*wire),
               absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace kappa::rollout
