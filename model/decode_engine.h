// A continuous-batching decode engine: a fixed number of slots, each holding
// one response being sampled. A row leaves its slot the step it stops (a
// stop id, its request's stop check such as a stop string, or its budget)
// and the oldest waiting request takes free slots at the next step, so no
// row waits for the longest one of a batch. model::Sample is this engine.
//
// Memory: the keys/values live in one SlotKVCache of `max_rows` slots ×
// `max_sequence_tokens` columns, allocated once (or, with
// max_sequence_tokens = 0, grown to the longest sequence admitted, up to the
// model's max_position_embeddings, and never shrunk), plus the prompt
// keys/values of at most one request whose G rows did not all find a free
// slot at once (its remaining rows take the next free slots, before any
// other request). How many requests queue does not change it: a waiting
// request holds only its prompt.
//
// Shared prefill: the G samples of a request are one prefill of its prompt,
// whose keys/values are copied into G slots; each of the G rows then draws
// from its own stream (RowSeed(seed, g), or its row_seeds entry), so a row's
// tokens do not depend on the rows it shares steps with. model::Sample is
// this engine driven until idle.
//
// Scheduling: a SlotScheduler (model/slot_scheduler.h) decides which
// waiting requests join and which row goes to which slot; the engine
// executes its plan (prefill, copy the prompt's keys/values into the
// slots, sample, record).
//
// Versions: every request names the model that samples it. Rows of
// different models never share a step: the engine admits a request of
// another model only once every row of the current one has finished, so a
// sequence is sampled with one whole version.
//
// Not thread-safe: one thread drives Add() and Step(). Errors throw
// std::invalid_argument (bad requests, at Add()) as model:: does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "model/sampling.h"
#include "model/slot_scheduler.h"
#include "model/token_sampler.h"
#include "model/transformer.h"

namespace kappa::model {

struct DecodeEngineOptions {
  int64_t max_rows = 16;  // slots: rows decoded per step, >= 1
  // Columns of each slot (prompt + response tokens, the last sampled token
  // excluded); 0: grown on demand up to max_position_embeddings.
  int64_t max_sequence_tokens = 0;
};

struct DecodeRequest {
  uint64_t id = 0;  // the caller's, echoed in the result
  std::shared_ptr<Decoder> model;
  std::vector<int64_t> prompt;
  int64_t num_samples = 1;  // G rows sharing the prompt's prefill, <= max_rows
  int64_t max_new_tokens = 16;
  TokenSampling sampling;  // sampleable_vocab_size 0: every row of the model
  std::vector<int64_t> stop_token_ids;
  uint64_t seed = 0;  // row g draws from RowRandom(RowSeed(seed, g))...
  // ... unless given here: then row g draws from RowRandom(row_seeds[g]).
  // Empty or num_samples of them.
  std::vector<uint64_t> row_seeds;
  // Optional. Called with a row's response so far after each token it
  // samples that is neither a stop id nor the last of its budget; true ends
  // the row there as stopped (not truncated), freeing its slot. Runs on the
  // Step() thread; must not throw. The worker's stop strings use it
  // (rollout::StopStringCheck).
  std::function<bool(const std::vector<int64_t>& response)> stops_after;
};

struct DecodeResult {
  uint64_t id = 0;
  std::shared_ptr<Decoder> model;        // the one model every row sampled with
  std::vector<SampledSequence> samples;  // num_samples of them, in row order
  double seconds = 0;                    // from admission to its last row's stop
};

struct DecodeEngineStats {
  int64_t steps = 0;            // Step() calls that decoded or prefilled
  int64_t tokens = 0;           // sampled tokens
  int64_t prefills = 0;         // requests prefilled (one per request, not per row)
  int64_t row_steps = 0;        // Σ over decode steps of the slots decoded
  int64_t busy_row_steps = 0;   // ... of which held a row
  int64_t kv_columns_read = 0;  // Σ over decode steps and rows of the cached columns attended
  int64_t peak_active_rows = 0;
  int64_t kv_cache_bytes = 0;  // the slot cache's size now
  int64_t kv_cache_allocations = 0;
};

class DecodeEngine {
 public:
  explicit DecodeEngine(DecodeEngineOptions options);
  ~DecodeEngine();

  // Queues a request behind the others. Throws std::invalid_argument (and
  // queues nothing) for a null model, an empty prompt, ids outside the
  // vocabulary, bad sampling settings, num_samples outside [1, max_rows],
  // max_new_tokens < 1, row_seeds neither empty nor num_samples long, or a
  // sequence that cannot fit (prompt +
  // max_new_tokens − 1 columns, cut to the position table) in
  // max_sequence_tokens. The budget of each row is max_new_tokens, cut to
  // what max_position_embeddings leaves after the prompt (a row with no
  // room returns at once, truncated and empty).
  void Add(DecodeRequest request);

  // One step: samples the next token of every row in a slot, frees the
  // slots of rows that stopped, then fills free slots with waiting rows
  // (oldest request first, while its model is the one in use or none is;
  // a request is prefilled once, when its first row gets a slot) and
  // samples their first tokens. Returns
  // the requests whose every row has finished, in the order they finished.
  // Does nothing when Idle(). Blocks for the model's forwards.
  std::vector<DecodeResult> Step();

  // Nothing queued, nothing in a slot, no row of a partly placed request
  // waiting for one.
  bool Idle() const { return scheduler_.Idle(); }
  int64_t active_rows() const { return scheduler_.active_rows(); }
  int64_t waiting_requests() const { return scheduler_.waiting_requests(); }
  const DecodeEngineStats& stats() const { return stats_; }

  // Drops every waiting and active request (their results are lost); keeps
  // the slot cache.
  void Clear();

 private:
  struct Request;  // a request and its rows' progress
  struct Slot {
    int64_t request = -1;  // key into requests_, -1: free
    int64_t row = 0;       // its row within the request
    int64_t cached = 0;    // tokens whose keys/values the slot holds
  };

  // Samples one token for every occupied slot; retires rows that stopped.
  void DecodeActiveRows(std::vector<DecodeResult>* finished);
  // Executes the scheduler's next plan: prefills the requests it admits,
  // copies their prompts into the slots it gives their rows, and samples
  // those rows' first tokens.
  void Admit(std::vector<DecodeResult>* finished);
  // Prefills the requests `ids` (keys into requests_) in one batch; each
  // keeps its prompt's keys/values and next-token logits.
  void Prefill(const std::vector<int64_t>& ids);
  // Slot columns the rows in slots and the requests `ids` need.
  int64_t ColumnsNeeded(const std::vector<int64_t>& ids) const;
  // Copies `request`'s prompt keys/values into columns [0, prompt) of `slots`.
  void CopyPromptIntoSlots(const Request& request, const std::vector<int64_t>& slots);
  // Records each given row's sampled token, ends rows that stopped, and
  // moves requests whose every row ended to `finished`.
  void RecordTokens(const std::vector<int64_t>& slots, const SampledTokens& sampled,
                    std::vector<DecodeResult>* finished);
  // Makes the slot cache fit `model` and `columns` per slot (reallocating
  // only for another dtype, device, shape or more columns); the rows in
  // slots keep their keys/values when `carry_rows`.
  void EnsureCache(Decoder& model, int64_t columns, bool carry_rows);

  const DecodeEngineOptions options_;
  SlotScheduler scheduler_;
  // Queued and admitted requests by the engine's key (the scheduler's
  // request id); a request leaves when its last row finishes.
  std::map<int64_t, std::unique_ptr<Request>> requests_;
  int64_t next_key_ = 0;
  std::vector<Slot> slots_;         // the engine's data of each slot
  std::shared_ptr<Decoder> model_;  // the model of the rows in slots
  SlotKVCache cache_;
  DecodeEngineStats stats_;
};

}  // namespace kappa::model
