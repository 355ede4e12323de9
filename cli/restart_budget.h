// When `kappa run` stops restarting a process that keeps dying: a crash loop
// is kMaxRestarts restarts of one process within kWindow. Faults spread over
// a long run (a node lost now and then) never use the budget up; a process
// that cannot start (a bad checkpoint, a port it cannot bind) does, within
// minutes. Not thread-safe; the supervising thread's.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <string>

namespace kappa::cli {

class RestartBudget {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kMaxRestarts = 5;
  static constexpr std::chrono::minutes kWindow{10};

  // True when `name` may be restarted at `now`, and records the restart;
  // false when it was already restarted kMaxRestarts times in the kWindow
  // before `now`.
  bool TryRestart(const std::string& name, Clock::time_point now);

  // Restarts of `name` so far, in all.
  int total(const std::string& name) const;

 private:
  std::map<std::string, std::deque<Clock::time_point>> recent_;  // within kWindow, oldest first
  std::map<std::string, int> total_;
};

}  // namespace kappa::cli
