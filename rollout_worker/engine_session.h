// One Rollout stream served through the continuous decode engine: the items
// taken from the stream wait in `pending` until their policy version has
// arrived, then decode in the engine (`decoding`, by engine request id);
// each group the engine finishes is handed to a completion pool, which
// verifies, scores and sends it while the engine keeps decoding the others.
//
// Serve() runs on the worker's loop thread, which alone touches the engine,
// `pending` and `decoding`. The pool's threads run complete_and_send
// concurrently (one group each); its queue is the only state they share
// with the loop, under the pool's mutex, and they wait for work on a
// condition, never by polling.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kappa/v1/learner.pb.h"
#include "model/decode_engine.h"
#include "rollout_worker/group_sampler.h"
#include "rollout_worker/policy_watcher.h"
#include "rollout_worker/worker_metrics.h"

namespace kappa::rollout {

// A fixed set of threads running submitted tasks in submission order.
class CompletionPool {
 public:
  // Starts max(threads, 1) threads.
  explicit CompletionPool(int threads);
  // Drain()s, then joins the threads.
  ~CompletionPool();

  // Queues `task` for the next idle thread. Thread-safe.
  void Submit(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every task submitted so far has finished.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void RunTasks() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasTaskOrClosingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !tasks_.empty() || closing_;
  }
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return tasks_.empty() && running_ == 0;
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // tasks a thread is running
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// What the session needs from the worker that owns the stream.
struct EngineSessionCallbacks {
  // Moves the stream's queued items to the back of `into`, first waiting
  // for one when `wait`. Returns false (moving nothing) once the stream has
  // ended or the worker stops.
  std::function<bool(bool wait, std::deque<kappa::v1::WorkItem>* into)> take_items;
  // Waits for a policy at least as new as the item asks for; nullopt when
  // none came (the item has then been dropped).
  std::function<std::optional<Policy>(const kappa::v1::WorkItem&)> wait_for_policy;
  // Verifies, scores and sends a decoded group, or drops the item with the
  // error sampling gave. Runs on the completion pool, several at once.
  std::function<void(const kappa::v1::WorkItem&, absl::StatusOr<kappa::v1::ScoredGroup>,
                     const Policy&)>
      complete_and_send;
  // Drops an item that could not be decoded (logged as an error).
  std::function<void(const kappa::v1::WorkItem&, const std::string& why)> drop;
  // The engine finished decoding a group (before it is completed).
  std::function<void()> group_decoded;
};

class EngineSession {
 public:
  // `engine`, `sampler`, `watcher` and `metrics` (null: nothing recorded)
  // are not owned and outlive the session; the engine is used by Serve()'s
  // thread alone. `completion_threads`: groups completed at once (the
  // worker's max_outstanding: it never holds more groups than that).
  EngineSession(model::DecodeEngine* engine, GroupSampler* sampler, const PolicyWatcher* watcher,
                WorkerMetrics* metrics, int completion_threads, EngineSessionCallbacks callbacks);

  // Serves until take_items returns false: admits the items whose version
  // has arrived into the engine, in order, steps it, and hands each
  // finished group to the completion pool. Then clears the engine (what was
  // not sampled yet is lost: its leases expire at the learner and are
  // handed out again) and waits for the groups being completed. Returns the
  // number of items lost that way. Call once.
  int64_t Serve();

 private:
  // Moves the items whose policy version has arrived from pending_ into the
  // engine, in order; waits for a version only while the engine is idle.
  void AdmitPending();
  // One engine step; its finished groups go to the completion pool. A
  // failed step drops every item in the engine.
  void StepEngine();

  model::DecodeEngine* const engine_;
  GroupSampler* const sampler_;
  const PolicyWatcher* const watcher_;
  WorkerMetrics* const metrics_;
  const EngineSessionCallbacks callbacks_;

  struct Decoding {
    kappa::v1::WorkItem item;
    Policy policy;
  };
  std::deque<kappa::v1::WorkItem> pending_;  // taken from the stream, not yet in the engine
  std::map<uint64_t, Decoding> decoding_;    // in the engine, by request id
  uint64_t next_id_ = 0;
  CompletionPool completions_;  // last: joined before the rest is destroyed
};

}  // namespace kappa::rollout
