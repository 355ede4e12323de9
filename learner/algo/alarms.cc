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

std::vector<AlarmEvent> AlarmMonitor::Observe(const StepObservation& o) {
  ++observations_;
  const double alpha = config_.ema_alpha;
  if (o.kappa) kappa_.Add(*o.kappa, alpha);
  if (o.distill_loss) {
    distill_.Add(*o.distill_loss, alpha);
    distill_history_.push_back(*distill_.value);
    if (static_cast<int64_t>(distill_history_.size()) > config_.slope_window + 1) {
      distill_history_.pop_front();
    }
  }
  reward_.Add(o.reward_mean, alpha);
  entropy_.Add(o.entropy, alpha);

  std::vector<AlarmEvent> events;
  auto update = [&](AlarmKind kind, std::optional<AlarmEvent> tripped) {
    const int k = static_cast<int>(kind);
    if (tripped) {
      if (!active_[k]) {
        ++fired_[k];
        events.push_back(std::move(*tripped));
      }
      active_[k] = true;
      clear_run_[k] = 0;
    } else if (active_[k] && ++clear_run_[k] >= config_.clear_steps) {
      active_[k] = false;
    }
  };
  update(AlarmKind::kMagnitudeDrowning, CheckDrowning(o));
  update(AlarmKind::kDirectionalConflict, CheckConflict(o));
  update(AlarmKind::kCollapse, CheckCollapse(o));
  update(AlarmKind::kInferenceMismatch, CheckMismatch(o));
  return events;
}

std::optional<AlarmEvent> AlarmMonitor::CheckDrowning(const StepObservation& o) {
  if (!kappa_.value || !distill_.value) return std::nullopt;
  const bool window_full =
      static_cast<int64_t>(distill_history_.size()) == config_.slope_window + 1;
  if (observations_ < config_.warmup_steps || !window_full) return std::nullopt;
  const double rise = distill_history_.back() - distill_history_.front();
  const bool rising = rise > config_.min_relative_rise * std::abs(distill_history_.front());
  if (!(*kappa_.value > config_.kappa_threshold && rising)) return std::nullopt;
  return AlarmEvent{AlarmKind::kMagnitudeDrowning, o.step,
                    Format("kappa EMA %.3g > %.3g while the L_D EMA rose by %.3g "
                                    "(%.4g -> %.4g) over %lld steps",
                                    *kappa_.value, config_.kappa_threshold, rise,
                                    distill_history_.front(), distill_history_.back(),
                                    static_cast<long long>(config_.slope_window)),
                    {{"kappa_ema", *kappa_.value},
                     {"kappa_threshold", config_.kappa_threshold},
                     {"distill_loss_ema", distill_history_.back()},
                     {"distill_loss_ema_window_start", distill_history_.front()}}};
}

std::optional<AlarmEvent> AlarmMonitor::CheckConflict(const StepObservation& o) {
  if (!o.kdr_negative_weighted_fraction) {
    // Not measured this step: the alarm keeps its state (no new event).
    if (!active(AlarmKind::kDirectionalConflict)) return std::nullopt;
    return AlarmEvent{AlarmKind::kDirectionalConflict, o.step, "", {}};
  }
  const double fraction = *o.kdr_negative_weighted_fraction;
  conflict_run_ = fraction > config_.conflict_threshold ? conflict_run_ + 1 : 0;
  if (observations_ < config_.warmup_steps || conflict_run_ < config_.conflict_window) {
    return std::nullopt;
  }
  return AlarmEvent{AlarmKind::kDirectionalConflict, o.step,
                    Format("|K_DR|-weighted negative fraction %.3f > %.3f for %lld steps",
                                    fraction, config_.conflict_threshold, static_cast<long long>(conflict_run_)),
                    {{"kdr_negative_weighted_fraction", fraction},
                     {"conflict_threshold", config_.conflict_threshold},
                     {"steps", static_cast<double>(conflict_run_)}}};
}

std::optional<AlarmEvent> AlarmMonitor::CheckCollapse(const StepObservation& o) {
  const double reward = *reward_.value;
  best_reward_ = best_reward_ ? std::max(*best_reward_, reward) : reward;
  const bool reward_low =
      *best_reward_ >= config_.min_reward_for_drop && reward < config_.reward_drop_ratio * *best_reward_;
  reward_run_ = reward_low ? reward_run_ + 1 : 0;

  bool distill_high = false;
  if (distill_.value && o.distill_loss) {
    min_distill_ = min_distill_ ? std::min(*min_distill_, *distill_.value) : *distill_.value;
    distill_high = *min_distill_ > 0 && *distill_.value > config_.distill_rise_factor * *min_distill_;
  }
  distill_run_ = distill_high ? distill_run_ + 1 : 0;

  const double entropy = *entropy_.value;
  entropy_run_ = entropy < config_.entropy_floor ? entropy_run_ + 1 : 0;

  if (observations_ < config_.warmup_steps) return std::nullopt;
  const int64_t w = config_.collapse_window;
  if (reward_run_ >= w) {
    return AlarmEvent{AlarmKind::kCollapse, o.step,
                      Format("reward EMA %.3f below %.2f x its best %.3f for %lld steps",
                                      reward, config_.reward_drop_ratio, *best_reward_, static_cast<long long>(reward_run_)),
                      {{"reward_ema", reward}, {"reward_ema_best", *best_reward_},
                       {"steps", static_cast<double>(reward_run_)}}};
  }
  if (distill_run_ >= w) {
    return AlarmEvent{AlarmKind::kCollapse, o.step,
                      Format("L_D EMA %.4g above %.2f x its minimum %.4g for %lld steps",
                                      *distill_.value, config_.distill_rise_factor, *min_distill_,
                                      static_cast<long long>(distill_run_)),
                      {{"distill_loss_ema", *distill_.value},
                       {"distill_loss_ema_min", *min_distill_},
                       {"steps", static_cast<double>(distill_run_)}}};
  }
  if (entropy_run_ >= w) {
    return AlarmEvent{AlarmKind::kCollapse, o.step,
                      Format("entropy EMA %.4f below the floor %.4f for %lld steps",
                                      entropy, config_.entropy_floor, static_cast<long long>(entropy_run_)),
                      {{"entropy_ema", entropy}, {"entropy_floor", config_.entropy_floor},
                       {"steps", static_cast<double>(entropy_run_)}}};
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
  mismatch_run_ = high ? mismatch_run_ + 1 : 0;
  // No warmup_steps: the mismatch is meaningful from the first step.
  if (mismatch_run_ < config_.mismatch_window) return std::nullopt;
  return AlarmEvent{
      AlarmKind::kInferenceMismatch,
      o.step,
      Format("mean |log pi_learner - log pi_behaviour| %.4g > %.4g on on-policy "
             "tokens for %lld steps (a broken weight sync or sampler?)",
             mismatch, config_.mismatch_threshold, static_cast<long long>(mismatch_run_)),
      {{"mismatch_abs_mean", mismatch},
       {"mismatch_threshold", config_.mismatch_threshold},
       {"steps", static_cast<double>(mismatch_run_)}}};
}

}  // namespace kappa::learner
