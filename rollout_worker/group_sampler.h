// Turns WorkItems into ScoredGroups in two steps. EngineRequest() makes an
// item's decode-engine request (its G rows share one prefill; the worker's
// engine decodes the rows of every item it holds together) and
// GroupFromEngine() the unscored group from the engine's samples.
// Complete() then adds one group's rewards
// from the verifier, (when the learner asks for them) teacher log-probs,
// and for negative zero-variance groups (when asked) verified teacher
// demonstrations. RPCs are retried on transient errors; a group is only
// completed whole, never with missing rewards or teacher log-probs.
// Demonstrations are optional: if the teacher or verifier cannot provide
// them, the group goes without.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kappa/v1/learner.pb.h"
#include "kappa/v1/teacher.grpc.pb.h"
#include "kappa/v1/verifier.grpc.pb.h"
#include "model/decode_engine.h"
#include "rollout_worker/lease_clock.h"
#include "rollout_worker/policy_watcher.h"
#include "rollout_worker/rpc_deadlines.h"
#include "rollout_worker/stop_strings.h"
#include "rollout_worker/worker_metrics.h"

namespace kappa::rollout {

struct GroupSamplerOptions {
  std::string worker_id;
  // The least time an RPC attempt gets (rollout.rpc_deadline_ms); longer
  // when its measured work needs it, doubled after each timeout of the same
  // call (RpcDeadlines).
  absl::Duration rpc_deadline = absl::Seconds(10);
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // Used when a WorkItem leaves them unset (0).
  int64_t default_max_new_tokens = 8;
  double default_temperature = 1.0;
  double default_top_p = 1.0;
  int64_t default_top_k = 0;
  double default_min_p = 0.0;
  // Items without a sampling_seed get one from this and their lease id.
  uint64_t seed = 1;
  // Attempts per RPC for teacher demonstrations (optional data): bounded, so
  // an unreachable teacher costs a group some seconds, not its lease.
  int demonstration_attempts = 3;
  // Not owned; null: nothing recorded. Counts every failed RPC attempt.
  WorkerMetrics* metrics = nullptr;
  // The worker's renewed lease deadlines (not owned); null: an item's lease
  // ends at its WorkItem.lease_deadline_unix_ms.
  const LeaseClock* leases = nullptr;
  // The text of a response: ScoredSample.response_text and the teacher
  // demonstrations' text (what the verifier reads), and the text the item's
  // stop strings are looked for in. Empty: ResponseText (the character
  // tokenizer). Called from Sample() and Complete(), possibly on several
  // threads at once.
  TokenDecoder decode;
};

// Serialized bytes of the RPC messages a sampler exchanged (successful
// calls only).
struct SamplerMessageBytes {
  int64_t score_calls = 0;
  int64_t score_sent = 0;
  int64_t score_received = 0;
  int64_t verify_calls = 0;
  int64_t verify_sent = 0;
  int64_t verify_received = 0;
};

class GroupSampler {
 public:
  GroupSampler(std::shared_ptr<grpc::ChannelInterface> verifier_channel,
               std::shared_ptr<grpc::ChannelInterface> teacher_channel,
               GroupSamplerOptions options);
  ~GroupSampler();

  // The decode-engine request of `item` with `policy`: its sampling
  // settings (the worker's defaults where it leaves them unset), G rows
  // sharing one prefill, row g seeded RowSeed(the item's sampling seed, g)
  // (so what an item samples does not depend on the items decoded with it),
  // its rows ending at the item's stop ids (the policy's config.json
  // eos_token_id when it names none), its budget, or the step a stop string
  // appears (StopStringCheck). `id` is echoed in
  // the engine's result. INVALID_ARGUMENT for an unusable item,
  // DEADLINE_EXCEEDED for an expired lease, FAILED_PRECONDITION without a
  // policy. Thread-compatible (reads the options only).
  absl::StatusOr<model::DecodeRequest> EngineRequest(const kappa::v1::WorkItem& item,
                                                     const Policy& policy, uint64_t id) const;
  // The unscored group of `item` from the engine's samples, each cut at the
  // item's first stop string (see stop_strings.h) and carrying `truncated`
  // when it hit its budget, with generation_seconds = `seconds`. INTERNAL
  // for a malformed sample.
  absl::StatusOr<kappa::v1::ScoredGroup> GroupFromEngine(
      const kappa::v1::WorkItem& item, int64_t policy_version,
      std::vector<model::SampledSequence> samples, double seconds) const;

  // Verifies and scores a group GroupFromEngine() returned for `item` (adding the
  // time it took to generation_seconds). Thread-safe: the worker completes
  // a batch's groups concurrently, so their Verify and Score requests reach
  // the verifier and the teacher together (the teacher batches them).
  // Blocks for the RPCs and their retries: between attempts it waits out a
  // backoff, which Cancel() ends at once and `abandon()` (called without any
  // of the sampler's locks, possibly on several threads) within 20 ms.
  // Errors: CANCELLED once Cancel() was called or `abandon()` returns true,
  // DEADLINE_EXCEEDED once the lease has expired, and a non-retryable RPC
  // error as the server returned it.
  absl::StatusOr<kappa::v1::ScoredGroup> Complete(const kappa::v1::WorkItem& item,
                                                  kappa::v1::ScoredGroup group,
                                                  const Policy& policy,
                                                  const std::function<bool()>& abandon)
      ABSL_LOCKS_EXCLUDED(mu_);

  SamplerMessageBytes message_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels the RPCs in flight and makes every later Complete() return CANCELLED
  // until Resume(). Thread-safe; does not wait for the cancelled calls.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  void Resume() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Retries transient errors with backoff until the lease expires or, when
  // max_attempts > 0, after that many attempts. `units`: the call's work
  // (positions scored, items verified), which its attempts' deadlines
  // follow (deadlines_).
  absl::Status CallWithRetry(const char* what, const kappa::v1::WorkItem& item,
                             const std::function<bool()>& abandon,
                             const std::function<grpc::Status(grpc::ClientContext*)>& call,
                             double units, int max_attempts = 0) ABSL_LOCKS_EXCLUDED(mu_);
  bool LeaseExpired(const kappa::v1::WorkItem& item) const;
  // Seconds one group spent in each stage (0 for a stage it skipped).
  struct StageTimes {
    double decode = 0;
    double verify = 0;
    double teacher_score = 0;
    double demonstrations = 0;
    double Total() const { return decode + verify + teacher_score + demonstrations; }
  };
  // To the metrics (kappa_worker_stage_seconds) and the log, one line a group.
  void RecordStageTimes(const kappa::v1::WorkItem& item, const StageTimes& times);
  // `message` ("score" or "verify") exchanged: to the metrics and message_bytes_.
  void RecordBytes(const char* message, int64_t sent, int64_t received) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancel() was called (and not Resume()d since).
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Verify(const kappa::v1::WorkItem& item, kappa::v1::ScoredGroup& group,
                      const std::function<bool()>& abandon);
  // vocab_size: the width of the distributions (the item's vocabulary limit).
  absl::Status Score(const kappa::v1::WorkItem& item, int64_t vocab_size,
                     kappa::v1::ScoredGroup& group, const std::function<bool()>& abandon);
  // Attaches demonstrations to a group that wants them; CANCELLED when the
  // group is being abandoned, else OK (failures only cost the demonstrations).
  absl::Status AddDemonstrations(const kappa::v1::WorkItem& item, int64_t max_new_tokens,
                                 int64_t vocab_size, kappa::v1::ScoredGroup& group,
                                 const std::function<bool()>& abandon);

  std::unique_ptr<kappa::v1::Verifier::StubInterface> verifier_;
  std::unique_ptr<kappa::v1::Teacher::StubInterface> teacher_;
  const GroupSamplerOptions options_;
  RpcDeadlines deadlines_;

  mutable absl::Mutex mu_;
  // Set by Cancel(), cleared by Resume(): no new RPC attempt starts.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // The RPCs in flight, for Cancel() to TryCancel(): Complete() runs
  // concurrently for a batch's groups. Each context is owned by the
  // CallWithRetry() attempt that registered it, and removed before it ends.
  std::set<grpc::ClientContext*> active_contexts_ ABSL_GUARDED_BY(mu_);
  SamplerMessageBytes message_bytes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kappa::rollout
