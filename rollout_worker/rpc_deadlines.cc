#include "rollout_worker/rpc_deadlines.h"

#include <algorithm>
#include <cmath>

namespace kappa::rollout {

absl::Duration RpcDeadlines::For(const std::string& rpc, double units, int timeouts) const {
  const absl::Duration measured =
      absl::Seconds(kHeadroom * SecondsPerUnit(rpc) * std::max(units, 1.0));
  const int doublings = std::clamp(timeouts, 0, kMaxDoublings);
  return std::max(floor_, measured) * static_cast<double>(int64_t{1} << doublings);
}

void RpcDeadlines::Record(const std::string& rpc, double units, absl::Duration elapsed) {
  const double per_unit = absl::ToDoubleSeconds(elapsed) / std::max(units, 1.0);
  if (!std::isfinite(per_unit) || per_unit < 0) return;
  absl::MutexLock lock(&mu_);
  auto [it, first] = seconds_per_unit_.emplace(rpc, per_unit);
  if (!first) it->second = (1 - kSmoothing) * it->second + kSmoothing * per_unit;
}

double RpcDeadlines::SecondsPerUnit(const std::string& rpc) const {
  absl::MutexLock lock(&mu_);
  auto it = seconds_per_unit_.find(rpc);
  return it == seconds_per_unit_.end() ? 0.0 : it->second;
}

}  // namespace kappa::rollout
