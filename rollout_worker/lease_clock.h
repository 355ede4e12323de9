// The deadlines of the leases a rollout worker holds, kept alive while it
// works on them.
//
// The learner sets a lease's deadline when it issues the lease
// (WorkItem.lease_deadline_unix_ms, learner.lease_timeout_ms ahead) and
// moves it when the worker renews it (RenewLeases / LeasesRenewed on the
// Rollout stream). A WorkItem is copied by value through the worker, so the
// current deadline lives here, by lease id, and every "has my lease
// expired" question asks this clock. A lease is due for renewal once less
// than half of its span (deadline minus when it was received or renewed) is
// left; it is asked for again if no answer came within a quarter span.
// Thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kappa/v1/learner.pb.h"

namespace kappa::rollout {

class LeaseClock {
 public:
  // Starts tracking `item`'s lease from its lease_deadline_unix_ms (an item
  // without one, 0, never expires and is not tracked).
  void Track(const kappa::v1::WorkItem& item, absl::Time now = absl::Now())
      ABSL_LOCKS_EXCLUDED(mu_);
  // The group was sent or the item dropped: no more renewals.
  void Forget(const std::string& lease_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream ended: every lease of it is gone.
  void ForgetAll() ABSL_LOCKS_EXCLUDED(mu_);

  // The lease's current deadline: the latest renewal's, else the item's;
  // InfiniteFuture for an item without one.
  absl::Time Deadline(const kappa::v1::WorkItem& item) const ABSL_LOCKS_EXCLUDED(mu_);
  bool Expired(const kappa::v1::WorkItem& item, absl::Time now = absl::Now()) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The tracked leases to renew now (see above); marks them as asked.
  std::vector<std::string> DueForRenewal(absl::Time now = absl::Now()) ABSL_LOCKS_EXCLUDED(mu_);
  // The learner's LeasesRenewed: these leases now end at `deadline`.
  void Renewed(const std::vector<std::string>& lease_ids, absl::Time deadline,
               absl::Time now = absl::Now()) ABSL_LOCKS_EXCLUDED(mu_);
  // How long DueForRenewal may wait before a tracked lease is due: the
  // smallest quarter span, capped at `at_most` (which it is when empty).
  absl::Duration NextCheck(absl::Duration at_most) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Held {
    absl::Time deadline;
    absl::Duration span;                      // deadline − when it was set
    absl::Time asked = absl::InfinitePast();  // last renewal request
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kappa::rollout
