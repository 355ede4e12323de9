// Reassembles the chunked weights of one policy version (learner.proto
// PolicyChunk) into complete parameter tensors. Pure bookkeeping and
// validation, no I/O, so every rejection rule is unit-testable.
//
// Where the bytes go: by default the assembler allocates a CPU tensor of the
// wire dtype per parameter. With a Destination it writes each chunk straight
// into the tensors the destination returns for the version (the parameters
// of the model the worker will publish next, on its device and in its dtype,
// converted on the way), so no host copy of the whole version exists. Those
// tensors are written as chunks arrive: they are garbage until Add() returns
// the finished version, and the caller must not publish them on an error.
//
// Deltas (PolicyChunk.encoding XOR / UNCHANGED) are reconstructed against
// the PolicyBase given with SetBase(): the exact bytes, in the wire dtype, of
// the version the worker holds; a delta against any other version (or other
// weights under the same number) is rejected.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kappa/v1/learner.pb.h"

namespace kappa::rollout {

struct AssembledPolicy {
  int64_t version = -1;
  uint64_t policy_id = 0;  // PolicyChunk.policy_id (0 from a learner that sends none)
  std::string model_config_json;
  // PolicyChunk.adapter_config_json of the first chunk (empty: a plain model).
  std::string adapter_config_json;
  // Hugging Face names: the destination's tensors, else CPU tensors of the wire dtype.
  std::map<std::string, torch::Tensor> weights;
  bool delta = false;      // some chunk was XOR / UNCHANGED
  int64_t data_bytes = 0;  // chunk data received for this version
};

// The weights a delta is applied to: the version the worker holds, on any
// device and in any dtype from which the wire dtype's bytes are exact. Read,
// never written.
struct PolicyBase {
  int64_t version = -1;
  uint64_t policy_id = 0;
  std::map<std::string, torch::Tensor> weights;
};

class PolicyAssembler {
 public:
  // Called at the first chunk of each version with its config.json and its
  // adapter_config.json (empty without LoRA adapters): the tensors to fill,
  // by Hugging Face name (contiguous; every one must be
  // received, with its shape; any device and floating dtype). An error
  // discards the version.
  using Destination = std::function<absl::StatusOr<std::map<std::string, torch::Tensor>>(
      int64_t version, const std::string& model_config_json,
      const std::string& adapter_config_json)>;

  PolicyAssembler() = default;
  explicit PolicyAssembler(Destination destination) : destination_(std::move(destination)) {}

  // The version deltas are reconstructed against (none: deltas are rejected).
  void SetBase(PolicyBase base) { base_ = std::move(base); }

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
    torch::Tensor tensor;  // where the bytes go (destination or allocated)
    torch::Tensor flat;    // tensor.view(-1)
    torch::ScalarType wire_dtype = torch::kFloat32;
    int64_t element_bytes = 0;
    std::vector<int64_t> shape;
    int64_t total_bytes = 0;  // in the wire dtype
    int64_t received_bytes = 0;
    // CPU, contiguous and of the wire dtype: chunks are memcpy'd in.
    bool direct = false;
    // Received byte ranges [begin, end), to reject overlapping chunks.
    std::map<int64_t, int64_t> ranges;
  };

  absl::Status AddToParameter(const kappa::v1::PolicyChunk& chunk);
  absl::Status Write(Parameter& parameter, const kappa::v1::PolicyChunk& chunk,
                     const std::string& field, int64_t begin, int64_t size);
  absl::StatusOr<AssembledPolicy> Finish(const kappa::v1::PolicyChunk& last);
  absl::Status Discard(absl::Status why);

  Destination destination_;
  PolicyBase base_;
  int64_t version_ = -1;
  uint64_t policy_id_ = 0;
  bool discarded_ = false;
  bool delta_ = false;
  int64_t data_bytes_ = 0;
  std::string config_json_;
  std::string adapter_json_;
  std::string last_config_json_;  // reused when a version omits its config
  std::map<std::string, torch::Tensor> targets_;  // the destination's, this version
  std::map<std::string, Parameter> parameters_;
};

// True when every element of `bytes` bytes of `dtype` (float32, bfloat16,
// float16; other dtypes always pass) is finite, by its exponent bits.
bool AllFiniteBytes(const void* data, int64_t bytes, torch::ScalarType dtype);

}  // namespace kappa::rollout
