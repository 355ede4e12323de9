// Holds the latest published policy weights and wakes WatchPolicy streams
// when a newer version appears. Snapshots are immutable once published, so
// streams send them without holding any lock.
//
// Wire encodings (rollout.weights_dtype, rollout.weight_delta): a version is
// converted to a wire dtype once, by the first stream that asks for it, and
// every other stream asking for that dtype sends the same bytes (Encode). A
// version can also travel as a lossless delta against the version published
// before it (Delta): its bytes in the wire dtype XOR the base's, cut into
// 64 KiB blocks; blocks whose XOR is zero travel as UNCHANGED ranges without
// data, the others as XOR chunks. The worker reconstructs the exact bytes.
// Only the previous version's encodings are kept as bases (when deltas are
// on), so a worker holding an older version gets a full one.
//
// Same-host workers (rollout.weight_transport: shm/auto) get a version as a
// shared-memory segment instead (Shm, learner/shm_policy.h): written once
// per (version, dtype) beside the encoding, converting straight from the
// snapshot when no encoding exists yet (the encoding then views the
// segment: one copy out of the learner for every stream).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "learner/shm_policy.h"

namespace kappa::learner {

struct PolicySnapshot {
  int64_t version = 0;
  std::string model_config_json;
  // With LoRA (student.lora): the adapters' PEFT adapter_config.json, and
  // `weights` holds the frozen base weights (the same tensors in every
  // version, so deltas skip them without comparing) and the adapters.
  std::string adapter_config_json;
  // The weights' dtype: float32, or bfloat16 when every consumer asks for
  // bfloat16 (PolicySnapshotDtype); a bfloat16 snapshot encodes only as
  // bfloat16.
  torch::ScalarType dtype = torch::kFloat32;
  // Hugging Face names -> contiguous CPU tensors in `dtype` (deep copies).
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  // weights[0, frozen_weights) are the same tensors in every version (LoRA's
  // frozen weights): each is converted to a wire dtype once, and the
  // conversion is shared by every version's encoding.
  int64_t frozen_weights = 0;
};

// One version's weights in one wire dtype, as every stream sends them.
struct EncodedPolicy {
  int64_t version = 0;
  uint64_t policy_id = 0;  // PolicyChunk.policy_id
  std::string model_config_json;
  std::string adapter_config_json;  // PolicySnapshot's
  torch::ScalarType dtype = torch::kFloat32;
  // Contiguous CPU tensors in `dtype`, in the snapshot's order (float32: the
  // snapshot's own tensors, not copies).
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  int64_t bytes = 0;  // sum of the tensors' bytes
  // The segment `weights` are views of, when the encoding was written
  // straight into shared memory (kept mapped while this lives).
  std::shared_ptr<const dist::ShmSegment> segment;
};

// A version as a delta against a base version, both in `target->dtype`.
struct EncodedDelta {
  // A byte range [offset, offset + size) of one parameter: equal to the
  // base's (unchanged, no data), or XOR data (xor_offset into xor_bytes).
  struct Segment {
    int64_t offset = 0;
    int64_t size = 0;
    bool unchanged = false;
    int64_t xor_offset = 0;
  };
  struct Parameter {
    std::vector<Segment> segments;  // cover the parameter's bytes in order
    // Parameters the base lacks or shapes differently travel whole (RAW).
    bool raw = false;
    std::string xor_bytes;
  };
  std::shared_ptr<const EncodedPolicy> target;
  int64_t base_version = -1;
  uint64_t base_policy_id = 0;
  std::vector<Parameter> parameters;  // target->weights' order
  int64_t bytes = 0;                  // data bytes a stream sends
};

struct PublisherOptions {
  // Keep each version's encodings after the next one is published, as delta
  // bases (rollout.weight_delta). Costs one more copy per dtype in use.
  bool keep_delta_bases = false;
  // Delta granularity: ranges of this many bytes are skipped when equal.
  int64_t delta_block_bytes = 64 << 10;
  int64_t max_chunk_bytes = 1 << 20;  // XOR data per chunk at most
  // Where same-host segments go (a tmpfs directory); empty: no shared
  // memory is offered. The publisher sweeps dead learners' segments there
  // when it is built and unlinks its own at Shutdown().
  std::string shm_dir = dist::kDefaultShmDir;
};

class PolicyPublisher {
 public:
  PolicyPublisher();
  explicit PolicyPublisher(PublisherOptions options);

  void Publish(std::shared_ptr<const PolicySnapshot> snapshot) ABSL_LOCKS_EXCLUDED(mu_);
  // The latest snapshot if its version > known_version; waits for one until
  // `deadline` or shutdown (then nullptr; shut_down() tells the two apart:
  // the wait may end a little before `deadline` by absl::Now()).
  std::shared_ptr<const PolicySnapshot> WaitNewer(int64_t known_version, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every wait and unlinks this publisher's shared-memory segments.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  bool shut_down() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t version() const ABSL_LOCKS_EXCLUDED(mu_);

  // `snapshot` in `dtype` (float32 or bfloat16; others, and float32 of a
  // bfloat16 snapshot, throw std::invalid_argument). Converted once per (version, dtype) while the
  // version is the latest (or the kept base); later callers share it.
  std::shared_ptr<const EncodedPolicy> Encode(const std::shared_ptr<const PolicySnapshot>& snapshot,
                                              torch::ScalarType dtype) ABSL_LOCKS_EXCLUDED(mu_);
  // `snapshot` as a delta against (base_version, base_policy_id) in `dtype`,
  // computed once; nullptr when that base is not kept (deltas off, an older
  // or unknown version, another learner process's weights).
  std::shared_ptr<const EncodedDelta> Delta(const std::shared_ptr<const PolicySnapshot>& snapshot,
                                            torch::ScalarType dtype, int64_t base_version,
                                            uint64_t base_policy_id) ABSL_LOCKS_EXCLUDED(mu_);

  // `snapshot` in `dtype` as a shared-memory segment, written once per
  // (version, dtype) while the version is the latest (or the kept base),
  // and shared by every stream; a failure (ENOSPC: RESOURCE_EXHAUSTED, a
  // version two behind: NOT_FOUND, after Shutdown(): FAILED_PRECONDITION)
  // is remembered for that (version, dtype) too, so a full /dev/shm costs
  // one attempt per version. Throws as Encode() for a bad dtype.
  absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> Shm(
      const std::shared_ptr<const PolicySnapshot>& snapshot, torch::ScalarType dtype)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The key a worker's WatchPolicyRequest.host_key must equal for Shm()
  // segments to be offered to it; empty: none are.
  const std::string& shm_host_key() const;
  // The segments' store (null without shm_dir).
  const ShmPolicyStore* shm_store() const { return shm_.get(); }

  // PolicyChunk.policy_id of `version` published by this publisher.
  uint64_t PolicyId(int64_t version) const;
  bool keeps_delta_bases() const { return options_.keep_delta_bases; }
  // Conversions done (one per version and dtype asked for), for tests.
  int64_t encodings_made() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One version in one dtype, filled by the first caller under its mutex.
  struct Slot {
    absl::Mutex mu;
    std::shared_ptr<const EncodedPolicy> encoded ABSL_GUARDED_BY(mu);
    int64_t delta_base_version ABSL_GUARDED_BY(mu) = -1;
    std::shared_ptr<const EncodedDelta> delta ABSL_GUARDED_BY(mu);
    // Shm(): the segment, or why it could not be written (not OK: tried).
    std::shared_ptr<const dist::ShmSegment> shm ABSL_GUARDED_BY(mu);
    absl::Status shm_error ABSL_GUARDED_BY(mu);
  };
  struct VersionSlots {
    std::shared_ptr<const PolicySnapshot> snapshot;
    std::map<int, std::shared_ptr<Slot>> by_dtype;
  };
  // The slot of (snapshot's version, dtype): the latest's or the base's;
  // a fresh uncached one for any other version.
  std::shared_ptr<Slot> SlotFor(const std::shared_ptr<const PolicySnapshot>& snapshot,
                                torch::ScalarType dtype) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<const EncodedPolicy> EncodeInto(Slot& slot, const PolicySnapshot& snapshot,
                                                  torch::ScalarType dtype) ABSL_LOCKS_EXCLUDED(mu_);
  // EncodeInto with slot.mu held.
  std::shared_ptr<const EncodedPolicy> EncodeLocked(Slot& slot, const PolicySnapshot& snapshot,
                                                    torch::ScalarType dtype)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mu) ABSL_LOCKS_EXCLUDED(mu_);
  // Shm() for a slot, with slot.mu held: writes the segment from the
  // encoding, or straight from the snapshot (and makes the encoding its views).
  absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> ShmLocked(Slot& slot,
                                                                    const PolicySnapshot& snapshot,
                                                                    torch::ScalarType dtype)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mu) ABSL_LOCKS_EXCLUDED(mu_);
  // Checks Encode()'s dtype rules; throws std::invalid_argument.
  static void CheckDtype(const PolicySnapshot& snapshot, torch::ScalarType dtype);
  // `frozen` (a PolicySnapshot frozen weight) in `dtype`: converted at the
  // first call, the same tensor at every later one.
  torch::Tensor FrozenEncoding(const torch::Tensor& frozen, torch::ScalarType dtype)
      ABSL_LOCKS_EXCLUDED(frozen_mu_);

  const PublisherOptions options_;
  const uint64_t nonce_;
  const std::unique_ptr<ShmPolicyStore> shm_;  // null without options_.shm_dir
  mutable absl::Mutex mu_;
  absl::CondVar published_;
  std::shared_ptr<const PolicySnapshot> latest_ ABSL_GUARDED_BY(mu_);
  VersionSlots latest_slots_ ABSL_GUARDED_BY(mu_);
  VersionSlots base_slots_ ABSL_GUARDED_BY(mu_);  // the version before latest_
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // FrozenEncoding's conversions by (the frozen tensor's data, dtype); the
  // entry holds the frozen tensor too, so its address is never reused.
  absl::Mutex frozen_mu_;
  std::map<std::pair<const void*, int>, std::pair<torch::Tensor, torch::Tensor>> frozen_encodings_
      ABSL_GUARDED_BY(frozen_mu_);
  int64_t encodings_made_ ABSL_GUARDED_BY(mu_) = 0;
};

// Bytes of `encoded` XOR `base` (same size), written to `out`; true when all zero.
bool XorBytes(const char* a, const char* b, int64_t size, char* out);

}  // namespace kappa::learner
