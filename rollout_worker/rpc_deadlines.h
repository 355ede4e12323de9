// Per-attempt deadlines for the worker's RPCs (Verify, Score, Generate) that
// follow the work they carry instead of one constant.
//
// A fixed deadline shorter than the work livelocks: a Score of a 0.5B
// teacher over a group's positions takes tens of seconds on a CPU, every
// attempt times out, DEADLINE_EXCEEDED is retried and the teacher computes
// each abandoned batch anyway, adding load until the lease dies. Here each
// RPC kind learns its seconds per unit of work (positions for Score, items
// for Verify) from the calls that succeeded, and an attempt gets
//   max(floor, kHeadroom × seconds per unit × units) × 2^timeouts,
// where `floor` is rollout.rpc_deadline_ms and `timeouts` counts this
// call's earlier attempts that ended in DEADLINE_EXCEEDED: no attempt
// repeats a deadline that already proved too short.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kappa::rollout {

class RpcDeadlines {
 public:
  // An attempt may take this many times the measured time of its work.
  static constexpr double kHeadroom = 4.0;
  // Weight of the newest call in the per-unit estimate (an exponential
  // moving average: the cost moves with load and the model's size).
  static constexpr double kSmoothing = 0.3;
  // Doublings at most: 2^10 × the floor (hours at the defaults).
  static constexpr int kMaxDoublings = 10;

  explicit RpcDeadlines(absl::Duration floor) : floor_(floor) {}

  // The timeout of an attempt of `rpc` carrying `units` of work (> 0),
  // after `timeouts` attempts of the same call ended in DEADLINE_EXCEEDED.
  absl::Duration For(const std::string& rpc, double units, int timeouts) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A successful call of `rpc` with `units` of work took `elapsed`.
  void Record(const std::string& rpc, double units, absl::Duration elapsed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The current estimate for `rpc`, 0 before its first success.
  double SecondsPerUnit(const std::string& rpc) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const absl::Duration floor_;
  mutable absl::Mutex mu_;
  std::map<std::string, double> seconds_per_unit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kappa::rollout
