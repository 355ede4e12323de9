// Keeps the worker's copy of the student policy current: one thread holds a
// Learner.WatchPolicy stream, reassembles each version's chunks, loads them
// into a fresh Decoder on options.device (rollout.device) and publishes it.
// Samplers take a shared_ptr snapshot, so a version being loaded is never
// seen half-written and an old version stays alive until its last user
// drops it.
//
// Threading: Start() and Stop() may be called from any thread; Current() and
// WaitForVersion() from any number of threads. Locks: thread_mu_, then mu_.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kappa/v1/learner.grpc.pb.h"

namespace kappa::model {
class Decoder;
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
};

class PolicyWatcher {
 public:
  PolicyWatcher(std::shared_ptr<grpc::ChannelInterface> learner_channel,
                PolicyWatcherOptions options);
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

 private:
  // The watch thread: WatchOnce() until Stop(), with backoff between streams.
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads one stream until it ends; returns its final status.
  grpc::Status WatchOnce() ABSL_LOCKS_EXCLUDED(mu_);
  // Makes `policy` current; wakes WaitForVersion() callers it satisfies.
  void Publish(Policy policy) ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<kappa::v1::Learner::StubInterface> stub_;
  const PolicyWatcherOptions options_;

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

  std::atomic<int64_t> rejected_versions_{0};
  std::atomic<int64_t> published_versions_{0};
};

}  // namespace kappa::rollout
