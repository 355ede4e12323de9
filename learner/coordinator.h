// Hands prompts to rollout workers under leases and collects their scored
// groups into a bounded buffer for the trainer (docs/algorithms.md §6).
//
// Capacity rule: leased-but-unreturned prompts plus buffered groups never
// exceed `buffer_groups`, so memory is bounded however many workers connect;
// a worker only receives a lease (and the credit to return it) when a slot
// is free. A lease not returned before its deadline, or whose worker
// disconnected, goes back to the front of the queue; a worker keeps its
// leases alive while it works on them by renewing them (Renew), so the
// timeout bounds a worker's silence, not the length of its work. A group is consumed at
// most once: it is accepted only against an outstanding lease, which it
// closes. The last kClosedLeaseMemory leases closed that way are remembered,
// so a second group for one of them is told apart (a duplicate) from a group
// for a lease that expired, was re-issued or was never issued.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "learner/algo/train_batch.h"
#include "learner/prompt_source.h"

namespace kappa::learner {

struct CoordinatorOptions {
  int64_t buffer_groups = 64;
  int64_t max_staleness = 2;
  absl::Duration lease_timeout = absl::Seconds(30);
  // Data parallel: this learner rank leases only its share of the prompts
  // (PromptSource shards).
  int rank = 0;
  int world_size = 1;
};

struct Lease {
  std::string lease_id;
  int64_t serial = 0;  // issue order (lease ids sort as strings, not numbers)
  size_t example_index = 0;
  std::string worker_id;
  absl::Time deadline;
};

// A group as the trainer consumes it.
struct BufferedGroup {
  std::string lease_id;
  size_t example_index = 0;
  ScoredGroup group;
};

struct DataPosition {
  int64_t drawn = 0;
  std::vector<size_t> pending;
};

enum class SubmitVerdict {
  kAccepted,
  kDuplicate,     // the lease was already closed by an accepted group
  kUnknownLease,  // not open: expired, re-issued, never issued (or closed too long ago)
  kWrongWorker,   // open, but held by another worker stream
};

// How many closed leases the coordinator remembers to recognise duplicates:
// a fixed bound, far more than the groups in flight at any time, so memory
// stays bounded over any run length. A copy comes from a worker re-sending
// after a broken stream, within seconds to a minute; 16384 leases are 4
// minutes of the toy demo at its fastest (64 groups/s) and hours at real
// sizes. A copy older than that is still refused, as an unknown lease.
// Measured: ~390 B per remembered id with the allocator's overhead, so
// ~6 MiB once full (65536 were ~25 MiB, 11 % of the toy learner's RSS, and
// took the toy 17 minutes to fill: the first 60-minute soak read it as
// growth).
inline constexpr size_t kClosedLeaseMemory = 16384;

struct CoordinatorCounters {
  int64_t leases_issued = 0;
  int64_t leases_reissued = 0;   // expired or orphaned by a disconnect
  int64_t leases_renewed = 0;    // deadlines moved by Renew, one per lease and call
  int64_t groups_accepted = 0;
  int64_t groups_consumed = 0;
  int64_t dropped_stale = 0;
  int64_t dropped_duplicate = 0;      // a second group for a lease already closed
  int64_t dropped_unknown_lease = 0;  // expired, never issued or another worker's
  int64_t buffered = 0;
  int64_t outstanding = 0;
  // Times a worker stream was silenced: a lease it held expired while it
  // sent nothing (see LeaseNext).
  int64_t streams_silenced = 0;
};

class Coordinator {
 public:
  Coordinator(size_t dataset_size, uint64_t seed, int64_t data_position,
              const CoordinatorOptions& options);

  // Blocks until `worker_id` holds fewer than `max_outstanding` leases and a
  // slot is free, then leases the next prompt. nullopt on deadline or
  // shutdown. A silent worker gets less: once a lease it held expires with
  // no group or renewal from it, its slots go back to the others and it is
  // leased nothing for one lease timeout, then at most one lease at a time
  // (probation); each probation lease that expires unanswered doubles the
  // wait, up to 8 lease timeouts. A group (Submit, ReissueRefused) or a
  // renewal (Renew) from it ends the silence. So idle streams cannot keep
  // the buffer's slots by taking each expired lease again, and a healthy
  // worker whose leases were lost (renewals dropped on the way) is not shut
  // out for good.

  std::optional<Lease> LeaseNext(const std::string& worker_id, int max_outstanding,
                                 absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Closes the lease and buffers the group (kAccepted); otherwise drops the
  // group, counted by its verdict (kDuplicate: dropped_duplicate; the others:
  // dropped_unknown_lease).
  SubmitVerdict Submit(const std::string& lease_id, const std::string& worker_id,
                       ScoredGroup group) ABSL_LOCKS_EXCLUDED(mu_);

  // The example of lease `lease_id` while it is open and held by
  // `worker_id`; nullopt otherwise (Submit then drops the group by its
  // verdict).
  std::optional<size_t> LeasedExample(const std::string& lease_id,
                                      const std::string& worker_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // The group `worker_id` returned for `lease_id` was refused (malformed,
  // or not what the lease handed out): the lease closes and its prompt is
  // leased again now rather than at its deadline (counted in
  // leases_reissued). No-op unless the lease is open and the worker's.
  void ReissueRefused(const std::string& lease_id, const std::string& worker_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The worker still works on these leases: each open one it holds gets the
  // deadline now + lease_timeout (expired ones are re-issued first, as at
  // any wake-up, and are not renewed). Returns the ids renewed and that
  // deadline; unknown, expired, closed or other workers' ids are left out.
  struct Renewal {
    std::vector<std::string> lease_ids;
    absl::Time deadline;
  };
  Renewal Renew(const std::vector<std::string>& lease_ids, const std::string& worker_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The worker's stream ended: its leases are re-issued now rather than at
  // their deadlines.
  void ReleaseWorker(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until `count` groups sampled at version >= current_version -
  // max_staleness are buffered (older ones are dropped and counted), then
  // removes and returns them in arrival order. Empty on deadline/shutdown.
  std::vector<BufferedGroup> TakeBatch(size_t count, int64_t current_version,
                                       absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  CoordinatorCounters counters() const ABSL_LOCKS_EXCLUDED(mu_);
  // Where a resumed run continues: prompts drawn from the dataset so far,
  // and those drawn but not trained on yet, in the order they would be:
  // groups in the buffer, then open leases by issue order, then prompts
  // waiting to be re-issued. Without the pending ones a resumed learner
  // would skip every prompt in flight at its checkpoint. One snapshot, so a
  // prompt leased meanwhile is neither skipped nor drawn twice.
  DataPosition data_position() const ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `example_indices` out before anything else, in order (a resumed
  // run's DataPosition::pending).
  void Requeue(const std::vector<size_t>& example_indices) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void ExpireLeasesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A lease of `worker_id` expired at `now` unanswered: starts or lengthens
  // its silence (LeaseNext).
  void SilenceLocked(const std::string& worker_id, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many leases `worker_id` may hold now: `max_outstanding`, or 0 / 1
  // while silent (LeaseNext).
  int AllowedOutstandingLocked(const std::string& worker_id, int max_outstanding,
                               absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker_id` sent something: it may be leased prompts again.
  void HeardFromLocked(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t UsedSlotsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `lease_id` as closed, forgetting the oldest beyond kClosedLeaseMemory.
  void RememberClosedLocked(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const std::string lease_prefix_;  // distinguishes leases across learner restarts

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // signalled when slots, leases or the buffer change
  PromptSource prompts_ ABSL_GUARDED_BY(mu_);
  std::deque<size_t> reissue_ ABSL_GUARDED_BY(mu_);
  // Workers a lease of which expired unanswered (LeaseNext): leased nothing
  // until `until`, then one lease at a time; cleared by any group or renewal
  // from them, or when they leave.
  struct Silence {
    absl::Time until;
    absl::Duration wait;  // doubles with each probation lease that expires
  };
  std::map<std::string, Silence> silent_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Lease> leases_ ABSL_GUARDED_BY(mu_);
  // Leases closed by an accepted group, the newest kClosedLeaseMemory: the
  // set for lookup, the queue for the order they leave it in.
  std::set<std::string> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> closed_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> outstanding_by_worker_ ABSL_GUARDED_BY(mu_);
  std::deque<BufferedGroup> buffer_ ABSL_GUARDED_BY(mu_);
  int64_t next_lease_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  CoordinatorCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kappa::learner
