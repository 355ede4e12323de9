#include "learner/step_config.h"

#include <torch/torch.h>

#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "rollout_worker/rollout_settings.h"

namespace kappa::learner {
namespace {

// *out = parse(value); what the parse throws becomes a status naming `key`.
template <typename T, typename Parse, typename Value>
absl::Status ParseKey(const char* key, Parse parse, const Value& value, T* out) {
  KAPPA_ASSIGN_OR_RETURN(*out, base::CaptureExceptions(absl::StrCat("config key '", key, "'"),
                                                       [&] { return parse(value); }));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HybridStepConfig> MakeHybridStepConfig(const services::Config& config) {
  const services::Config::Trainer& trainer = config.trainer;
  // Not a field of the step, but the learner and `kappa run` both read the
  // trainer keys here: one place refuses it for both.
  if (trainer.max_nonfinite_steps < 1) {
    return absl::InvalidArgumentError("config key 'trainer.max_nonfinite_steps' must be >= 1");
  }
  HybridStepConfig step;
  LossConfig& loss = step.loss;
  KAPPA_RETURN_IF_ERROR(
      ParseKey("trainer.aggregation", ParseAggregation, trainer.aggregation, &loss.aggregation));
  KAPPA_RETURN_IF_ERROR(
      ParseKey("trainer.distill_loss", ParseDistillLoss, trainer.distill_loss, &loss.distill));
  loss.ppo.clip_low = trainer.clip_low;
  loss.ppo.clip_high = trainer.clip_high;
  loss.ppo.dual_clip = trainer.dual_clip;
  loss.distill_topk = trainer.distill_topk;
  loss.lambda = trainer.lambda;
  loss.temperature = config.rollout.temperature > 0 ? config.rollout.temperature : 1.0;
  if (trainer.distill_topk <= 0) {
    return absl::InvalidArgumentError("config key 'trainer.distill_topk' must be > 0");
  }
  if (trainer.teacher_values != "fp32" && trainer.teacher_values != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("config key 'trainer.teacher_values': '",
                                                   trainer.teacher_values,
                                                   "' is neither fp32 nor bf16"));
  }
  if (!(trainer.lambda >= 0) || !(trainer.reward_weight >= 0)) {
    return absl::InvalidArgumentError(
        "config keys 'trainer.lambda' and 'trainer.reward_weight' must be >= 0");
  }
  step.reward_weight = trainer.reward_weight;
  KAPPA_RETURN_IF_ERROR(
      ParseKey("trainer.precision", ParsePrecision, trainer.precision, &step.precision));
  if (trainer.micro_batch_sequences < 0) {
    return absl::InvalidArgumentError(
        "config key 'trainer.micro_batch_sequences' must be >= 0 (0: no micro-batches)");
  }
  step.micro_batch_sequences = trainer.micro_batch_sequences;
  if (trainer.vocab_chunk_positions < 0) {
    return absl::InvalidArgumentError(
        "config key 'trainer.vocab_chunk_positions' must be >= 0 (0: no chunking)");
  }
  loss.vocab_chunk_positions = trainer.vocab_chunk_positions;
  KAPPA_RETURN_IF_ERROR(
      ParseKey("trainer.truncated", ParseTruncatedResponses, trainer.truncated, &step.truncated));
  KAPPA_RETURN_IF_ERROR(ParseKey("trainer.advantage_std", ParseAdvantageStd, trainer.advantage_std,
                                 &step.advantage_std));

  KAPPA_RETURN_IF_ERROR(
      ParseKey("trainer.distill_gate", ParseDistillGate, trainer.distill_gate, &step.gate));
  const services::Config::Rstg& rstg = config.rstg;
  KAPPA_RETURN_IF_ERROR(
      ParseKey("rstg.confidence", ParseRstgConfidence, rstg.confidence, &step.rstg.confidence));
  KAPPA_RETURN_IF_ERROR(ParseKey("rstg.token_selector", ParseRstgTokenScore, rstg.token_selector,
                                 &step.rstg.token_score));
  if (!(rstg.token_frac > 0 && rstg.token_frac <= 1)) {
    return absl::InvalidArgumentError("config key 'rstg.token_frac' must be in (0, 1]");
  }
  step.rstg.token_frac = rstg.token_frac;
  switch (step.rstg.token_score) {
    case RstgConfig::TokenScore::kEntropy:
      step.rstg.threshold = rstg.entropy_threshold;
      break;
    case RstgConfig::TokenScore::kDivergence:
      step.rstg.threshold = rstg.divergence_threshold;
      break;
    case RstgConfig::TokenScore::kUnion:
      if (rstg.entropy_threshold >= 0 || rstg.divergence_threshold >= 0) {
        return absl::InvalidArgumentError(
            "config keys 'rstg.entropy_threshold' / 'rstg.divergence_threshold' compare one "
            "score; 'rstg.token_selector' union ranks both by 'rstg.token_frac'");
      }
      break;
  }
  step.sft_weight = step.gate == DistillGate::kRstg ? rstg.sft_weight : 0.0;

  KAPPA_RETURN_IF_ERROR(ParseKey("trainer.balance", ParseBalance, trainer.balance, &step.balance));
  absl::StatusOr<std::optional<LearningRateSchedule>> lambda_schedule = MakeLambdaSchedule(config);
  if (!lambda_schedule.ok()) return lambda_schedule.status();
  step.lambda_schedule = *lambda_schedule;
  if (step.lambda_schedule && step.balance.adapt) {
    return absl::InvalidArgumentError(
        "config keys 'trainer.lambda_schedule' (cosine) and 'trainer.balance' (m3_adapt) both "
        "move lambda; pick one");
  }
  BalanceConfig& balance = step.balance;
  if (!(trainer.kappa_target > 0)) {
    return absl::InvalidArgumentError("config key 'trainer.kappa_target' must be > 0");
  }
  balance.kappa_target = trainer.kappa_target;
  KAPPA_RETURN_IF_ERROR(
      ParseKey("m3.mask_target", ParseMaskTarget, config.m3.mask_target, &balance.mask_target));
  KAPPA_RETURN_IF_ERROR(ParseKey("m3.mask_estimator", ParseKdrEstimator, config.m3.mask_estimator,
                                 &balance.mask_estimator));
  if (balance.mask_estimator == KdrEstimator::kExact) {
    return absl::InvalidArgumentError(
        "config key 'm3.mask_estimator': must be logit or last_layer");
  }
  if (!(config.m3.mask_temperature >= 0)) {
    return absl::InvalidArgumentError(
        "config key 'm3.mask_temperature' must be >= 0 (0: a hard mask)");
  }
  balance.mask_temperature = config.m3.mask_temperature;
  // Pairs that would run and silently do nothing (docs/algorithms.md §4).
  if (balance.normalize && !(trainer.reward_weight > 0)) {
    return absl::InvalidArgumentError(
        "config keys 'trainer.balance' and 'trainer.reward_weight': m3_norm scales the "
        "distillation gradient to match w_R‖∇L_R‖, which reward_weight 0 makes 0 on every step; "
        "to train on distillation alone use trainer.balance: [naive] with trainer.lambda");
  }
  if (balance.mask && step.gate == DistillGate::kRstg) {
    return absl::InvalidArgumentError(
        "config keys 'trainer.balance' and 'trainer.distill_gate': m3_mask with distill_gate "
        "rstg can only remove reward signal (rstg distils only groups whose rewards are all 0, "
        "where ∇ℓ_R and so K_DR are 0; elsewhere it would drop ℓ_R where nothing is distilled)");
  }
  balance.adapt_config.gain = config.m3.adapt_gain;
  balance.adapt_config.ema = config.m3.adapt_ema;
  balance.adapt_config.max_factor = config.m3.adapt_max_factor;
  balance.adapt_config.lambda_min = config.m3.lambda_min;
  balance.adapt_config.lambda_max = config.m3.lambda_max;

  MonitorConfig& monitor = step.monitor;
  monitor.kappa_every = config.monitor.kappa_every;
  monitor.kdr_every = config.monitor.kdr_every;
  KAPPA_RETURN_IF_ERROR(ParseKey("monitor.kdr_estimator", ParseKdrEstimator,
                                 config.monitor.kdr_estimator, &monitor.kdr_estimator));
  if (monitor.kdr_estimator == KdrEstimator::kExact) {
    return absl::InvalidArgumentError(
        "config key 'monitor.kdr_estimator': must be last_layer or logit (exact runs on sampled "
        "positions: monitor.kdr_exact_every)");
  }
  monitor.kdr_exact_every = config.monitor.kdr_exact_every;
  monitor.kdr_exact_positions = config.monitor.kdr_exact_positions;
  monitor.seed = services::RlSeed(config);
  return step;
}

AlarmConfig MakeAlarmConfig(const services::Config& config) {
  const services::Config::Alarms& a = config.alarms;
  AlarmConfig out;
  out.kappa_threshold = a.kappa_threshold;
  out.ema_alpha = a.ema_alpha;
  out.slope_window = a.slope_window;
  out.min_relative_rise = a.min_relative_rise;
  out.conflict_threshold = a.conflict_threshold;
  out.conflict_window = a.conflict_window;
  out.collapse_window = a.collapse_window;
  out.reward_drop_ratio = a.reward_drop_ratio;
  out.reward_drop_min = a.reward_drop_min;
  out.distill_rise_factor = a.distill_rise_factor;
  out.entropy_floor = a.entropy_floor;
  out.warmup_steps = a.warmup_steps;
  out.clear_steps = a.clear_steps;
  out.mismatch_threshold = a.mismatch_threshold;
  return out;
}

namespace {

// The keys of one warm-up + constant/cosine schedule (the learning rate's,
// λ's) and their values.
struct ScheduleKeys {
  const char* warmup_key;
  int64_t warmup_steps;
  const char* decay_key;
  const std::string& decay;
  const char* min_ratio_key;
  double min_ratio;
};

absl::StatusOr<LearningRateSchedule> MakeSchedule(double peak, const ScheduleKeys& keys,
                                                  int64_t total_steps) {
  LearningRateSchedule schedule;
  schedule.peak = peak;
  if (keys.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", keys.warmup_key, "' must be >= 0"));
  }
  schedule.warmup_steps = keys.warmup_steps;
  if (keys.decay == "constant") {
    schedule.decay = LearningRateSchedule::Decay::kConstant;
  } else if (keys.decay == "cosine") {
    schedule.decay = LearningRateSchedule::Decay::kCosine;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("config key '", keys.decay_key, "': '",
                                                   keys.decay, "' is neither constant nor cosine"));
  }
  if (!(keys.min_ratio >= 0 && keys.min_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", keys.min_ratio_key, "' must be in [0, 1]"));
  }
  schedule.min_ratio = keys.min_ratio;
  schedule.total_steps = total_steps;
  return schedule;
}

}  // namespace

absl::StatusOr<LearningRateSchedule> MakeLearningRateSchedule(const services::Config& config) {
  const services::Config::Trainer& trainer = config.trainer;
  if (!(trainer.lr > 0)) return absl::InvalidArgumentError("config key 'trainer.lr' must be > 0");
  return MakeSchedule(trainer.lr,
                      {"trainer.warmup_steps", trainer.warmup_steps, "trainer.lr_schedule",
                       trainer.lr_schedule, "trainer.min_lr_ratio", trainer.min_lr_ratio},
                      trainer.steps);
}

absl::StatusOr<std::optional<LearningRateSchedule>> MakeLambdaSchedule(
    const services::Config& config) {
  const services::Config::Trainer& trainer = config.trainer;
  absl::StatusOr<LearningRateSchedule> schedule = MakeSchedule(
      trainer.lambda,
      {"trainer.lambda_warmup_steps", trainer.lambda_warmup_steps, "trainer.lambda_schedule",
       trainer.lambda_schedule, "trainer.lambda_min_ratio", trainer.lambda_min_ratio},
      trainer.steps);
  if (!schedule.ok()) return schedule.status();
  if (schedule->decay == LearningRateSchedule::Decay::kConstant) {
    if (trainer.lambda_warmup_steps != 0) {
      return absl::InvalidArgumentError(
          "config key 'trainer.lambda_warmup_steps' needs 'trainer.lambda_schedule: cosine'");
    }
    return std::nullopt;
  }
  return std::optional<LearningRateSchedule>(*schedule);
}

absl::StatusOr<std::optional<tasks::AnswerCorruption>> StudiedCorruption(
    const services::Config& config) {
  const std::string& teacher = config.teacher.bootstrap.corrupt;
  const std::string& student = config.student.bootstrap.corrupt;
  if (!teacher.empty() && !student.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config keys 'teacher.bootstrap.corrupt' ('", teacher,
                     "') and 'student.bootstrap.corrupt' ('", student,
                     "'): the learner reports one corrupted subset; set one of them"));
  }
  return teacher.empty()
             ? tasks::AnswerCorruption::FromConfigKey("student.bootstrap.corrupt", student)
             : tasks::AnswerCorruption::FromConfigKey("teacher.bootstrap.corrupt", teacher);
}

namespace {

// A corruption rule shapes only a bootstrapped model: REQUIRES the user's
// configuration (kappa run fills <role>.checkpoint in with the bootstrapped
// one before it starts the learner).
absl::Status CheckCorruptionIsBootstrapped(const std::string& role, const std::string& corrupt,
                                           const std::string& checkpoint) {
  if (corrupt.empty() || checkpoint.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("config key '", role, ".bootstrap.corrupt' ('",
                                                 corrupt, "') only shapes a bootstrapped ", role,
                                                 ", but ", role, ".checkpoint is set"));
}

}  // namespace

absl::Status ValidateStepConfig(const services::Config& config) {
  if (absl::Status schedule = MakeLearningRateSchedule(config).status(); !schedule.ok()) {
    return schedule;
  }
  if (absl::Status corruption = StudiedCorruption(config).status(); !corruption.ok()) {
    return corruption;
  }
  for (const auto& [role, bootstrap, checkpoint] :
       {std::tuple{"teacher", &config.teacher.bootstrap, &config.teacher.checkpoint},
        std::tuple{"student", &config.student.bootstrap, &config.student.checkpoint}}) {
    if (absl::Status own = CheckCorruptionIsBootstrapped(role, bootstrap->corrupt, *checkpoint);
        !own.ok()) {
      return own;
    }
  }
  if (absl::Status rollout = rollout::ValidateRolloutSettings(config); !rollout.ok())
    return rollout;
  absl::StatusOr<HybridStepConfig> step = MakeHybridStepConfig(config);
  if (!step.ok()) return step.status();
  // The constructors check their bounds.
  return base::CaptureExceptions("", [&] {
    AlarmMonitor alarms(MakeAlarmConfig(config));
    if (step->balance.adapt) {
      LambdaController controller(step->loss.lambda, step->balance.kappa_target,
                                  step->balance.adapt_config);
    }
  });
}

}  // namespace kappa::learner
