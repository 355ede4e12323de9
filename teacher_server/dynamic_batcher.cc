#include "teacher_server/dynamic_batcher.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kappa::teacher {
namespace {

// How often a waiting Submit asks whether its caller is still there.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);

}  // namespace

absl::StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    const DynamicBatcherOptions& options, BatchFn batch_fn) {
  if (options.max_batch_sequences <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_sequences: must be > 0, got ", options.max_batch_sequences));
  }
  if (options.max_queued_sequences <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_sequences: must be > 0, got ", options.max_queued_sequences));
  }
  if (options.max_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_wait: must be >= 0, got ", absl::FormatDuration(options.max_wait)));
  }
  if (!batch_fn) return absl::InvalidArgumentError("batch_fn: empty");
  return std::unique_ptr<DynamicBatcher>(new DynamicBatcher(options, std::move(batch_fn)));
}

DynamicBatcher::DynamicBatcher(const DynamicBatcherOptions& options, BatchFn batch_fn)
    : options_(options), batch_fn_(std::move(batch_fn)) {
  thread_ = std::thread([this] { BatchLoop(); });
}

DynamicBatcher::~DynamicBatcher() { Shutdown(); }

absl::Status DynamicBatcher::Submit(std::shared_ptr<BatchUnit> unit, absl::Time deadline,
                                    const std::function<bool()>& cancelled) {
  if (unit == nullptr) return absl::InvalidArgumentError("unit: null");
  const int64_t n = unit->num_sequences();
  if (n <= 0) return absl::InvalidArgumentError("unit: no sequences");
  if (n > options_.max_batch_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("unit: ", n, " sequences exceed max_batch_sequences ",
                                                   options_.max_batch_sequences));
  }

  auto pending = std::make_shared<Pending>();
  pending->unit = std::move(unit);
  pending->num_sequences = n;

  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("teacher batcher is shut down");
  if (queued_sequences_ + n > options_.max_queued_sequences) {
    ++stats_.rejected_full;
    return absl::ResourceExhaustedError(
        absl::StrCat("teacher queue full: ", queued_sequences_, " sequences queued, limit ",
                     options_.max_queued_sequences, "; retry later"));
  }
  pending->enqueued = absl::Now();
  queue_.push_back(pending);
  queued_sequences_ += n;
  work_cv_.Signal();

  while (!pending->done) {
    if (cancelled && cancelled()) {
      ++stats_.cancelled;
      const bool was_queued = Withdraw(pending.get());
      return absl::CancelledError(was_queued
                                      ? "the caller cancelled while queued for a teacher batch"
                                      : "the caller cancelled while the teacher batch was running");
    }
    // WaitWithDeadline returns true on timeout; re-check `done` since the
    // batch may have completed at the same moment.
    const absl::Time wake = cancelled ? std::min(deadline, absl::Now() + kCancelPoll) : deadline;
    if (pending->done_cv.WaitWithDeadline(&mu_, wake) && !pending->done &&
        absl::Now() >= deadline) {
      ++stats_.deadline_exceeded;
      const bool was_queued = Withdraw(pending.get());
      return absl::DeadlineExceededError(
          was_queued ? "deadline passed while queued for a teacher batch"
                     : "deadline passed while the teacher batch was running");
    }
  }
  return pending->status;
}

void DynamicBatcher::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!shutdown_) {
      shutdown_ = true;
      for (const auto& pending : queue_) {
        Complete(pending.get(), absl::UnavailableError("teacher batcher shut down"));
      }
      queue_.clear();
      queued_sequences_ = 0;
      work_cv_.SignalAll();
    }
  }
  std::call_once(join_once_, [this] {
    if (thread_.joinable()) thread_.join();
  });
}

DynamicBatcherStats DynamicBatcher::stats() const {
  absl::MutexLock lock(&mu_);
  DynamicBatcherStats stats = stats_;
  stats.queued_sequences = queued_sequences_;
  return stats;
}

void DynamicBatcher::BatchLoop() {
  std::vector<std::shared_ptr<Pending>> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (!AwaitBatchReady()) return;
      TakeBatch(&batch);
    }

    absl::Status status = RunBatch(batch);

    absl::MutexLock lock(&mu_);
    ++stats_.batches;
    int64_t sequences = 0;
    for (const auto& pending : batch) {
      sequences += pending->num_sequences;
      Complete(pending.get(), status);
    }
    stats_.units += static_cast<int64_t>(batch.size());
    stats_.sequences += sequences;
    stats_.largest_batch = std::max(stats_.largest_batch, sequences);
    batch.clear();
  }
}

bool DynamicBatcher::AwaitBatchReady() {
  while (true) {
    if (shutdown_) return false;
    if (queue_.empty()) {
      work_cv_.Wait(&mu_);
      continue;
    }
    if (queued_sequences_ >= options_.max_batch_sequences) return true;
    // The front may change while we wait (a caller withdrew), so the deadline
    // is recomputed on every wake-up.
    const absl::Time ready_at = queue_.front()->enqueued + options_.max_wait;
    if (absl::Now() >= ready_at) return true;
    work_cv_.WaitWithDeadline(&mu_, ready_at);
  }
}

void DynamicBatcher::TakeBatch(std::vector<std::shared_ptr<Pending>>* batch) {
  int64_t sequences = 0;
  // Strict FIFO: stop at the first unit that does not fit rather than skipping
  // ahead, so a large unit cannot be starved by a stream of small ones.
  while (!queue_.empty() &&
         sequences + queue_.front()->num_sequences <= options_.max_batch_sequences) {
    sequences += queue_.front()->num_sequences;
    batch->push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  queued_sequences_ -= sequences;
}

absl::Status DynamicBatcher::RunBatch(const std::vector<std::shared_ptr<Pending>>& batch) {
  std::vector<BatchUnit*> units;
  units.reserve(batch.size());
  for (const auto& pending : batch) units.push_back(pending->unit.get());
  // The batching thread must outlive any bad batch: an escaped exception here
  // would terminate the server.
  absl::Status status;
  absl::Status thrown;
  try {
    thrown = base::CaptureExceptions("teacher batch failed", [&] { status = batch_fn_(units); });
  } catch (...) {  // last resort: not a std::exception, and this thread must not die
    return absl::InternalError("teacher batch failed: unknown exception");
  }
  // INTERNAL whatever was thrown: the batch is shared, so no one caller's
  // input is to blame.
  if (!thrown.ok()) return absl::InternalError(thrown.message());
  return status;
}

void DynamicBatcher::Complete(Pending* pending, absl::Status status) {
  pending->status = std::move(status);
  pending->done = true;
  pending->done_cv.Signal();
}

bool DynamicBatcher::Withdraw(const Pending* pending) {
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [pending](const auto& p) { return p.get() == pending; });
  if (it == queue_.end()) return false;
  queued_sequences_ -= (*it)->num_sequences;
  queue_.erase(it);
  return true;
}

}  // namespace kappa::teacher
