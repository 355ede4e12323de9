#include "rollout_worker/lease_clock.h"

#include <algorithm>

namespace kappa::rollout {

void LeaseClock::Track(const kappa::v1::WorkItem& item, absl::Time now) {
  if (item.lease_deadline_unix_ms() <= 0) return;
  const absl::Time deadline = absl::FromUnixMillis(item.lease_deadline_unix_ms());
  absl::MutexLock lock(&mu_);
  held_[item.lease_id()] = Held{deadline, std::max(deadline - now, absl::ZeroDuration())};
}

void LeaseClock::Forget(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  held_.erase(lease_id);
}

void LeaseClock::ForgetAll() {
  absl::MutexLock lock(&mu_);
  held_.clear();
}

absl::Time LeaseClock::Deadline(const kappa::v1::WorkItem& item) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(item.lease_id());
    if (it != held_.end()) return it->second.deadline;
  }
  return item.lease_deadline_unix_ms() > 0 ? absl::FromUnixMillis(item.lease_deadline_unix_ms())
                                           : absl::InfiniteFuture();
}

bool LeaseClock::Expired(const kappa::v1::WorkItem& item, absl::Time now) const {
  return now > Deadline(item);
}

std::vector<std::string> LeaseClock::DueForRenewal(absl::Time now) {
  std::vector<std::string> due;
  absl::MutexLock lock(&mu_);
  for (auto& [id, held] : held_) {
    if (held.deadline <= now) continue;  // too late: the learner has let it go
    const bool half_gone = held.deadline - now < held.span / 2;
    const bool unanswered = now - held.asked < held.span / 4;
    if (half_gone && !unanswered) {
      held.asked = now;
      due.push_back(id);
    }
  }
  return due;
}

void LeaseClock::Renewed(const std::vector<std::string>& lease_ids, absl::Time deadline,
                         absl::Time now) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : lease_ids) {
    auto it = held_.find(id);
    if (it == held_.end()) continue;
    it->second = Held{deadline, std::max(deadline - now, absl::ZeroDuration())};
  }
}

absl::Duration LeaseClock::NextCheck(absl::Duration at_most) const {
  absl::Duration next = at_most;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, held] : held_) next = std::min(next, held.span / 4);
  return std::max(next, absl::Milliseconds(10));
}

}  // namespace kappa::rollout
