#include "learner/policy_publisher.h"

namespace kappa::learner {

void PolicyPublisher::Publish(std::shared_ptr<const PolicySnapshot> snapshot) {
  absl::MutexLock lock(&mu_);
  latest_ = std::move(snapshot);
  published_.SignalAll();
}

std::shared_ptr<const PolicySnapshot> PolicyPublisher::WaitNewer(int64_t known_version,
                                                                 absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!shutdown_ && (latest_ == nullptr || latest_->version <= known_version)) {
    if (published_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  if (shutdown_ || latest_ == nullptr || latest_->version <= known_version) return nullptr;
  return latest_;
}

void PolicyPublisher::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  published_.SignalAll();
}

int64_t PolicyPublisher::version() const {
  absl::MutexLock lock(&mu_);
  return latest_ == nullptr ? -1 : latest_->version;
}

}  // namespace kappa::learner
