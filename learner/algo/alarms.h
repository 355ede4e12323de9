// The failure-mode alarms of docs/algorithms.md §3.3, fed one observation per step.
//   magnitude_drowning    EMA of the applied κ (κ/λ) above kappa_threshold while the L_D EMA is
//                         higher than it was slope_window steps ago
//   directional_conflict  |K_DR|-weighted negative fraction above
//                         conflict_threshold for conflict_window steps running
//   collapse              for collapse_window steps running: reward EMA below
//                         reward_drop_ratio × its best and at least
//                         reward_drop_min below it, or L_D EMA above
//                         distill_rise_factor × its minimum, or entropy EMA
//                         below entropy_floor
//   inference_mismatch    mean |log π_learner − log π_behaviour| on the step's
//                         on-policy tokens above mismatch_threshold for
//                         mismatch_window measured steps running, from the
//                         first step (no warmup: it has no baseline to learn)
// An alarm turns active when its condition holds and clears only after the
// condition has been false for clear_steps steps running (so a noisy series
// near a threshold does not flap); Observe reports an event each time it
// turns active, with the numbers that tripped it.
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kappa::learner {

enum class AlarmKind {
  kMagnitudeDrowning = 0,
  kDirectionalConflict = 1,
  kCollapse = 2,
  kInferenceMismatch = 3,
};
inline constexpr AlarmKind kAllAlarmKinds[] = {AlarmKind::kMagnitudeDrowning,
                                               AlarmKind::kDirectionalConflict,
                                               AlarmKind::kCollapse, AlarmKind::kInferenceMismatch};
inline constexpr int kNumAlarmKinds = static_cast<int>(std::size(kAllAlarmKinds));
const char* AlarmName(AlarmKind kind);  // "magnitude_drowning", ...

struct AlarmConfig {
  double kappa_threshold = 10.0;
  double ema_alpha = 0.1;
  int64_t slope_window = 20;
  // The L_D EMA must have risen by more than this fraction of its value at
  // the window's start: a flat, noisy L_D is not "rising".
  double min_relative_rise = 0.02;
  double conflict_threshold = 0.5;
  int64_t conflict_window = 20;
  int64_t collapse_window = 20;
  double reward_drop_ratio = 0.5;
  double distill_rise_factor = 3.0;
  double entropy_floor = 0.01;
  int64_t warmup_steps = 10;  // observations before any alarm may fire
  int64_t clear_steps = 10;   // condition false this many steps running before an alarm clears
  // collapse: the reward EMA must also be this far below its best (an
  // absolute fall, in reward units): a run that wobbles between 0.02 and
  // 0.10 early on halves its EMA without collapsing (issue 39: the demo,
  // which ends at 0.77 held-out, fell from a best EMA of 0.099 to 0.020).
  double reward_drop_min = 0.15;
  // inference_mismatch: the mean |log π_learner − log π_behaviour| above this
  // (alarms.mismatch_threshold) on this many measured steps running. The
  // window is not a config key: it only rides out a step with few tokens.
  double mismatch_threshold = 0.1;
  int64_t mismatch_window = 3;
};

struct StepObservation {
  int64_t step = 0;
  // The applied ratio ‖g_R′‖/‖s g_D‖ (κ/λ when mixing naively); absent: not measured.
  std::optional<double> kappa;
  std::optional<double> distill_loss;                 // absent: no distillation term
  std::optional<double> kdr_negative_weighted_fraction;  // absent: K_DR not measured
  double reward_mean = 0.0;
  double entropy = 0.0;
  // Mean |log π_learner − log π_behaviour| on the tokens sampled with the
  // version the step updated; absent: no such token this step.
  std::optional<double> inference_mismatch;
};

struct AlarmEvent {
  AlarmKind kind;
  int64_t step = 0;
  std::string message;
  std::vector<std::pair<std::string, double>> values;
};

// Everything AlarmMonitor carries from step to step (its running averages,
// windows, runs and alarm states): what a checkpoint saves so a resumed run
// continues where it stopped instead of warming up again.
struct AlarmMonitorState {
  int64_t observations = 0;
  // EMAs (ema_alpha) of the observed series; absent: never observed.
  std::optional<double> kappa_ema, distill_ema, reward_ema, entropy_ema;
  std::vector<double> distill_history;  // L_D EMA of the last slope_window + 1 steps
  std::optional<double> best_reward_ema, min_distill_ema;
  // Steps running with each condition true.
  int64_t conflict_run = 0, reward_run = 0, distill_run = 0, entropy_run = 0, mismatch_run = 0;
  bool active[kNumAlarmKinds] = {};
  int64_t clear_run[kNumAlarmKinds] = {};  // steps running with the condition false while active
  int64_t fired[kNumAlarmKinds] = {};
};

class AlarmMonitor {
 public:
  explicit AlarmMonitor(AlarmConfig config);

  // Updates the state with one step; returns the alarms that fired (became
  // active) at this step.
  std::vector<AlarmEvent> Observe(const StepObservation& observation);

  bool active(AlarmKind kind) const { return state_.active[static_cast<int>(kind)]; }
  int64_t fired(AlarmKind kind) const { return state_.fired[static_cast<int>(kind)]; }

  const AlarmMonitorState& state() const { return state_; }
  // Continues from `state` (a checkpoint's). A history longer than this
  // config's slope_window + 1 keeps its newest entries. Throws
  // std::invalid_argument naming the field for a negative count.
  void Restore(const AlarmMonitorState& state);

 private:
  std::optional<AlarmEvent> CheckDrowning(const StepObservation& o);
  std::optional<AlarmEvent> CheckConflict(const StepObservation& o);
  std::optional<AlarmEvent> CheckCollapse(const StepObservation& o);
  std::optional<AlarmEvent> CheckMismatch(const StepObservation& o);
  void TrimHistory();

  const AlarmConfig config_;
  AlarmMonitorState state_;
};

}  // namespace kappa::learner
