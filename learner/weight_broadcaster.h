// The learner's end of the same-host weight broadcast
// (learner.weight_group_workers, docs/scaling.md): a c10d group of the
// learner (rank 0) and N rollout workers of its host, Gloo on CPU tensors or
// NCCL on CUDA ones, over which every published policy
// version goes out once, to every member at the same time, instead of one
// WatchPolicy stream per worker. Workers elsewhere keep WatchPolicy: the
// publisher serves both.
//
// Membership: workers call Join() (the JoinWeightGroup RPC) and get ranks
// 1..N in the order they ask, the same rank again for the same worker id.
// When the last one joins, the backend is fixed: NCCL when the learner and
// every member compute on CUDA devices that are all distinct (NCCL takes
// one rank per GPU), Gloo on CPU tensors otherwise (e.g. one GPU shared by
// the learner and its workers: each member copies to its device).
// Once all N have joined, the broadcast thread meets them at the store and
// sends the newest version, then each newer one as it is published (a
// version published while one is in flight is skipped if a newer one
// follows: members, like WatchPolicy streams, get the newest). Versions are
// whole: a member publishes a version only after its last tensor.
//
// A member that leaves (Stop) or dies ends the group: the thread notices a
// Leave() before its next version, or a collective times out
// (options.timeout); it closes the group, every member falls back to
// WatchPolicy, and Join() answers FAILED_PRECONDITION from then on. A group
// cannot take a new member once formed (c10d groups are fixed).
//
// Threading: Join() from any number of RPC threads; Start()/Stop() from the
// owner. Locks: mu_ only.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kappa/v1/learner.pb.h"
#include "learner/policy_publisher.h"
#include "services/config.h"

namespace c10d {
class Store;
}
namespace kappa::dist {
class WeightGroup;
}

namespace kappa::learner {

struct WeightBroadcastOptions {
  int workers = 0;  // learner.weight_group_workers: the members, ranks 1..workers
  // learner.weight_group_store: tcp://HOST:PORT, served by the learner;
  // PORT 0: any free one (what `kappa run` asks for).
  std::string store;
  // learner.device: where the learner's tensors live (NCCL needs CUDA).
  torch::Device device = torch::kCPU;
  // The one dtype every version is broadcast in (rollout.weights_dtype
  // resolved against student.dtype, as the members resolve it).
  torch::ScalarType dtype = torch::kFloat32;
  // The rendezvous and each version's broadcast give up after this long.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

struct WeightBroadcastCounters {
  std::atomic<int64_t> versions{0};      // versions every member received
  std::atomic<int64_t> bytes{0};         // their tensor bytes (once, not per member)
  std::atomic<int64_t> microseconds{0};  // time in Send, summed over versions
  std::atomic<bool> formed{false};
  std::atomic<bool> closed{false};
};

// The options of config's learner.weight_group_* keys for a learner whose
// student lives on `learner_device`; nullopt when learner.weight_group_workers
// is 0. The dtype: rollout.weights_dtype, or for `auto` the student.dtype the
// workers resolve on rollout.device (bfloat16 stays bfloat16, anything else
// travels as float32). INVALID_ARGUMENT naming the key: a store that is not
// tcp://HOST:PORT, a bad dtype or device.
absl::StatusOr<std::optional<WeightBroadcastOptions>> WeightBroadcastOptionsFromConfig(
    const services::Config& config, torch::Device learner_device);

class WeightBroadcaster {
 public:
  // REQUIRES: options.workers >= 1, options.store tcp://HOST:PORT;
  // `publisher` outlives this.
  WeightBroadcaster(PolicyPublisher* publisher, WeightBroadcastOptions options);
  ~WeightBroadcaster();  // Stop()s

  // JoinWeightGroup: the rank of `worker_id` (assigned on its first ask),
  // how many ranks are assigned so far, where the group meets and, once all
  // have joined, its backend. The store is the address Start() bound
  // (options.store as written before then; UNAVAILABLE before then when its
  // port is 0). `worker_device`: where the worker's policy
  // runs. INVALID_ARGUMENT for an empty worker_id; FAILED_PRECONDITION when
  // the worker's dtype differs from the group's or the group is closed or
  // formed without it; RESOURCE_EXHAUSTED when all ranks are taken.
  absl::StatusOr<kappa::v1::JoinWeightGroupResponse> Join(const std::string& worker_id,
                                                          torch::Device worker_device,
                                                          torch::ScalarType worker_dtype)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Listens on options.store (port 0: one the kernel chooses; Join hands
  // out the bound address) and starts the broadcast thread. Once; UNAVAILABLE
  // naming learner.weight_group_store when the address cannot be bound.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the thread: at once while members are missing, after the version
  // in flight otherwise (at most options.timeout); closes the group.
  // REQUIRES: before the publisher's Shutdown() (its waits end the loop).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  const WeightBroadcastCounters& counters() const { return counters_; }
  // The backend, once every member has joined (false before).
  bool nccl() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until every rank is assigned (true) or Stop() (false).
  bool WaitForMembers() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends every newer version until Stop(), a member leaves or the
  // publisher shuts down. Throws what the group throws.
  void BroadcastVersions(dist::WeightGroup& group) ABSL_LOCKS_EXCLUDED(mu_);
  // One version: its manifest, then its tensors in the group's dtype.
  void SendVersion(dist::WeightGroup& group, int64_t sequence,
                   const std::shared_ptr<const PolicySnapshot>& snapshot);
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);

  PolicyPublisher* const publisher_;
  const WeightBroadcastOptions options_;
  WeightBroadcastCounters counters_;

  mutable absl::Mutex mu_;
  std::map<std::string, int> ranks_ ABSL_GUARDED_BY(mu_);           // worker id -> rank
  std::vector<torch::Device> member_devices_ ABSL_GUARDED_BY(mu_);  // rank - 1 -> device
  bool nccl_ ABSL_GUARDED_BY(mu_) = false;  // fixed when the last member joins
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Rank 0's store, listening from Start(), and its bound tcp://HOST:PORT.
  c10::intrusive_ptr<::c10d::Store> store_ ABSL_GUARDED_BY(mu_);
  std::string store_url_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // the owner's (Start/Stop)
};

}  // namespace kappa::learner
