// Alarms on constructed metric series: they fire on series that should trip
// them, at the expected step, and stay silent on ones that should not.
#include "learner/algo/alarms.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kappa::learner {
namespace {

AlarmConfig TestConfig() {
  AlarmConfig c;
  c.kappa_threshold = 10;
  c.ema_alpha = 0.5;
  c.slope_window = 5;
  c.conflict_threshold = 0.5;
  c.conflict_window = 4;
  c.collapse_window = 5;
  c.warmup_steps = 3;
  return c;
}

// Feeds `steps` observations built by `make`; returns the events by step.
std::vector<AlarmEvent> Feed(int steps, const std::function<StepObservation(int)>& make,
                            AlarmMonitor* monitor) {
  std::vector<AlarmEvent> all;
  for (int s = 1; s <= steps; ++s) {
    StepObservation o = make(s);
    o.step = s;
    for (AlarmEvent& e : monitor->Observe(o)) all.push_back(std::move(e));
  }
  return all;
}

StepObservation Healthy(int s) {
  StepObservation o;
  o.kappa = 2.0;
  o.distill_loss = 1.0 / s;  // falling
  o.kdr_negative_weighted_fraction = 0.2;
  o.reward_mean = 0.3 + 0.001 * s;
  o.entropy = 0.8;
  o.inference_mismatch = 1e-6;  // fp32, on-policy
  return o;
}

TEST(Alarms, SilentOnAHealthyRun) {
  AlarmMonitor monitor(TestConfig());
  EXPECT_TRUE(Feed(200, Healthy, &monitor).empty());
}

TEST(Alarms, MagnitudeDrowningNeedsHighKappaAndRisingDistillLoss) {
  // High κ but L_D falling: silent.
  AlarmMonitor falling(TestConfig());
  EXPECT_TRUE(Feed(100, [](int s) { auto o = Healthy(s); o.kappa = 50; return o; }, &falling).empty());
  // Rising L_D but low κ: silent.
  AlarmMonitor low_kappa(TestConfig());
  EXPECT_TRUE(Feed(100, [](int s) { auto o = Healthy(s); o.distill_loss = 1.0 + 0.002 * s; return o; },
                  &low_kappa).empty());
  // Both from step 30: fires once, soon after. (L_D grows tenfold here, so
  // the collapse band is widened to keep this about drowning alone.)
  AlarmConfig config = TestConfig();
  config.distill_rise_factor = 1e6;
  AlarmMonitor monitor(config);
  const auto events = Feed(100, [](int s) {
    auto o = Healthy(s);
    if (s >= 30) { o.kappa = 100; o.distill_loss = 0.01 * (s - 29); }
    return o;
  }, &monitor);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, AlarmKind::kMagnitudeDrowning);
  EXPECT_GE(events[0].step, 30);
  EXPECT_LE(events[0].step, 36);
  EXPECT_NE(events[0].message.find("kappa EMA"), std::string::npos);
  EXPECT_TRUE(monitor.active(AlarmKind::kMagnitudeDrowning));
}

TEST(Alarms, DirectionalConflictNeedsAWindowAboveThreshold) {
  AlarmMonitor blips(TestConfig());  // above threshold 3 steps out of 4: never 4 running
  EXPECT_TRUE(Feed(100, [](int s) {
    auto o = Healthy(s);
    o.kdr_negative_weighted_fraction = s % 4 == 0 ? 0.1 : 0.9;
    return o;
  }, &blips).empty());
  AlarmMonitor monitor(TestConfig());
  const auto events = Feed(60, [](int s) {
    auto o = Healthy(s);
    o.kdr_negative_weighted_fraction = s >= 20 && s < 40 ? 0.8 : 0.2;
    return o;
  }, &monitor);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, AlarmKind::kDirectionalConflict);
  EXPECT_EQ(events[0].step, 23);  // 20, 21, 22, 23: the 4th consecutive step
  EXPECT_FALSE(monitor.active(AlarmKind::kDirectionalConflict));  // cleared after 40
  EXPECT_EQ(monitor.fired(AlarmKind::kDirectionalConflict), 1);
}

TEST(Alarms, CollapseOnRewardDropDistillBlowupOrEntropyFloor) {
  {
    AlarmMonitor monitor(TestConfig());
    const auto events = Feed(80, [](int s) {
      auto o = Healthy(s);
      o.reward_mean = s < 40 ? 0.6 : 0.0;
      return o;
    }, &monitor);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, AlarmKind::kCollapse);
    EXPECT_NE(events[0].message.find("reward"), std::string::npos);
    EXPECT_GT(events[0].step, 40);
    EXPECT_LE(events[0].step, 47);
  }
  {
    AlarmMonitor monitor(TestConfig());
    const auto events = Feed(80, [](int s) {
      auto o = Healthy(s);
      o.kappa = 1.0;  // keep drowning out of it
      o.distill_loss = s < 40 ? 0.5 : 5.0;
      return o;
    }, &monitor);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, AlarmKind::kCollapse);
    EXPECT_NE(events[0].message.find("L_D"), std::string::npos);
  }
  {
    AlarmMonitor monitor(TestConfig());
    const auto events = Feed(80, [](int s) {
      auto o = Healthy(s);
      o.entropy = s < 40 ? 0.8 : 0.0;
      return o;
    }, &monitor);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_NE(events[0].message.find("entropy"), std::string::npos);
  }
  // A reward that never left ~0 is not a drop.
  AlarmMonitor flat(TestConfig());
  EXPECT_TRUE(Feed(80, [](int s) { auto o = Healthy(s); o.reward_mean = 0.01; return o; }, &flat).empty());
}

TEST(Alarms, NothingDuringWarmupAndUnmeasuredStepsKeepState) {
  AlarmConfig config = TestConfig();
  config.warmup_steps = 1000;
  AlarmMonitor monitor(config);
  EXPECT_TRUE(Feed(100, [](int s) {
    auto o = Healthy(s);
    o.kdr_negative_weighted_fraction = 0.99;
    o.reward_mean = 0;
    return o;
  }, &monitor).empty());

  AlarmMonitor gaps(TestConfig());
  const auto events = Feed(40, [](int s) {
    auto o = Healthy(s);
    o.kdr_negative_weighted_fraction = 0.9;
    if (s > 20 && s % 2 == 0) o.kdr_negative_weighted_fraction.reset();  // not measured
    return o;
  }, &gaps);
  EXPECT_EQ(events.size(), 1u);  // one rising edge, not one per measured step
  EXPECT_TRUE(gaps.active(AlarmKind::kDirectionalConflict));
}

}  // namespace
}  // namespace kappa::learner

namespace kappa::learner {
namespace {

TEST(Alarms, HoldsThroughFlickerAndClearsAfterClearSteps) {
  AlarmMonitor monitor(TestConfig());  // conflict_window 4, clear_steps 10
  // Above from 20; then 5 below / 5 above (the alarm holds: one event);
  // then 15 below (clears); then above again from 60 (a second event).
  auto fraction = [](int s) {
    if (s < 20) return 0.2;
    if (s < 40) return ((s - 20) / 5) % 2 == 0 ? 0.9 : 0.1;
    if (s < 60) return 0.1;
    return 0.9;
  };
  const auto events = Feed(80, [&](int s) {
    auto o = Healthy(s);
    o.kdr_negative_weighted_fraction = fraction(s);
    return o;
  }, &monitor);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].step, 23);
  EXPECT_EQ(events[1].step, 63);
  EXPECT_EQ(monitor.fired(AlarmKind::kDirectionalConflict), 2);
}

TEST(Alarms, ANegligibleDistillRiseIsNotDrowning) {
  AlarmMonitor monitor(TestConfig());  // min_relative_rise 2 %
  EXPECT_TRUE(Feed(100, [](int s) {
    auto o = Healthy(s);
    o.kappa = 100;
    o.distill_loss = 3.0 + 1e-4 * s;  // +0.3 % over the whole run
    return o;
  }, &monitor).empty());
}

TEST(Alarms, InferenceMismatchFromTheFirstStepAfterItsWindow) {
  AlarmConfig config = TestConfig();
  config.mismatch_threshold = 0.1;
  config.mismatch_window = 3;
  config.clear_steps = 4;
  // The other alarms wait 50 observations; the mismatch, broken from step 1,
  // fires at step 3, once its window is full.
  config.warmup_steps = 50;
  AlarmMonitor monitor(config);
  auto mismatch = [](int s) -> std::optional<double> {
    if (s <= 5) return 0.2;                       // a broken sync from the start
    if (s <= 8) return std::nullopt;              // steps without on-policy tokens
    if (s <= 20) return 0.01;                     // fixed: clears after clear_steps
    if (s <= 30) return s % 2 == 1 ? 0.3 : 0.05;  // never 3 running: silent
    return 0.15;                                  // broken again
  };
  std::vector<int64_t> fired;
  bool active_at_8 = false, active_at_12 = true;
  for (int s = 1; s <= 40; ++s) {
    StepObservation o = Healthy(s);
    o.step = s;
    o.inference_mismatch = mismatch(s);
    for (const AlarmEvent& e : monitor.Observe(o)) {
      ASSERT_EQ(e.kind, AlarmKind::kInferenceMismatch) << e.message;
      fired.push_back(e.step);
      EXPECT_NE(e.message.find("0.1"), std::string::npos) << e.message;
    }
    if (s == 8) active_at_8 = monitor.active(AlarmKind::kInferenceMismatch);
    if (s == 12) active_at_12 = monitor.active(AlarmKind::kInferenceMismatch);
  }
  EXPECT_EQ(fired, (std::vector<int64_t>{3, 33}));
  EXPECT_TRUE(active_at_8) << "steps without a measurement keep the alarm";
  EXPECT_FALSE(active_at_12) << "cleared after clear_steps = 4 low steps (9..12)";
  EXPECT_EQ(monitor.fired(AlarmKind::kInferenceMismatch), 2);
  EXPECT_STREQ(AlarmName(AlarmKind::kInferenceMismatch), "inference_mismatch");

  // A threshold below 0 or a window below 1 is refused.
  AlarmConfig bad = TestConfig();
  bad.mismatch_window = 0;
  EXPECT_THROW(AlarmMonitor{bad}, std::invalid_argument);
  bad = TestConfig();
  bad.mismatch_threshold = -1;
  EXPECT_THROW(AlarmMonitor{bad}, std::invalid_argument);
}

TEST(Alarms, ANonFiniteObservationLeavesEveryEmaAsItWas) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // From the first step: no EMA is seeded with it, and nothing breaks.
  AlarmMonitor first(TestConfig());
  StepObservation broken;
  broken.step = 1;
  broken.kappa = nan;
  broken.distill_loss = inf;
  broken.reward_mean = nan;
  broken.entropy = -inf;
  EXPECT_TRUE(first.Observe(broken).empty());
  EXPECT_FALSE(first.state().kappa_ema || first.state().distill_ema || first.state().reward_ema ||
               first.state().entropy_ema);
  EXPECT_TRUE(first.state().distill_history.empty());
  // Mid-run: every EMA keeps its value.
  AlarmMonitor monitor(TestConfig());
  Feed(10, Healthy, &monitor);
  const AlarmMonitorState before = monitor.state();
  broken.step = 11;
  monitor.Observe(broken);
  EXPECT_EQ(monitor.state().kappa_ema, before.kappa_ema);
  EXPECT_EQ(monitor.state().distill_ema, before.distill_ema);
  EXPECT_EQ(monitor.state().reward_ema, before.reward_ema);
  EXPECT_EQ(monitor.state().entropy_ema, before.entropy_ema);
  EXPECT_EQ(monitor.state().distill_history, before.distill_history);
}

}  // namespace
}  // namespace kappa::learner
