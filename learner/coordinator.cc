#include "learner/coordinator.h"

#include <torch/torch.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"

namespace kappa::learner {
namespace {

// Waits wake up at least this often so lease expiry is noticed without a
// dedicated timer thread.
constexpr absl::Duration kPollInterval = absl::Milliseconds(200);

std::string MakeLeasePrefix() {
  std::random_device device;
  return absl::StrCat(absl::Hex(static_cast<uint64_t>(device()) << 32 | device()), "-");
}

}  // namespace

Coordinator::Coordinator(size_t dataset_size, uint64_t seed, int64_t data_position,
                         const CoordinatorOptions& options)
    : options_(options),
      lease_prefix_(MakeLeasePrefix()),
      prompts_(dataset_size, seed, data_position, options.rank, options.world_size) {}

int64_t Coordinator::UsedSlotsLocked() const {
  return static_cast<int64_t>(leases_.size() + buffer_.size());
}

void Coordinator::ExpireLeasesLocked(absl::Time now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline <= now) {
      reissue_.push_back(it->second.example_index);
      SilenceLocked(it->second.worker_id, now);
      --outstanding_by_worker_[it->second.worker_id];
      ++counters_.leases_reissued;
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<Lease> Coordinator::LeaseNext(const std::string& worker_id, int max_outstanding,
                                            absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (shutdown_) return std::nullopt;
    const absl::Time now = absl::Now();
    ExpireLeasesLocked(now);
    if (outstanding_by_worker_[worker_id] <
            AllowedOutstandingLocked(worker_id, max_outstanding, now) &&
        UsedSlotsLocked() < options_.buffer_groups) {
      break;
    }
    if (now >= deadline) return std::nullopt;
    changed_.WaitWithDeadline(&mu_, std::min(deadline, now + kPollInterval));
  }
  Lease lease;
  lease.serial = next_lease_++;
  lease.lease_id = absl::StrCat(lease_prefix_, lease.serial);
  if (!reissue_.empty()) {
    lease.example_index = reissue_.front();
    reissue_.pop_front();
  } else {
    lease.example_index = prompts_.Next();
  }
  lease.worker_id = worker_id;
  lease.deadline = absl::Now() + options_.lease_timeout;
  leases_[lease.lease_id] = lease;
  ++outstanding_by_worker_[worker_id];
  ++counters_.leases_issued;
  return lease;
}

void Coordinator::RememberClosedLocked(const std::string& lease_id) {
  closed_.insert(lease_id);
  closed_order_.push_back(lease_id);
  if (closed_order_.size() > kClosedLeaseMemory) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
}

SubmitVerdict Coordinator::Submit(const std::string& lease_id, const std::string& worker_id,
                                  ScoredGroup group) {
  absl::MutexLock lock(&mu_);
  HeardFromLocked(worker_id);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() && closed_.count(lease_id) > 0) {
    ++counters_.dropped_duplicate;
    return SubmitVerdict::kDuplicate;
  }
  if (it == leases_.end()) {
    ++counters_.dropped_unknown_lease;
    return SubmitVerdict::kUnknownLease;
  }
  if (it->second.worker_id != worker_id) {
    ++counters_.dropped_unknown_lease;
    return SubmitVerdict::kWrongWorker;
  }
  --outstanding_by_worker_[worker_id];
  buffer_.push_back(BufferedGroup{lease_id, it->second.example_index, std::move(group)});
  leases_.erase(it);
  RememberClosedLocked(lease_id);
  ++counters_.groups_accepted;
  changed_.SignalAll();
  return SubmitVerdict::kAccepted;
}

std::optional<size_t> Coordinator::LeasedExample(const std::string& lease_id,
                                                 const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.worker_id != worker_id) return std::nullopt;
  return it->second.example_index;
}

void Coordinator::ReissueRefused(const std::string& lease_id, const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  HeardFromLocked(worker_id);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.worker_id != worker_id) return;
  reissue_.push_back(it->second.example_index);
  --outstanding_by_worker_[worker_id];
  ++counters_.leases_reissued;
  leases_.erase(it);
  changed_.SignalAll();
}

Coordinator::Renewal Coordinator::Renew(const std::vector<std::string>& lease_ids,
                                        const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  ExpireLeasesLocked(now);
  HeardFromLocked(worker_id);
  Renewal renewal;
  renewal.deadline = now + options_.lease_timeout;
  for (const std::string& id : lease_ids) {
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.worker_id != worker_id) continue;
    it->second.deadline = renewal.deadline;
    renewal.lease_ids.push_back(id);
    ++counters_.leases_renewed;
  }
  // Leases may have expired above: their slots are free.
  changed_.SignalAll();
  return renewal;
}

void Coordinator::ReleaseWorker(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.worker_id == worker_id) {
      reissue_.push_back(it->second.example_index);
      ++counters_.leases_reissued;
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  outstanding_by_worker_.erase(worker_id);
  silent_.erase(worker_id);
  changed_.SignalAll();
}

void Coordinator::SilenceLocked(const std::string& worker_id, absl::Time now) {
  auto [it, first] = silent_.try_emplace(worker_id);
  Silence& silence = it->second;
  if (first) {
    ++counters_.streams_silenced;
    silence.wait = options_.lease_timeout;
  } else if (now >= silence.until) {  // a probation lease expired too
    silence.wait = std::min(2 * silence.wait, 8 * options_.lease_timeout);
  } else {
    return;  // another lease of the same silence
  }
  silence.until = now + silence.wait;
}

int Coordinator::AllowedOutstandingLocked(const std::string& worker_id, int max_outstanding,
                                          absl::Time now) const {
  const auto it = silent_.find(worker_id);
  if (it == silent_.end()) return max_outstanding;
  return now < it->second.until ? 0 : std::min(1, max_outstanding);
}

void Coordinator::HeardFromLocked(const std::string& worker_id) {
  if (silent_.erase(worker_id) > 0) changed_.SignalAll();
}

std::vector<BufferedGroup> Coordinator::TakeBatch(size_t count, int64_t current_version,
                                                  absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const int64_t oldest_allowed = current_version - options_.max_staleness;
  while (true) {
    for (auto it = buffer_.begin(); it != buffer_.end();) {
      if (it->group.policy_version < oldest_allowed) {
        ++counters_.dropped_stale;
        // The prompt itself is still useful: sample it again with fresh weights.
        reissue_.push_back(it->example_index);
        it = buffer_.erase(it);
      } else {
        ++it;
      }
    }
    if (buffer_.size() >= count) break;
    if (shutdown_) return {};
    const absl::Time now = absl::Now();
    if (now >= deadline) return {};
    ExpireLeasesLocked(now);
    changed_.WaitWithDeadline(&mu_, std::min(deadline, now + kPollInterval));
  }
  std::vector<BufferedGroup> batch;
  batch.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    batch.push_back(std::move(buffer_.front()));
    buffer_.pop_front();
  }
  counters_.groups_consumed += static_cast<int64_t>(count);
  changed_.SignalAll();  // slots freed
  return batch;
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  changed_.SignalAll();
}

CoordinatorCounters Coordinator::counters() const {
  absl::MutexLock lock(&mu_);
  CoordinatorCounters counters = counters_;
  counters.buffered = static_cast<int64_t>(buffer_.size());
  counters.outstanding = static_cast<int64_t>(leases_.size());
  return counters;
}

DataPosition Coordinator::data_position() const {
  absl::MutexLock lock(&mu_);
  DataPosition position;
  position.drawn = prompts_.position();
  for (const BufferedGroup& entry : buffer_) position.pending.push_back(entry.example_index);
  std::vector<const Lease*> open;
  for (const auto& [id, lease] : leases_) open.push_back(&lease);
  std::sort(open.begin(), open.end(),
            [](const Lease* a, const Lease* b) { return a->serial < b->serial; });
  for (const Lease* lease : open) position.pending.push_back(lease->example_index);
  position.pending.insert(position.pending.end(), reissue_.begin(), reissue_.end());
  return position;
}

void Coordinator::Requeue(const std::vector<size_t>& example_indices) {
  absl::MutexLock lock(&mu_);
  reissue_.insert(reissue_.begin(), example_indices.begin(), example_indices.end());
  changed_.SignalAll();
}

}  // namespace kappa::learner
