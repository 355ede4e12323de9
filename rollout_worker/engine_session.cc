#include "rollout_worker/engine_session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "base/status.h"

namespace kappa::rollout {

CompletionPool::CompletionPool(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { RunTasks(); });
}

CompletionPool::~CompletionPool() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;  // the threads finish the queue, then return
  }
  for (std::thread& thread : threads_) thread.join();
}

void CompletionPool::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void CompletionPool::Drain() {
  absl::MutexLock lock(&mu_, absl::Condition(this, &CompletionPool::IdleLocked));
}

void CompletionPool::RunTasks() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_, absl::Condition(this, &CompletionPool::HasTaskOrClosingLocked));
      if (tasks_.empty()) return;  // closing, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
    }
    task();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

EngineSession::EngineSession(model::DecodeEngine* engine, GroupSampler* sampler,
                             const PolicyWatcher* watcher, WorkerMetrics* metrics,
                             int completion_threads, EngineSessionCallbacks callbacks)
    : engine_(engine),
      sampler_(sampler),
      watcher_(watcher),
      metrics_(metrics),
      callbacks_(std::move(callbacks)),
      completions_(completion_threads) {}

int64_t EngineSession::Serve() {
  // Wait for work only when there is nothing to decode.
  while (callbacks_.take_items(engine_->Idle() && pending_.empty(), &pending_)) {
    AdmitPending();
    if (!engine_->Idle()) StepEngine();
  }
  const auto lost = static_cast<int64_t>(decoding_.size() + pending_.size());
  decoding_.clear();
  pending_.clear();
  engine_->Clear();
  completions_.Drain();  // groups being completed see the stream's end and stop
  return lost;
}

void EngineSession::AdmitPending() {
  while (!pending_.empty()) {
    Policy policy = watcher_->Current();
    if (policy.version < pending_.front().policy_version()) {
      if (!engine_->Idle()) return;  // keep decoding; look again next step
      std::optional<Policy> waited = callbacks_.wait_for_policy(pending_.front());
      if (!waited) {
        pending_.pop_front();
        continue;
      }
      policy = *std::move(waited);
    }
    kappa::v1::WorkItem item = std::move(pending_.front());
    pending_.pop_front();
    absl::StatusOr<model::DecodeRequest> request = sampler_->EngineRequest(item, policy, next_id_);
    absl::Status added = request.status();
    if (added.ok()) {
      added = base::CaptureExceptions("engine", [&] { engine_->Add(*std::move(request)); });
    }
    if (!added.ok()) {
      callbacks_.drop(item, std::string(added.ToString()));
      continue;
    }
    decoding_.emplace(next_id_++, Decoding{std::move(item), std::move(policy)});
  }
}

void EngineSession::StepEngine() {
  std::vector<model::DecodeResult> finished;
  const int64_t before = engine_->stats().busy_row_steps;
  const absl::Status stepped =
      base::CaptureExceptions("decode failed", [&] { finished = engine_->Step(); });
  if (!stepped.ok()) {
    // Nothing of this engine's state can be trusted: drop every item in it.
    for (auto& [id, entry] : decoding_)
      callbacks_.drop(entry.item, std::string(stepped.ToString()));
    decoding_.clear();
    engine_->Clear();
    return;
  }
  if (metrics_ != nullptr) {
    metrics_->RecordEngineStep(engine_->stats().busy_row_steps - before,
                               engine_->stats().kv_cache_bytes);
  }
  for (model::DecodeResult& result : finished) {
    auto entry = decoding_.extract(result.id);
    Decoding& done = entry.mapped();
    absl::StatusOr<kappa::v1::ScoredGroup> group = sampler_->GroupFromEngine(
        done.item, done.policy.version, std::move(result.samples), result.seconds);
    callbacks_.group_decoded();
    completions_.Submit([this, item = std::move(done.item), policy = std::move(done.policy),
                         group = std::move(group)]() mutable {
      callbacks_.complete_and_send(item, std::move(group), policy);
    });
  }
}

}  // namespace kappa::rollout
