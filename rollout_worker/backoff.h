// Exponential backoff with full jitter for reconnects and RPC retries, so a
// fleet of workers that lost the same server does not reconnect in lockstep.
#pragma once

#include <cstdint>
#include <random>

#include "absl/time/time.h"

namespace kappa::rollout {

class Backoff {
 public:
  Backoff(absl::Duration initial, absl::Duration max, uint64_t seed = std::random_device{}());

  // The next delay: uniform in [current/2, current], then current doubles (up to max).
  absl::Duration Next();
  void Reset() { current_ = initial_; }

 private:
  absl::Duration initial_;
  absl::Duration max_;
  absl::Duration current_;
  std::mt19937_64 rng_;
};

// True for the status codes worth retrying: the server is down, overloaded or slow.
bool IsRetryableGrpcCode(int grpc_status_code);

}  // namespace kappa::rollout
