#include "learner/algo/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace kappa::learner {

double LearningRateSchedule::At(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (decay == Decay::kConstant) return peak;
  const int64_t decay_steps = total_steps - warmup_steps;
  const double progress =
      decay_steps > 0
          ? std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps),
                       0.0, 1.0)
          : 1.0;
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak * (min_ratio + (1.0 - min_ratio) * cosine);
}

}  // namespace kappa::learner
