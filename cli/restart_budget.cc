#include "cli/restart_budget.h"

namespace kappa::cli {

bool RestartBudget::TryRestart(const std::string& name, Clock::time_point now) {
  std::deque<Clock::time_point>& recent = recent_[name];
  while (!recent.empty() && now - recent.front() >= kWindow) recent.pop_front();
  if (static_cast<int>(recent.size()) >= kMaxRestarts) return false;
  recent.push_back(now);
  ++total_[name];
  return true;
}

int RestartBudget::total(const std::string& name) const {
  const auto it = total_.find(name);
  return it == total_.end() ? 0 : it->second;
}

}  // namespace kappa::cli
