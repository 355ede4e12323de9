// The decisions of continuous batching, without tensors: which waiting
// requests join the decode, which of their rows go to which slot. The
// decode engine (model/decode_engine.h) executes what this decides
// (prefill, copy the prompt's keys/values, sample), in the manner of
// nano-vllm's schedule → run → postprocess; the slot bookkeeping follows
// llama.cpp's llama-kv-cells.h (a set of cells that are either free or
// used, acquired and released with checked preconditions).
//
// Neither class is thread-safe: one thread drives them (the engine's).
// Broken preconditions (REQUIRES:) throw std::logic_error: they are bugs in
// the caller, never bad input.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <vector>

namespace kappa::model {

// A fixed set of slots [0, size), each free or used. Every operation is
// O(log size); nothing scans the table.
class SlotTable {
 public:
  // REQUIRES: size >= 1.
  explicit SlotTable(int64_t size);

  int64_t size() const { return size_; }
  int64_t used() const { return size_ - free(); }
  int64_t free() const { return static_cast<int64_t>(free_.size()); }
  // REQUIRES: 0 <= slot < size.
  bool IsUsed(int64_t slot) const;
  // The lowest free slot. REQUIRES: free() > 0.
  int64_t LowestFree() const;
  // One past the highest used slot; 0 when none is used.
  int64_t UsedEnd() const { return used_.empty() ? 0 : *used_.rbegin() + 1; }

  // Marks `slot` used. REQUIRES: 0 <= slot < size and the slot is free.
  void Acquire(int64_t slot);
  // Marks `slot` free. REQUIRES: 0 <= slot < size and the slot is used.
  void Release(int64_t slot);
  // Frees every slot.
  void ReleaseAll();

 private:
  void CheckInRange(int64_t slot, const char* what) const;

  int64_t size_;
  std::set<int64_t> free_;  // lowest first
  std::set<int64_t> used_;
};

// A model, for the version rule: requests whose keys compare equal share
// steps. Opaque (the engine passes the Decoder's address); never
// dereferenced.
using ModelKey = const void*;

// One row of a request given a slot.
struct RowPlacement {
  int64_t slot = 0;
  int64_t request = 0;  // the id Enqueue() was given
  int64_t row = 0;      // in [0, rows)
  bool operator==(const RowPlacement& other) const {
    return slot == other.slot && request == other.request && row == other.row;
  }
};

// What one Schedule() decided, in the order to execute it.
struct AdmissionPlan {
  // Requests to prefill now (oldest first); each leaves the waiting queue.
  std::vector<int64_t> prefill;
  // Rows given a slot now: the rows the partly placed request had left
  // first (already prefilled), then those of `prefill` in order, each
  // request's rows in row order, each in the lowest free slot.
  std::vector<RowPlacement> placements;
  bool empty() const { return prefill.empty() && placements.empty(); }
};

struct SlotSchedulerOptions {
  int64_t slots = 16;  // >= 1
  // Prompt tokens one Schedule() prefills at most; a request whose prompt
  // alone exceeds it is prefilled by itself. 0: no cap.
  int64_t max_prefill_tokens = 0;
};

// Admission rules, in order:
//  1. The rows a partly placed request has left take the next free slots
//     before any waiting request.
//  2. Waiting requests join oldest first while the rows to place are fewer
//     than the free slots; the last one taken may get only some of its rows
//     a slot (it becomes the partly placed request).
//  3. Version rule: rows of different models never share a step. A request
//     of another model than the one in use joins only once every row of the
//     current one has finished (no used slot, no partly placed request, and
//     nothing taken earlier in the same Schedule()).
//  4. Prefill cap: a request joins a Schedule() that already took one only
//     while the prompt tokens taken stay within max_prefill_tokens.
class SlotScheduler {
 public:
  // REQUIRES: options.slots >= 1, options.max_prefill_tokens >= 0.
  explicit SlotScheduler(SlotSchedulerOptions options);

  // Queues request `id` (the caller's, echoed in the plans) behind the
  // others. REQUIRES: 1 <= rows <= slots, prompt_tokens >= 1.
  void Enqueue(int64_t id, ModelKey model, int64_t rows, int64_t prompt_tokens);

  // Decides the next admission and records it: the planned requests leave
  // the queue, the planned slots become used. An empty plan when nothing
  // can join (no free slot, an empty queue, or the version rule).
  AdmissionPlan Schedule();

  // The row in `slot` finished: its slot is free for the next Schedule().
  // REQUIRES: the slot is used.
  void Finish(int64_t slot);

  // Forgets every queued and admitted request; every slot is free.
  void Clear();

  // Nothing queued, nothing in a slot, no row waiting for one.
  bool Idle() const { return waiting_.empty() && table_.used() == 0 && !partial_; }
  int64_t waiting_requests() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t active_rows() const { return table_.used(); }
  // The model of the rows admitted last (null before the first admission).
  ModelKey model_in_use() const { return model_in_use_; }
  const SlotTable& table() const { return table_; }

 private:
  struct Waiting {
    int64_t id = 0;
    ModelKey model = nullptr;
    int64_t rows = 0;
    int64_t prompt_tokens = 0;
  };
  struct Partial {
    int64_t id = 0;
    int64_t rows = 0;
    int64_t placed = 0;  // rows 0 .. placed-1 have had a slot
  };

  // Rule 2–4: the waiting requests this Schedule() prefills, given the rows
  // already due (the partial request's) and the free slots.
  std::vector<Waiting> TakeWaiting(int64_t rows_due);
  // Gives rows [placed, rows) of request `id` the lowest free slots while
  // any is free; returns the rows placed in all.
  int64_t PlaceRows(int64_t id, int64_t rows, int64_t placed, AdmissionPlan* plan);

  const SlotSchedulerOptions options_;
  SlotTable table_;
  std::deque<Waiting> waiting_;
  std::optional<Partial> partial_;
  ModelKey model_in_use_ = nullptr;
};

}  // namespace kappa::model
