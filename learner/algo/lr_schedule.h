// The RL phase's learning rate as a function of the optimizer step: a linear
// warm-up from peak / warmup_steps to the peak over the first warmup_steps
// steps, then constant or a cosine decay to min_ratio × peak at total_steps
// (verl's lr_warmup_steps / warmup_style / min_lr_ratio). Plain values.
#pragma once

#include <cstdint>

namespace kappa::learner {

struct LearningRateSchedule {
  enum class Decay { kConstant, kCosine };

  double peak = 1e-3;
  int64_t warmup_steps = 0;  // 0: no warm-up
  Decay decay = Decay::kConstant;
  int64_t total_steps = 0;  // kCosine: the step at which the rate reaches its floor
  double min_ratio = 0.0;   // kCosine: the floor as a fraction of `peak`

  // The rate of the 0-based optimizer step `step`:
  //   step < warmup_steps:  peak · (step + 1) / warmup_steps
  //   constant, afterwards: peak
  //   cosine:  peak · (m + (1 − m) · ½ (1 + cos(π · p))),  m = min_ratio,
  //            p = (step − warmup_steps) / (total_steps − warmup_steps) in [0, 1]
  //            (held at the floor past total_steps).
  double At(int64_t step) const;
};

}  // namespace kappa::learner
