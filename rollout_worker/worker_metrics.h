// The rollout worker's Prometheus metrics (docs/metrics.md): what it
// produced (samples, tokens, groups), how long a group took, and which peer
// failed it. One worker per process, so no worker label: Prometheus's
// `instance` tells workers apart.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "services/metrics.h"

namespace kappa::rollout {

class WorkerMetrics {
 public:
  explicit WorkerMetrics(services::metrics::Registry& registry);

  // A Rollout stream to the learner opened (Hello sent).
  void RecordConnection();
  // One group handed to the learner.
  void RecordGroupSent(int64_t samples, int64_t tokens, double generation_seconds);
  // The seconds one group spent in `stage`: "decode" (in the engine, from
  // admission to its last row's stop), "verify", "teacher_score" or
  // "demonstrations" (the teacher's greedy answers for a group that
  // failed). The split of kappa_worker_generation_seconds.
  void RecordStageSeconds(absl::string_view stage, double seconds);
  // A work item given up (failed, expired, or lost with a broken stream).
  void RecordItemsDropped(int64_t items);
  // A failed RPC to `peer`: "learner", "teacher" or "verifier". Each failed
  // attempt counts, retried or not.
  void RecordRpcError(absl::string_view peer);
  // Serialized bytes of one message the worker sent or received: `message`
  // is "score" (ScoreRequest/ScoreResponse), "verify" (VerifyRequest/
  // VerifyResponse) or "group" (the ScoredGroup sent on the Rollout stream);
  // `direction` "sent" or "received". The sizes a deployment sets
  // security.max_message_bytes and its network by.
  void RecordMessageBytes(absl::string_view message, absl::string_view direction, int64_t bytes);
  // The continuous engine's slots (rollout.max_batch_rows), set once.
  void SetEngineSlots(int64_t slots);
  // One engine step that decoded `busy_slots` rows; the slot cache's size.
  void RecordEngineStep(int64_t busy_slots, int64_t kv_cache_bytes);
  // The policy version the worker samples with (set at scrape time).
  void SetPolicyVersion(int64_t version);

 private:
  services::metrics::Registry& registry_;
  services::metrics::Counter& samples_;
  services::metrics::Counter& tokens_;
  services::metrics::Counter& groups_;
  services::metrics::Counter& items_dropped_;
  services::metrics::Counter& connections_;
  services::metrics::Histogram& generation_seconds_;
  services::metrics::Gauge& policy_version_;
  services::metrics::Counter& engine_steps_;
  services::metrics::Counter& engine_busy_slot_steps_;
  services::metrics::Gauge& engine_slots_;
  services::metrics::Gauge& kv_cache_bytes_;
};

// "Teacher.Score" → "teacher": the peer an RPC name (as the sampler logs it)
// goes to.
std::string PeerOfRpc(absl::string_view rpc);

}  // namespace kappa::rollout
