// PolicyWatcher's shared-memory path: a version the learner wrote into a
// segment on this host (dist/shm_segment.h), copied into the inactive copy.
#include <torch/torch.h>

#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "dist/shm_segment.h"
#include "rollout_worker/policy_watcher.h"

namespace kappa::rollout {

absl::Status PolicyWatcher::LoadFromShm(const kappa::v1::PolicyChunk& chunk) {
  absl::StatusOr<std::unique_ptr<dist::OpenShmSegment>> segment = dist::OpenShmSegmentFor(
      chunk.shm_path(), chunk.shm_bytes(), chunk.shm_token(), chunk.version(), chunk.policy_id());
  if (!segment.ok()) return segment.status();
  const kappa::v1::WeightGroupManifest& manifest = (*segment)->manifest();
  absl::StatusOr<std::map<std::string, torch::Tensor>> destination =
      Destination(manifest.model_config_json(), chunk.adapter_config_json());
  if (!destination.ok()) return destination.status();
  // Every parameter of the model exactly once, with its shape.
  std::vector<std::pair<torch::Tensor, int>> copies;
  std::set<std::string> seen;
  for (int i = 0; i < manifest.parameters_size(); ++i) {
    const auto& parameter = manifest.parameters(i);
    auto found = destination->find(parameter.name());
    const std::vector<int64_t> shape(parameter.shape().begin(), parameter.shape().end());
    if (found == destination->end() || !found->second.sizes().equals(shape) ||
        !seen.insert(parameter.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("version ", chunk.version(), ": parameter '", parameter.name(),
                       found == destination->end() ? "' is not in the model"
                                                   : "' has another shape or comes twice"));
    }
    copies.emplace_back(found->second, i);
  }
  if (seen.size() != destination->size()) {
    return absl::InvalidArgumentError(absl::StrCat("version ", chunk.version(), ": ",
                                                   destination->size() - seen.size(),
                                                   " parameters of the model are missing"));
  }
  // The one copy into the model (converting when the dtypes differ).
  if (options_.shm_mid_copy_hook) {
    const auto half = copies.begin() + static_cast<std::ptrdiff_t>(copies.size() / 2);
    KAPPA_RETURN_IF_ERROR((*segment)->ReadInto({copies.begin(), half}));
    options_.shm_mid_copy_hook(chunk.version());
    KAPPA_RETURN_IF_ERROR((*segment)->ReadInto({half, copies.end()}));
  } else {
    KAPPA_RETURN_IF_ERROR((*segment)->ReadInto(copies));
  }
  segment->reset();  // closed: the model holds its own copy
  bytes_received_.fetch_add(chunk.shm_bytes());
  shm_versions_.fetch_add(1);
  PublishSpare(chunk.version(), chunk.policy_id());
  return absl::OkStatus();
}

}  // namespace kappa::rollout
