#include "learner/algo/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kappa::learner {
namespace {

TEST(LearningRateSchedule, WarmsUpLinearlyThenHoldsThePeak) {
  LearningRateSchedule schedule;
  schedule.peak = 1e-3;
  schedule.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(schedule.At(0), 0.25e-3);
  EXPECT_DOUBLE_EQ(schedule.At(2), 0.75e-3);
  EXPECT_DOUBLE_EQ(schedule.At(3), 1e-3);
  EXPECT_DOUBLE_EQ(schedule.At(1000), 1e-3);
}

TEST(LearningRateSchedule, CosineDecaysFromThePeakToTheFloorAtTotalSteps) {
  LearningRateSchedule schedule;
  schedule.peak = 2e-3;
  schedule.warmup_steps = 10;
  schedule.decay = LearningRateSchedule::Decay::kCosine;
  schedule.total_steps = 110;
  schedule.min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(schedule.At(9), 2e-3);   // the warm-up's last step
  EXPECT_DOUBLE_EQ(schedule.At(10), 2e-3);  // decay progress 0
  // Halfway through the decay: the mean of the peak and the floor.
  EXPECT_NEAR(schedule.At(60), 0.5 * (2e-3 + 0.2e-3), 1e-15);
  // A quarter: floor + (peak − floor) · ½(1 + cos(π/4)).
  EXPECT_NEAR(schedule.At(35), 0.2e-3 + 1.8e-3 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_NEAR(schedule.At(110), 0.2e-3, 1e-15);
  EXPECT_NEAR(schedule.At(500), 0.2e-3, 1e-15);  // held past the end (a resumed longer run)
}

TEST(LearningRateSchedule, CosineWithoutWarmupOrDecayStepsEndsAtTheFloor) {
  LearningRateSchedule schedule;
  schedule.peak = 1.0;
  schedule.decay = LearningRateSchedule::Decay::kCosine;
  schedule.total_steps = 0;  // nothing to decay over
  EXPECT_DOUBLE_EQ(schedule.At(0), 0.0);
}

}  // namespace
}  // namespace kappa::learner
