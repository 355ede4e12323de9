// Keeps the worker's copy of the student policy current: one thread holds a
// Learner.WatchPolicy stream and writes each version's chunks, as they
// arrive, straight into the parameters of the "inactive copy" on
// options.device (rollout.device): the model it will publish next. That is
// the previously published model once no sampler holds it any more, else a
// freshly allocated one, so a model being sampled from is never written.
// The copy is published (one shared_ptr swap) only when the version is
// complete and valid; samplers take a shared_ptr snapshot, so a version being
// loaded is never seen half-written and an old version stays alive until
// its last user drops it. At steady state the worker holds two models.
//
// On the wire the worker asks for weights_dtype (rollout.weights_dtype) and,
// with weight_delta, offers the version it holds as a delta base: the learner
// may then send only the XOR of the new bytes against it
// (learner/policy_publisher.h), reconstructed here bit for bit.
//
// With rollout.weight_transport: c10d the worker first asks the learner for
// a rank in its same-host weight group (learner/weight_broadcaster.h) and
// receives each version there, one c10d broadcast per parameter into the
// same inactive copy, published the same way; when the group cannot form,
// is closed or fails, it falls back to WatchPolicy for good.
//
// With rollout.weight_transport: shm or auto the stream offers this host's
// shared memory (dist/shm_segment.h ShmHostKey); a learner on the same
// host and /dev/shm then sends each version as one SHARED_MEMORY chunk
// naming a segment it wrote, and the worker copies the segment into the
// same inactive copy (one copy, converting if the dtypes differ), published
// the same way. A segment that cannot be used (gone after the learner moved
// on, another size or token) rejects that version, is logged, and the next
// stream asks for chunks (gRPC) instead; the one after that offers shared
// memory again. With shm (not auto) a learner on another host refuses the
// stream, and the watcher stops retrying: fatal_status() says why.
//
// Threading: Start() and Stop() may be called from any thread; Current() and
// WaitForVersion() from any number of threads. Locks: thread_mu_, then mu_.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <grpcpp/grpcpp.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kappa/v1/learner.grpc.pb.h"
#include "services/config_choices.h"

namespace kappa::model {
class Decoder;
}
namespace kappa::dist {
class WeightGroup;
}

namespace kappa::rollout {

struct Policy {
  int64_t version = -1;
  std::shared_ptr<model::Decoder> model;  // null while version == -1
};

struct PolicyWatcherOptions {
  std::string worker_id;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Where every version's weights are loaded and its model runs
  // (rollout.device, checked by services::ResolveDevice at start-up).
  c10::Device device{c10::kCPU};
  // The parameters' dtype there (student.dtype, resolved at start-up).
  c10::ScalarType dtype = c10::kFloat;
  // Tests: called once per shared-memory version with half of its
  // parameters copied into the inactive copy (the rest not yet).
  std::function<void(int64_t version)> shm_mid_copy_hook = nullptr;
};

// How versions travel (rollout.weights_dtype, rollout.weight_delta).
struct WeightSyncOptions {
  // What travels on the wire: float32 or bfloat16. Unset ("auto"): bfloat16
  // when PolicyWatcherOptions.dtype is bfloat16, float32 otherwise.
  std::optional<c10::ScalarType> weights_dtype;
  // Offer the held version as a delta base. Only offered when the held
  // weights give the wire dtype's bytes exactly (the same dtype, or a
  // bfloat16 wire into float32 parameters).
  bool weight_delta = false;
  // student.lora: the learner trains adapters on frozen weights. The held
  // version is offered as a delta base as with weight_delta, so a version
  // carries only the adapters' bytes (the base travels once).
  bool lora_adapters = false;
  // rollout.weight_transport: c10d: receive versions in the learner's
  // same-host weight group while it lasts, WatchPolicy before and after.
  bool c10d = false;
  // How long the other members have to join after the learner's first
  // answer, and the group's rendezvous and collective timeout.
  absl::Duration group_timeout = absl::Seconds(60);
  // rollout.weight_transport: shm (kRequired) or auto (kAuto): take versions
  // as shared-memory segments from a learner on this host (its /dev/shm is
  // shm_dir), else chunks; kRequired refuses a learner on another host.
  enum class Shm { kOff, kAuto, kRequired };
  Shm shm = Shm::kOff;
  std::string shm_dir = "/dev/shm";
};

// rollout.weight_transport into `sync` (its c10d and shm fields).
void SetWeightTransport(services::WeightTransport transport, WeightSyncOptions* sync);

// rollout.weights_dtype: nullopt for auto (the worker's own dtype).
std::optional<c10::ScalarType> WeightsDtype(services::ModelDtype dtype);
// The wire dtype asked for (auto resolved against `dtype`, the model's).
c10::ScalarType WireDtype(const WeightSyncOptions& sync, c10::ScalarType dtype);

class PolicyWatcher {
 public:
  // `sync`: how versions travel (default: auto, no delta).
  PolicyWatcher(std::shared_ptr<grpc::ChannelInterface> learner_channel,
                PolicyWatcherOptions options, WeightSyncOptions sync = {});
  ~PolicyWatcher();  // Stop()s

  // Starts the watch thread (once; a no-op after Stop() or while it runs).
  void Start() ABSL_LOCKS_EXCLUDED(thread_mu_, mu_);
  // Cancels the stream, wakes every waiter, joins the thread. Idempotent;
  // concurrent calls all return once the thread is joined.
  void Stop() ABSL_LOCKS_EXCLUDED(thread_mu_, mu_);

  // The newest published policy (version -1, no model, before the first).
  Policy Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until a policy with version >= min_version is published (then
  // returns it: the newest), `deadline` passes (DEADLINE_EXCEEDED) or Stop()
  // is called (CANCELLED). A published version wakes it at once.
  absl::StatusOr<Policy> WaitForVersion(int64_t min_version, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Versions rejected as corrupt or unloadable (each also logged as an error).
  int64_t rejected_versions() const { return rejected_versions_.load(); }
  int64_t published_versions() const { return published_versions_.load(); }
  // Models allocated for versions (the others reused the inactive copy).
  int64_t models_allocated() const { return models_allocated_.load(); }
  // Versions that arrived as deltas, and chunk data bytes received.
  int64_t delta_versions() const { return delta_versions_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }
  // Versions received in the weight group (the others came over WatchPolicy).
  int64_t group_versions() const { return group_versions_.load(); }
  // Versions copied from shared memory, and segments that could not be
  // used (each also a rejected version; the next stream took chunks).
  int64_t shm_versions() const { return shm_versions_.load(); }
  int64_t shm_failures() const { return shm_failures_.load(); }
  // Not OK once the watcher gave up for good (rollout.weight_transport: shm
  // with a learner on another host): the learner's answer. WaitForVersion
  // returns it too.
  absl::Status fatal_status() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The watch thread: WatchOnce() until Stop(), with backoff between streams.
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads one stream until it ends; returns its final status.
  grpc::Status WatchOnce() ABSL_LOCKS_EXCLUDED(mu_);
  // Makes `policy` current; wakes WaitForVersion() callers it satisfies.
  // Returns the policy it replaced.
  Policy Publish(Policy policy, uint64_t policy_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Publishes spare_, just filled with `version`, and keeps the model it
  // replaces as the next inactive copy.
  void PublishSpare(int64_t version, uint64_t policy_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for Stop(); true once stopping.
  bool WaitForStop(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

  // --- the weight group (policy_watcher_group.cc)
  // Joins the learner's group and receives versions there until it ends;
  // returns to fall back to WatchPolicy (or on Stop()).
  void ReceiveFromGroup() ABSL_LOCKS_EXCLUDED(mu_);
  // The group's answer once every member has joined; an error status when
  // the learner offers none to this worker, when the others have not all
  // joined sync_.group_timeout after the first answer (DEADLINE_EXCEEDED),
  // or on Stop() (CANCELLED). (A Stop() while the group's rendezvous runs
  // waits for it, group_timeout at most.)
  absl::StatusOr<kappa::v1::JoinWeightGroupResponse> JoinGroup(c10::ScalarType wire)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Takes part in the broadcast of one announced version and publishes it
  // when it built and filled the inactive copy; an error status (the
  // version is rejected, the membership kept) when it did not. Throws what
  // the group throws.
  absl::Status ReceiveVersion(dist::WeightGroup& group, const std::string& manifest_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // --- shared memory (policy_watcher_shm.cc)
  // Copies the segment a SHARED_MEMORY chunk names into the inactive copy
  // and publishes it; an error status (nothing published) when the segment
  // or its contents cannot be used.
  absl::Status LoadFromShm(const kappa::v1::PolicyChunk& chunk) ABSL_LOCKS_EXCLUDED(mu_);

  // The inactive copy for a version with this config.json and
  // adapter_config.json (empty: no LoRA adapters): the spare model when no
  // one else holds it and its configs match, else a new one. Its weights
  // and adapters by name (model::PolicyTensors).
  absl::StatusOr<std::map<std::string, torch::Tensor>> Destination(
      const std::string& model_config_json, const std::string& adapter_config_json);

  std::unique_ptr<kappa::v1::Learner::StubInterface> stub_;
  const PolicyWatcherOptions options_;
  const WeightSyncOptions sync_;

  // Serializes starting and joining thread_.
  absl::Mutex thread_mu_;
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(thread_mu_);
  // What Current() returns; replaced whole by Publish().
  Policy current_ ABSL_GUARDED_BY(mu_);
  // Set once by Stop(); the thread and every wait end.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The open WatchPolicy call's context, so Stop() can TryCancel() it; null
  // between streams.
  grpc::ClientContext* active_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Set when the watcher gives up (fatal_status()).
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);

  // policy_id of current_ (PolicyChunk.policy_id), the delta base's identity.
  uint64_t current_policy_id_ ABSL_GUARDED_BY(mu_) = 0;

  // The watch thread's own: the inactive copy and the config it was built
  // for (the previously published model, or one being filled).
  std::shared_ptr<model::Decoder> spare_;
  std::string spare_config_json_;  // config.json, then adapter_config.json
  std::string current_config_json_;
  // This host's shared-memory key (empty: shared memory not offered), and
  // whether the next stream asks for chunks after a segment failed.
  const std::string shm_host_key_;
  bool shm_suspended_ = false;

  std::atomic<int64_t> rejected_versions_{0};
  std::atomic<int64_t> published_versions_{0};
  std::atomic<int64_t> models_allocated_{0};
  std::atomic<int64_t> delta_versions_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> group_versions_{0};
  std::atomic<int64_t> shm_versions_{0};
  std::atomic<int64_t> shm_failures_{0};
};

}  // namespace kappa::rollout
