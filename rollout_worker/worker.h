// The rollout worker's main loop: one Learner.Rollout stream at a time.
// A reader thread queues WorkItems and accumulates Credits.
//
// The loop feeds every item whose policy version has arrived to a
// model::DecodeEngine (a fixed set of slots; a group's G rows share one
// prefill) and steps it; each group that finishes is verified and scored
// on a completion thread while the engine keeps decoding the others, and
// sent as soon as it is complete (groups go out in the order they complete,
// each with the one version that sampled it). An item whose version has not
// arrived waits without holding up the engine (or, with nothing to decode,
// the loop waits for the version). EngineSession (engine_session.h) serves
// one stream that way. max_outstanding is how many items the learner leases
// the worker ahead, and so how many groups are completed at once at most.
// When the stream breaks, queued items are dropped (their leases expire at
// the learner and are handed out again) and the worker reconnects with
// backoff.
//
// Leases: the worker renews the leases it holds (queued, waiting for a
// version, decoding, verifying, scoring, waiting for credit) over the
// stream, so learner.lease_timeout_ms bounds how long a worker may be
// silent, not how long a group may take (LeaseClock).
//
// Threading: Run() is the loop thread; each stream has a reader thread, a
// lease-renewal thread and max_outstanding completion threads. Locks, in
// the order they may nest: mu_ (the worker's), then the stream's
// Connection::mu; the sampler's and the policy watcher's locks are never
// held together with either. Waits are condition waits (absl::Condition), so
// a change is seen when it happens, not at the next poll.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kappa/v1/learner.grpc.pb.h"
#include "model/decode_engine.h"
#include "rollout_worker/group_sampler.h"
#include "rollout_worker/lease_clock.h"
#include "rollout_worker/policy_watcher.h"
#include "rollout_worker/worker_metrics.h"

namespace kappa::rollout {

struct WorkerOptions {
  std::string worker_id;
  // rollout.device: the policy watcher loads every version there, and the
  // sampler samples there (its generator follows the model's device).
  c10::Device device{c10::kCPU};
  c10::ScalarType dtype = c10::kFloat;  // student.dtype, resolved for `device`
  // rollout.weights_dtype, rollout.weight_delta: how versions travel.
  WeightSyncOptions weight_sync;
  int32_t max_outstanding = 2;
  model::DecodeEngineOptions engine;  // the decode engine's slots
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // How long an item without a lease deadline waits for its policy version.
  absl::Duration max_policy_wait = absl::Seconds(120);
  GroupSamplerOptions sampler;  // worker_id and metrics are copied from above
  // Not owned; null: nothing recorded.
  WorkerMetrics* metrics = nullptr;
};

struct WorkerStats {
  int64_t groups_sent = 0;
  int64_t items_received = 0;
  int64_t items_dropped = 0;  // failed, expired, or lost with a broken stream
  int64_t connections = 0;    // Rollout streams opened (Hello sent)
  int64_t decode_batches = 0;    // groups the engine finished decoding
  int64_t group_bytes_sent = 0;  // serialized ScoredGroups written to the learner
};

class RolloutWorker {
 public:
  RolloutWorker(std::shared_ptr<grpc::ChannelInterface> learner_channel,
                std::shared_ptr<grpc::ChannelInterface> verifier_channel,
                std::shared_ptr<grpc::ChannelInterface> teacher_channel, WorkerOptions options);
  ~RolloutWorker();

  // Runs until Stop() on the calling thread: serves one Rollout stream at a
  // time and reconnects with backoff when it breaks. Returns OK after a
  // clean stop, INVALID_ARGUMENT if the learner refuses the worker's Hello
  // (its configuration is wrong). Call it once.
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Thread-safe, idempotent, does not wait for Run(): marks the worker
  // stopping, cancels the stream and the sampler's and the watcher's RPCs
  // and wakes every wait, so Run() returns promptly. Joins the watcher's
  // thread.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // A snapshot of the counters; thread-safe.
  WorkerStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const PolicyWatcher& policy_watcher() const { return watcher_; }

 private:
  struct Connection;  // one Rollout stream and its reader thread (worker.cc)

  // Serves one stream until it breaks or Stop(); returns why it ended and
  // whether the learner sent anything on it. Registers the stream as
  // connection_ while it is open.
  grpc::Status ServeStream(bool* received_any) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream's reader thread: queues work items, adds credits, records
  // lease renewals, marks the connection broken when the stream ends.
  void ReadLoop(Connection* connection) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream's renewal thread: asks the learner to renew every held lease
  // with less than half of its time left (LeaseClock), until the stream
  // ends or Stop(). A lease then expires only when this worker goes silent.
  void RenewLoop(Connection* connection) ABSL_LOCKS_EXCLUDED(mu_);
  // Serves the stream's items through an EngineSession on engine_ until
  // the stream ends or Stop(); then drops what it still holds and waits for
  // the groups being completed.
  void ServeWithEngine(Connection* connection) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for a policy at least as new as `item` asks for (until its lease
  // deadline, or max_policy_wait without one); drops the item (and returns
  // nullopt) when none arrives or the stream is abandoned.
  std::optional<Policy> WaitForPolicy(const kappa::v1::WorkItem& item,
                                      const std::function<bool()>& abandon)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Verifies and scores a sampled group (or drops the item with the error
  // sampling gave), then sends it.
  void CompleteAndSend(Connection* connection, const kappa::v1::WorkItem& item,
                       absl::StatusOr<kappa::v1::ScoredGroup> sampled, const Policy& policy,
                       const std::function<bool()>& abandon) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the stream holds credit (or breaks, or Stop()), then spends
  // one and writes the group; drops the item if that fails.
  void SendGroup(Connection* connection, const kappa::v1::WorkItem& item,
                 kappa::v1::ScoredGroup group) ABSL_LOCKS_EXCLUDED(mu_);
  void DropItem(const kappa::v1::WorkItem& item, const std::string& why, bool quiet)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool stopping() const { return stopping_.load(); }

  const WorkerOptions options_;
  std::unique_ptr<kappa::v1::Learner::StubInterface> learner_;
  PolicyWatcher watcher_;
  // The held leases' current deadlines, renewed while their items are
  // worked on (before sampler_, which reads it).
  LeaseClock leases_;
  GroupSampler sampler_;
  // Used by Run()'s thread alone (ServeWithEngine), kept across streams so
  // its slot cache is allocated once.
  model::DecodeEngine engine_;

  // Set once, by Stop(), while holding mu_ and then the open connection's
  // mu: a condition wait on either lock that reads it is woken by that
  // release. Read without a lock everywhere (the sampler's abandon callback
  // runs on other threads).
  std::atomic<bool> stopping_{false};
  mutable absl::Mutex mu_;
  // The stream ServeStream() is serving (it owns it), so Stop() can cancel
  // it; null between streams.
  Connection* connection_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Counters since construction, returned by stats().
  WorkerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kappa::rollout
