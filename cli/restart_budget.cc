#include "cli/restart_budget.h"

namespace kappa::cli {

bool RestartBudget::TryRestart(const std::string& name, Clock::time_point started,
                               Clock::time_point died) {
  int& quick_deaths = quick_deaths_in_a_row_[name];
  quick_deaths = died - started < kHealthyUptime ? quick_deaths + 1 : 0;
  if (quick_deaths > kMaxQuickRestarts) return false;
  ++total_[name];
  return true;
}

int RestartBudget::total(const std::string& name) const {
  const auto it = total_.find(name);
  return it == total_.end() ? 0 : it->second;
}

}  // namespace kappa::cli
