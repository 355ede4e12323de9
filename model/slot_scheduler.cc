#include "model/slot_scheduler.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace kappa::model {
namespace {

void Require(bool holds, const std::string& what) {
  if (!holds) throw std::logic_error(what);
}

}  // namespace

SlotTable::SlotTable(int64_t size) : size_(size) {
  Require(size >= 1, "SlotTable: size must be >= 1, got " + std::to_string(size));
  for (int64_t slot = 0; slot < size; ++slot) free_.insert(free_.end(), slot);
}

void SlotTable::CheckInRange(int64_t slot, const char* what) const {
  Require(slot >= 0 && slot < size_, std::string("SlotTable::") + what + ": slot " +
                                         std::to_string(slot) + " outside [0, " +
                                         std::to_string(size_) + ")");
}

bool SlotTable::IsUsed(int64_t slot) const {
  CheckInRange(slot, "IsUsed");
  return used_.count(slot) > 0;
}

int64_t SlotTable::LowestFree() const {
  Require(!free_.empty(), "SlotTable::LowestFree: every slot is used");
  return *free_.begin();
}

void SlotTable::Acquire(int64_t slot) {
  CheckInRange(slot, "Acquire");
  Require(free_.erase(slot) == 1,
          "SlotTable::Acquire: slot " + std::to_string(slot) + " is already used");
  used_.insert(slot);
}

void SlotTable::Release(int64_t slot) {
  CheckInRange(slot, "Release");
  Require(used_.erase(slot) == 1,
          "SlotTable::Release: slot " + std::to_string(slot) + " is not used");
  free_.insert(slot);
}

void SlotTable::ReleaseAll() {
  free_.insert(used_.begin(), used_.end());
  used_.clear();
}

SlotScheduler::SlotScheduler(SlotSchedulerOptions options)
    : options_(options), table_(options.slots) {
  Require(options.max_prefill_tokens >= 0, "SlotScheduler: max_prefill_tokens must be >= 0, got " +
                                               std::to_string(options.max_prefill_tokens));
}

void SlotScheduler::Enqueue(int64_t id, ModelKey model, int64_t rows, int64_t prompt_tokens) {
  Require(rows >= 1 && rows <= options_.slots,
          "SlotScheduler::Enqueue: request " + std::to_string(id) + " has " + std::to_string(rows) +
              " rows, outside [1, " + std::to_string(options_.slots) + "]");
  Require(prompt_tokens >= 1,
          "SlotScheduler::Enqueue: request " + std::to_string(id) + " has an empty prompt");
  waiting_.push_back(Waiting{id, model, rows, prompt_tokens});
}

AdmissionPlan SlotScheduler::Schedule() {
  AdmissionPlan plan;
  const int64_t rows_due = partial_ ? partial_->rows - partial_->placed : 0;
  const std::vector<Waiting> taken = TakeWaiting(rows_due);
  if (!taken.empty()) model_in_use_ = taken.front().model;
  for (const Waiting& request : taken) plan.prefill.push_back(request.id);

  if (partial_) {
    const Partial partial = *partial_;
    partial_.reset();
    const int64_t placed = PlaceRows(partial.id, partial.rows, partial.placed, &plan);
    if (placed < partial.rows) partial_ = Partial{partial.id, partial.rows, placed};
  }
  for (const Waiting& request : taken) {
    const int64_t placed = PlaceRows(request.id, request.rows, 0, &plan);
    if (placed < request.rows) partial_ = Partial{request.id, request.rows, placed};
  }
  return plan;
}

std::vector<SlotScheduler::Waiting> SlotScheduler::TakeWaiting(int64_t rows_due) {
  std::vector<Waiting> taken;
  int64_t prefill_tokens = 0;
  while (!waiting_.empty() && rows_due < table_.free()) {
    const Waiting& next = waiting_.front();
    const bool busy = table_.used() > 0 || partial_.has_value() || !taken.empty();
    const ModelKey in_use = taken.empty() ? model_in_use_ : taken.front().model;
    if (busy && next.model != in_use) break;
    const bool capped = options_.max_prefill_tokens > 0 && !taken.empty() &&
                        prefill_tokens + next.prompt_tokens > options_.max_prefill_tokens;
    if (capped) break;
    prefill_tokens += next.prompt_tokens;
    rows_due += next.rows;
    taken.push_back(next);
    waiting_.pop_front();
  }
  return taken;
}

int64_t SlotScheduler::PlaceRows(int64_t id, int64_t rows, int64_t placed, AdmissionPlan* plan) {
  while (placed < rows && table_.free() > 0) {
    const int64_t slot = table_.LowestFree();
    table_.Acquire(slot);
    plan->placements.push_back(RowPlacement{slot, id, placed++});
  }
  return placed;
}

void SlotScheduler::Finish(int64_t slot) { table_.Release(slot); }

void SlotScheduler::Clear() {
  waiting_.clear();
  partial_.reset();
  table_.ReleaseAll();
}

}  // namespace kappa::model
