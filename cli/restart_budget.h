// When `kappa run` stops restarting a process that keeps dying: a crash loop
// is a process that died kMaxQuickRestarts + 1 times in a row, each less
// than kHealthyUptime after it was started. A process that cannot start (a bad
// checkpoint, a port it cannot bind) dies within seconds every time and uses
// the budget up at once; one that ran a while before it died (a node lost,
// an OOM kill, an operator's kill) starts the count again, however often
// that happens. This is Kubernetes' rule too: CrashLoopBackOff is reset by a
// container that ran long enough. Not thread-safe; the supervising thread's.
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace kappa::cli {

class RestartBudget {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kMaxQuickRestarts = 5;
  static constexpr std::chrono::seconds kHealthyUptime{60};

  // Records that `name`, started at `started`, died at `died`. True when it
  // may be started again (and counts the restart); false when it died within
  // kHealthyUptime of its start, and so did its kMaxQuickRestarts runs before.
  // REQUIRES: started <= died.
  bool TryRestart(const std::string& name, Clock::time_point started, Clock::time_point died);

  // Restarts of `name` so far, in all.
  int total(const std::string& name) const;

 private:
  std::map<std::string, int> quick_deaths_in_a_row_;
  std::map<std::string, int> total_;
};

}  // namespace kappa::cli
