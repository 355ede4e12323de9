#include "learner/algo/alarms.h"

#include <cmath>
#include <stdexcept>

#include <algorithm>
#include <cstdarg>
#include <cstdio>

namespace kappa::learner {
namespace {

// printf into a std::string (the algorithm code links libtorch only).
std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return buffer;
}

// The EMA `ema` after one more value x (x itself when it had none). A NaN or
// ±inf x is dropped, so an EMA (and a checkpoint of it) never holds one.
// Returns whether x was taken.
bool AddToEma(std::optional<double>& ema, double x, double alpha) {
  if (!std::isfinite(x)) return false;
  ema = ema ? (1 - alpha) * *ema + alpha * x : x;
  return true;
}

}  // namespace

const char* AlarmName(AlarmKind kind) {
  switch (kind) {
    case AlarmKind::kMagnitudeDrowning: return "magnitude_drowning";
    case AlarmKind::kDirectionalConflict: return "directional_conflict";
    case AlarmKind::kCollapse: return "collapse";
    case AlarmKind::kInferenceMismatch:
      return "inference_mismatch";
  }
  return "unknown";
}

AlarmMonitor::AlarmMonitor(AlarmConfig config) : config_(config) {
  if (!(config_.ema_alpha > 0 && config_.ema_alpha <= 1) || config_.slope_window < 1 ||
      config_.conflict_window < 1 || config_.collapse_window < 1 || config_.clear_steps < 1 ||
      !(config_.min_relative_rise >= 0) || !(config_.mismatch_threshold >= 0) ||
      config_.mismatch_window < 1) {
    throw std::invalid_argument(
        "alarms: need 0 < ema_alpha <= 1, min_relative_rise >= 0, mismatch_threshold >= 0 and "
        "slope_window, conflict_window, collapse_window, clear_steps, mismatch_window >= 1");
  }
}

void AlarmMonitor::TrimHistory() {
  std::vector<double>& history = state_.distill_history;
  const auto keep = static_cast<size_t>(config_.slope_window + 1);
  if (history.size() > keep) history.erase(history.begin(), history.end() - keep);
}

void AlarmMonitor::Restore(const AlarmMonitorState& state) {
  const AlarmMonitorState& s = state;
  auto negative = [&](int64_t value, const char* field) {
    if (value < 0) {
      throw std::invalid_argument(
          Format("alarm state: %s is negative (%lld)", field, static_cast<long long>(value)));
    }
  };
  negative(s.observations, "observations");
  negative(s.conflict_run, "conflict_run");
  negative(s.reward_run, "reward_run");
  negative(s.distill_run, "distill_run");
  negative(s.entropy_run, "entropy_run");
  negative(s.mismatch_run, "mismatch_run");
  for (int k = 0; k < kNumAlarmKinds; ++k) {
    negative(s.clear_run[k], "clear_run");
    negative(s.fired[k], "fired");
  }
  state_ = state;
  TrimHistory();
}

std::vector<AlarmEvent> AlarmMonitor::Observe(const StepObservation& o) {
  AlarmMonitorState& s = state_;
  ++s.observations;
  const double alpha = config_.ema_alpha;
  if (o.kappa) AddToEma(s.kappa_ema, *o.kappa, alpha);
  if (o.distill_loss && AddToEma(s.distill_ema, *o.distill_loss, alpha)) {
    s.distill_history.push_back(*s.distill_ema);
    TrimHistory();
  }
  AddToEma(s.reward_ema, o.reward_mean, alpha);
  AddToEma(s.entropy_ema, o.entropy, alpha);

  std::vector<AlarmEvent> events;
  auto update = [&](AlarmKind kind, std::optional<AlarmEvent> tripped) {
    const int k = static_cast<int>(kind);
    if (tripped) {
      if (!s.active[k]) {
        ++s.fired[k];
        events.push_back(std::move(*tripped));
      }
      s.active[k] = true;
      s.clear_run[k] = 0;
    } else if (s.active[k] && ++s.clear_run[k] >= config_.clear_steps) {
      s.active[k] = false;
    }
  };
  update(AlarmKind::kMagnitudeDrowning, CheckDrowning(o));
  update(AlarmKind::kDirectionalConflict, CheckConflict(o));
  update(AlarmKind::kCollapse, CheckCollapse(o));
  update(AlarmKind::kInferenceMismatch, CheckMismatch(o));
  return events;
}

std::optional<AlarmEvent> AlarmMonitor::CheckDrowning(const StepObservation& o) {
  const AlarmMonitorState& s = state_;
  if (!s.kappa_ema || !s.distill_ema) return std::nullopt;
  const std::vector<double>& history = s.distill_history;
  const bool window_full = static_cast<int64_t>(history.size()) == config_.slope_window + 1;
  if (s.observations < config_.warmup_steps || !window_full) return std::nullopt;
  const double rise = history.back() - history.front();
  const bool rising = rise > config_.min_relative_rise * std::abs(history.front());
  if (!(*s.kappa_ema > config_.kappa_threshold && rising)) return std::nullopt;
  return AlarmEvent{AlarmKind::kMagnitudeDrowning,
                    o.step,
                    Format("kappa EMA %.3g > %.3g while the L_D EMA rose by %.3g "
                           "(%.4g -> %.4g) over %lld steps",
                           *s.kappa_ema, config_.kappa_threshold, rise, history.front(),
                           history.back(), static_cast<long long>(config_.slope_window)),
                    {{"kappa_ema", *s.kappa_ema},
                     {"kappa_threshold", config_.kappa_threshold},
                     {"distill_loss_ema", history.back()},
                     {"distill_loss_ema_window_start", history.front()}}};
}

std::optional<AlarmEvent> AlarmMonitor::CheckConflict(const StepObservation& o) {
  if (!o.kdr_negative_weighted_fraction) {
    // Not measured this step: the alarm keeps its state (no new event).
    if (!active(AlarmKind::kDirectionalConflict)) return std::nullopt;
    return AlarmEvent{AlarmKind::kDirectionalConflict, o.step, "", {}};
  }
  const double fraction = *o.kdr_negative_weighted_fraction;
  int64_t& run = state_.conflict_run;
  run = fraction > config_.conflict_threshold ? run + 1 : 0;
  if (state_.observations < config_.warmup_steps || run < config_.conflict_window) {
    return std::nullopt;
  }
  return AlarmEvent{AlarmKind::kDirectionalConflict,
                    o.step,
                    Format("|K_DR|-weighted negative fraction %.3f > %.3f for %lld steps", fraction,
                           config_.conflict_threshold, static_cast<long long>(run)),
                    {{"kdr_negative_weighted_fraction", fraction},
                     {"conflict_threshold", config_.conflict_threshold},
                     {"steps", static_cast<double>(run)}}};
}

std::optional<AlarmEvent> AlarmMonitor::CheckCollapse(const StepObservation& o) {
  AlarmMonitorState& s = state_;
  if (!s.reward_ema || !s.entropy_ema) return std::nullopt;  // no finite value yet
  const double reward = *s.reward_ema;
  s.best_reward_ema = s.best_reward_ema ? std::max(*s.best_reward_ema, reward) : reward;
  const double best = *s.best_reward_ema;
  const bool reward_low =
      reward < config_.reward_drop_ratio * best && best - reward >= config_.reward_drop_min;
  s.reward_run = reward_low ? s.reward_run + 1 : 0;

  bool distill_high = false;
  if (s.distill_ema && o.distill_loss) {
    s.min_distill_ema =
        s.min_distill_ema ? std::min(*s.min_distill_ema, *s.distill_ema) : *s.distill_ema;
    distill_high =
        *s.min_distill_ema > 0 && *s.distill_ema > config_.distill_rise_factor * *s.min_distill_ema;
  }
  s.distill_run = distill_high ? s.distill_run + 1 : 0;

  const double entropy = *s.entropy_ema;
  s.entropy_run = entropy < config_.entropy_floor ? s.entropy_run + 1 : 0;

  if (s.observations < config_.warmup_steps) return std::nullopt;
  const int64_t w = config_.collapse_window;
  if (s.reward_run >= w) {
    return AlarmEvent{AlarmKind::kCollapse,
                      o.step,
                      Format("reward EMA %.3f below %.2f x its best %.3f (a fall of %.3f >= %.3f) "
                             "for %lld steps",
                             reward, config_.reward_drop_ratio, best, best - reward,
                             config_.reward_drop_min, static_cast<long long>(s.reward_run)),
                      {{"reward_ema", reward},
                       {"reward_ema_best", best},
                       {"steps", static_cast<double>(s.reward_run)}}};
  }
  if (s.distill_run >= w) {
    return AlarmEvent{AlarmKind::kCollapse,
                      o.step,
                      Format("L_D EMA %.4g above %.2f x its minimum %.4g for %lld steps",
                             *s.distill_ema, config_.distill_rise_factor, *s.min_distill_ema,
                             static_cast<long long>(s.distill_run)),
                      {{"distill_loss_ema", *s.distill_ema},
                       {"distill_loss_ema_min", *s.min_distill_ema},
                       {"steps", static_cast<double>(s.distill_run)}}};
  }
  if (s.entropy_run >= w) {
    return AlarmEvent{AlarmKind::kCollapse,
                      o.step,
                      Format("entropy EMA %.4f below the floor %.4f for %lld steps", entropy,
                             config_.entropy_floor, static_cast<long long>(s.entropy_run)),
                      {{"entropy_ema", entropy},
                       {"entropy_floor", config_.entropy_floor},
                       {"steps", static_cast<double>(s.entropy_run)}}};
  }
  return std::nullopt;
}

std::optional<AlarmEvent> AlarmMonitor::CheckMismatch(const StepObservation& o) {
  if (!o.inference_mismatch) {
    // No on-policy token this step: the alarm keeps its state (no new event).
    if (!active(AlarmKind::kInferenceMismatch)) return std::nullopt;
    return AlarmEvent{AlarmKind::kInferenceMismatch, o.step, "", {}};
  }
  const double mismatch = *o.inference_mismatch;
  // NaN counts as above: a broken log-prob is a broken sync too.
  const bool high = !(mismatch <= config_.mismatch_threshold);
  int64_t& run = state_.mismatch_run;
  run = high ? run + 1 : 0;
  // No warmup_steps: the mismatch is meaningful from the first step.
  if (run < config_.mismatch_window) return std::nullopt;
  return AlarmEvent{AlarmKind::kInferenceMismatch,
                    o.step,
                    Format("mean |log pi_learner - log pi_behaviour| %.4g > %.4g on on-policy "
                           "tokens for %lld steps (a broken weight sync or sampler?)",
                           mismatch, config_.mismatch_threshold, static_cast<long long>(run)),
                    {{"mismatch_abs_mean", mismatch},
                     {"mismatch_threshold", config_.mismatch_threshold},
                     {"steps", static_cast<double>(run)}}};
}

}  // namespace kappa::learner
