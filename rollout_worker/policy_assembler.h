// Reassembles the chunked weights of one policy version (learner.proto
// PolicyChunk) into complete parameter tensors. Pure bookkeeping and
// validation, no I/O, so every rejection rule is unit-testable.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kappa/v1/learner.pb.h"

namespace kappa::rollout {

struct AssembledPolicy {
  int64_t version = -1;
  std::string model_config_json;
  std::map<std::string, torch::Tensor> weights;  // Hugging Face names, CPU
};

class PolicyAssembler {
 public:
  // Feeds one chunk. Returns the finished policy on the chunk that completes a
  // version, nullopt while a version is still arriving, and an error when the
  // version being assembled is invalid: that version is then discarded and its
  // remaining chunks are ignored until a chunk of another version arrives.
  // A chunk of a new version while another is incomplete discards the old one
  // (with an error for it).
  absl::StatusOr<std::optional<AssembledPolicy>> Add(const kappa::v1::PolicyChunk& chunk);

  // Drops any partially received version (e.g. when the stream broke).
  void Reset();

  // Version currently being assembled (or discarded), -1 when idle.
  int64_t pending_version() const { return version_; }

 private:
  struct Parameter {
    torch::Tensor tensor;
    int64_t total_bytes = 0;
    int64_t received_bytes = 0;
    // Received byte ranges [begin, end), to reject overlapping chunks.
    std::map<int64_t, int64_t> ranges;
  };

  absl::Status AddToParameter(const kappa::v1::PolicyChunk& chunk);
  absl::StatusOr<AssembledPolicy> Finish(const kappa::v1::PolicyChunk& last);
  absl::Status Discard(absl::Status why);

  int64_t version_ = -1;
  bool discarded_ = false;
  std::string config_json_;
  std::string last_config_json_;  // reused when a version omits its config
  std::map<std::string, Parameter> parameters_;
};

}  // namespace kappa::rollout
