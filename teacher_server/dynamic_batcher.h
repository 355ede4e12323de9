// Dynamic batching for the teacher: many callers (gRPC handler threads) each
// submit a unit of work (a set of sequences) and block; one batching thread
// gathers pending units until the batch is full or the oldest unit has waited
// `max_wait`, runs them together in ONE call of the batch function (one padded
// forward), and wakes every caller.
//
// The batcher knows nothing about models: a unit is any BatchUnit subclass,
// and the batch function writes each unit's result into the unit itself.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kappa::teacher {

// One caller's work. Subclasses add the inputs and a place for the outputs.
class BatchUnit {
 public:
  virtual ~BatchUnit() = default;
  // Sequences this unit adds to a batch; must be > 0 and constant.
  virtual int64_t num_sequences() const = 0;
};

struct DynamicBatcherOptions {
  // A batch holds at most this many sequences (summed over its units).
  int64_t max_batch_sequences = 64;
  // How long the oldest pending unit may wait for company before its batch
  // runs anyway. Zero: run whatever is pending as soon as the thread is free.
  absl::Duration max_wait = absl::Milliseconds(5);
  // Bound on sequences waiting in the queue (not counting the batch that is
  // running); a submit beyond it is refused with RESOURCE_EXHAUSTED, so memory
  // stays bounded however many clients connect.
  int64_t max_queued_sequences = 4096;
};

struct DynamicBatcherStats {
  int64_t batches = 0;              // batch function calls
  int64_t units = 0;                // units that were run
  int64_t sequences = 0;            // sequences that were run
  int64_t largest_batch = 0;        // most sequences in one batch
  int64_t rejected_full = 0;        // RESOURCE_EXHAUSTED refusals
  int64_t deadline_exceeded = 0;    // callers that gave up waiting
  int64_t cancelled = 0;            // callers that went away while waiting
  int64_t queued_sequences = 0;     // waiting now (a gauge, not a counter)
};

class DynamicBatcher {
 public:
  // Runs one batch. `units` are in submission order and hold together at most
  // max_batch_sequences sequences. Writes each unit's result into the unit and
  // returns OK, or returns an error that every unit of the batch receives.
  // Exceptions are caught and become INTERNAL. Called only from the batching
  // thread, never with the batcher's mutex held.
  using BatchFn = std::function<absl::Status(const std::vector<BatchUnit*>& units)>;

  // INVALID_ARGUMENT for non-positive sizes or a negative max_wait.
  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const DynamicBatcherOptions& options, BatchFn batch_fn);

  // Shuts down (see Shutdown) and joins the batching thread.
  ~DynamicBatcher();

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues `unit` and blocks until its batch has run or `deadline` passes.
  // Returns the batch function's status, or:
  //   INVALID_ARGUMENT    unit is null, has no sequences, or more than
  //                       max_batch_sequences (callers split large requests);
  //   RESOURCE_EXHAUSTED  the queue is full;
  //   UNAVAILABLE         the batcher is (or went) shut down before the unit ran;
  //   DEADLINE_EXCEEDED   `deadline` passed first. A unit still queued is
  //                       withdrawn; one already running finishes in the
  //                       background (hence the shared_ptr) and its result is
  //                       dropped.
  //   CANCELLED           `cancelled` (polled every 20 ms while waiting; may
  //                       be empty) returned true first: the caller went
  //                       away. Withdrawn as for a deadline.
  // Only on OK may the caller read the unit's result.
  absl::Status Submit(std::shared_ptr<BatchUnit> unit, absl::Time deadline,
                      const std::function<bool()>& cancelled = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Refuses new units and fails every queued unit with UNAVAILABLE; a batch
  // already running completes normally. Idempotent; returns once the batching
  // thread has exited.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  DynamicBatcherStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const DynamicBatcherOptions& options() const { return options_; }

 private:
  // A queued unit and how it ended. `done` and `status` are written by the
  // batching thread (or by Shutdown) under mu_ and read by the caller under mu_.
  struct Pending {
    std::shared_ptr<BatchUnit> unit;
    int64_t num_sequences = 0;
    absl::Time enqueued;
    bool done = false;
    absl::Status status;
    absl::CondVar done_cv;  // Signalled once, when `done` becomes true.
  };

  DynamicBatcher(const DynamicBatcherOptions& options, BatchFn batch_fn);

  void BatchLoop() ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until a batch should run: the queue holds max_batch_sequences, or
  // the front unit has waited max_wait. Returns false on shutdown.
  bool AwaitBatchReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Moves the longest FIFO prefix of the queue that fits one batch into
  // `batch` (at least one unit; the queue must be non-empty).
  void TakeBatch(std::vector<std::shared_ptr<Pending>>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Runs the batch function, turning exceptions into INTERNAL.
  absl::Status RunBatch(const std::vector<std::shared_ptr<Pending>>& batch)
      ABSL_LOCKS_EXCLUDED(mu_);

  void Complete(Pending* pending, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Removes `pending` from the queue if it is still there; true if removed.
  bool Withdraw(const Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DynamicBatcherOptions options_;
  const BatchFn batch_fn_;

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Pending>> queue_ ABSL_GUARDED_BY(mu_);
  // Sum of num_sequences over queue_.
  int64_t queued_sequences_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  DynamicBatcherStats stats_ ABSL_GUARDED_BY(mu_);
  // Signalled when a unit is queued or shutdown begins; the batching thread
  // waits on it (with the front unit's max_wait deadline).
  absl::CondVar work_cv_;

  std::thread thread_;
  std::once_flag join_once_;  // Shutdown may race with the destructor.
};

}  // namespace kappa::teacher
