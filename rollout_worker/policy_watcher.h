// Keeps the worker's copy of the student policy current: one thread holds a
// Learner.WatchPolicy stream, reassembles each version's chunks, loads them
// into a fresh Decoder on options.device (rollout.device) and publishes it.
// Samplers take a shared_ptr snapshot, so a version being loaded is never
// seen half-written and an old version stays alive until its last user
// drops it.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
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

  void Start();
  // Cancels the stream, wakes every waiter, joins the thread. Idempotent.
  void Stop();

  Policy Current() const;
  // The newest policy once its version is >= min_version. DEADLINE_EXCEEDED
  // at `deadline`, CANCELLED once stopped.
  absl::StatusOr<Policy> WaitForVersion(int64_t min_version, absl::Time deadline) const;

  // Versions rejected as corrupt or unloadable (each also logged as an error).
  int64_t rejected_versions() const { return rejected_versions_.load(); }
  int64_t published_versions() const { return published_versions_.load(); }

 private:
  void Loop();
  // Reads one stream until it ends; returns its final status.
  grpc::Status WatchOnce();
  void Publish(Policy policy);

  std::unique_ptr<kappa::v1::Learner::StubInterface> stub_;
  const PolicyWatcherOptions options_;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  Policy current_;
  bool stopping_ = false;
  grpc::ClientContext* active_context_ = nullptr;  // guarded by mu_, for TryCancel

  std::atomic<int64_t> rejected_versions_{0};
  std::atomic<int64_t> published_versions_{0};
  std::mutex thread_mu_;  // serializes starting and joining thread_
  std::thread thread_;
};

}  // namespace kappa::rollout
