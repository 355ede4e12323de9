#include "rollout_worker/backoff.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

namespace kappa::rollout {

Backoff::Backoff(absl::Duration initial, absl::Duration max, uint64_t seed)
    : initial_(initial), max_(std::max(initial, max)), current_(initial), rng_(seed) {}

absl::Duration Backoff::Next() {
  const double seconds = absl::ToDoubleSeconds(current_);
  std::uniform_real_distribution<double> jitter(seconds / 2, seconds);
  const absl::Duration delay = absl::Seconds(jitter(rng_));
  current_ = std::min(current_ * 2, max_);
  return delay;
}

bool IsRetryableGrpcCode(int grpc_status_code) {
  switch (static_cast<grpc::StatusCode>(grpc_status_code)) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return true;
    default:
      return false;
  }
}

}  // namespace kappa::rollout
