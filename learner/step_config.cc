#include "learner/step_config.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "learner/student_lora.h"
#include "services/rollout_keys.h"

namespace kappa::learner {
namespace {

// The configuration's named choices (parsed and checked when it was loaded)
// as the algorithm's enums.
Aggregation ToStep(services::Aggregation a) {
  switch (a) {
    case services::Aggregation::kTokenMean:
      return Aggregation::kTokenMean;
    case services::Aggregation::kSeqMeanTokenMean:
      return Aggregation::kSeqMeanTokenMean;
    case services::Aggregation::kSeqMeanTokenSum:
      return Aggregation::kSeqMeanTokenSum;
  }
  throw std::logic_error("unreachable");
}

DistillLoss ToStep(services::DistillLoss loss) {
  switch (loss) {
    case services::DistillLoss::kReverseKl:
      return DistillLoss::kReverseKl;
    case services::DistillLoss::kForwardKl:
      return DistillLoss::kForwardKl;
    case services::DistillLoss::kSampledReverseKl:
      return DistillLoss::kSampledReverseKl;
    case services::DistillLoss::kTopkReverseKl:
      return DistillLoss::kTopkReverseKl;
    case services::DistillLoss::kTopkTailReverseKl:
      return DistillLoss::kTopkTailReverseKl;
  }
  throw std::logic_error("unreachable");
}

Precision ToStep(services::Precision precision) {
  switch (precision) {
    case services::Precision::kFloat32:
      return Precision::kFloat32;
    case services::Precision::kBFloat16:
      return Precision::kBFloat16;
  }
  throw std::logic_error("unreachable");
}

TruncatedResponses ToStep(services::TruncatedResponses truncated) {
  switch (truncated) {
    case services::TruncatedResponses::kKeep:
      return TruncatedResponses::kKeep;
    case services::TruncatedResponses::kMask:
      return TruncatedResponses::kMask;
    case services::TruncatedResponses::kZeroReward:
      return TruncatedResponses::kZeroReward;
  }
  throw std::logic_error("unreachable");
}

AdvantageStd ToStep(services::AdvantageStd std_kind) {
  switch (std_kind) {
    case services::AdvantageStd::kPopulation:
      return AdvantageStd::kPopulation;
    case services::AdvantageStd::kSample:
      return AdvantageStd::kSample;
  }
  throw std::logic_error("unreachable");
}

DistillGate ToStep(services::DistillGate gate) {
  switch (gate) {
    case services::DistillGate::kNone:
      return DistillGate::kNone;
    case services::DistillGate::kAll:
      return DistillGate::kAll;
    case services::DistillGate::kRstg:
      return DistillGate::kRstg;
  }
  throw std::logic_error("unreachable");
}

RstgConfig::Confidence ToStep(services::RstgConfidence confidence) {
  switch (confidence) {
    case services::RstgConfidence::kMaxProb:
      return RstgConfig::Confidence::kMaxProb;
    case services::RstgConfidence::kTokenProb:
      return RstgConfig::Confidence::kTokenProb;
  }
  throw std::logic_error("unreachable");
}

RstgConfig::TokenScore ToStep(services::RstgTokenSelector selector) {
  switch (selector) {
    case services::RstgTokenSelector::kEntropy:
      return RstgConfig::TokenScore::kEntropy;
    case services::RstgTokenSelector::kDivergence:
      return RstgConfig::TokenScore::kDivergence;
    case services::RstgTokenSelector::kUnion:
      return RstgConfig::TokenScore::kUnion;
  }
  throw std::logic_error("unreachable");
}

BalanceConfig::MaskTarget ToStep(services::MaskTarget target) {
  switch (target) {
    case services::MaskTarget::kReward:
      return BalanceConfig::MaskTarget::kReward;
    case services::MaskTarget::kDistill:
      return BalanceConfig::MaskTarget::kDistill;
  }
  throw std::logic_error("unreachable");
}

// The configuration offers the cheap estimators only (exact runs on sampled
// positions, monitor.kdr_exact_every), so kExact never comes from it.
KdrEstimator ToStep(services::KdrEstimator estimator) {
  switch (estimator) {
    case services::KdrEstimator::kLastLayer:
      return KdrEstimator::kLastLayer;
    case services::KdrEstimator::kLogit:
      return KdrEstimator::kLogit;
  }
  throw std::logic_error("unreachable");
}

LearningRateSchedule::Decay ToStep(services::Schedule schedule) {
  switch (schedule) {
    case services::Schedule::kConstant:
      return LearningRateSchedule::Decay::kConstant;
    case services::Schedule::kCosine:
      return LearningRateSchedule::Decay::kCosine;
  }
  throw std::logic_error("unreachable");
}

// trainer.balance: [naive] or a combination of the M3 methods. Each name was
// checked at load; what is refused here is a combination: a name twice,
// naive beside another, m3_norm with m3_adapt (both set the scale of g_D).
absl::StatusOr<BalanceConfig> MakeBalance(const std::vector<services::BalanceMethod>& methods) {
  BalanceConfig balance;
  std::set<services::BalanceMethod> seen;
  for (services::BalanceMethod method : methods) {
    const std::string name(services::ChoiceName(method));
    if (!seen.insert(method).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key 'trainer.balance': '", name, "' listed twice"));
    }
    switch (method) {
      case services::BalanceMethod::kNaive:
        break;
      case services::BalanceMethod::kM3Norm:
        balance.normalize = true;
        break;
      case services::BalanceMethod::kM3Mask:
        balance.mask = true;
        break;
      case services::BalanceMethod::kM3Project:
        balance.project = true;
        break;
      case services::BalanceMethod::kM3Adapt:
        balance.adapt = true;
        break;
    }
  }
  if (seen.count(services::BalanceMethod::kNaive) && seen.size() > 1) {
    return absl::InvalidArgumentError(
        "config key 'trainer.balance': 'naive' cannot be combined with M3 methods");
  }
  if (balance.normalize && balance.adapt) {
    return absl::InvalidArgumentError(
        "config key 'trainer.balance': m3_norm and m3_adapt both set the scale of the "
        "distillation gradient; pick one");
  }
  return balance;
}

}  // namespace

// teacher.rows: hidden gives the exact distribution, rebuilt a chunk of
// positions at a time: it feeds the full-distribution losses through the
// chunked head only.
absl::Status CheckHiddenTeacherRows(const services::Config& config) {
  if (config.teacher.rows != services::TeacherRowsForm::kHidden) return absl::OkStatus();
  const services::DistillLoss loss = config.trainer.distill_loss;
  if (loss == services::DistillLoss::kTopkReverseKl ||
      loss == services::DistillLoss::kTopkTailReverseKl) {
    return absl::InvalidArgumentError(
        "config key 'teacher.rows' is hidden (the exact distribution) but "
        "'trainer.distill_loss' is a top-k sketch; use reverse_kl, forward_kl or "
        "sampled_reverse_kl, or teacher.rows: logprobs");
  }
  if (config.trainer.vocab_chunk_positions <= 0) {
    return absl::InvalidArgumentError(
        "config key 'teacher.rows' is hidden, which needs the chunked vocabulary head: set "
        "'trainer.vocab_chunk_positions' > 0 (e.g. 1024)");
  }
  return absl::OkStatus();
}

absl::StatusOr<HybridStepConfig> MakeHybridStepConfig(const services::Config& config) {
  const services::Config::Trainer& trainer = config.trainer;
  // Not a field of the step, but the learner and `kappa run` both read the
  // trainer keys here: one place refuses it for both.
  if (trainer.max_nonfinite_steps < 1) {
    return absl::InvalidArgumentError("config key 'trainer.max_nonfinite_steps' must be >= 1");
  }
  HybridStepConfig step;
  LossConfig& loss = step.loss;
  loss.aggregation = ToStep(trainer.aggregation);
  loss.distill = ToStep(trainer.distill_loss);
  loss.ppo.clip_low = trainer.clip_low;
  loss.ppo.clip_high = trainer.clip_high;
  loss.ppo.dual_clip = trainer.dual_clip;
  loss.distill_topk = trainer.distill_topk;
  loss.lambda = trainer.lambda;
  loss.temperature = config.rollout.temperature > 0 ? config.rollout.temperature : 1.0;
  if (trainer.distill_topk <= 0) {
    return absl::InvalidArgumentError("config key 'trainer.distill_topk' must be > 0");
  }
  if (!(trainer.lambda >= 0) || !(trainer.reward_weight >= 0)) {
    return absl::InvalidArgumentError(
        "config keys 'trainer.lambda' and 'trainer.reward_weight' must be >= 0");
  }
  step.reward_weight = trainer.reward_weight;
  step.precision = ToStep(trainer.precision);
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
  loss.fused_head = trainer.fused_head;
  if (absl::Status hidden = CheckHiddenTeacherRows(config); !hidden.ok()) return hidden;
  step.truncated = ToStep(trainer.truncated);
  step.advantage_std = ToStep(trainer.advantage_std);

  step.gate = ToStep(trainer.distill_gate);
  const services::Config::Rstg& rstg = config.rstg;
  step.rstg.confidence = ToStep(rstg.confidence);
  step.rstg.token_score = ToStep(rstg.token_selector);
  step.rstg.token_frac = rstg.token_frac;
  switch (step.rstg.token_score) {
    case RstgConfig::TokenScore::kEntropy:
      step.rstg.threshold = rstg.entropy_threshold;
      break;
    case RstgConfig::TokenScore::kDivergence:
      step.rstg.threshold = rstg.divergence_threshold;
      break;
    case RstgConfig::TokenScore::kUnion:
      // Either threshold set is a contradiction ValidateHybridStepConfig refuses.
      step.rstg.threshold = std::max(rstg.entropy_threshold, rstg.divergence_threshold);
      break;
  }
  step.sft_weight = step.gate == DistillGate::kRstg ? rstg.sft_weight : 0.0;

  KAPPA_ASSIGN_OR_RETURN(step.balance, MakeBalance(trainer.balance));
  absl::StatusOr<std::optional<LearningRateSchedule>> lambda_schedule = MakeLambdaSchedule(config);
  if (!lambda_schedule.ok()) return lambda_schedule.status();
  step.lambda_schedule = *lambda_schedule;
  BalanceConfig& balance = step.balance;
  if (!(trainer.kappa_target > 0)) {
    return absl::InvalidArgumentError("config key 'trainer.kappa_target' must be > 0");
  }
  balance.kappa_target = trainer.kappa_target;
  balance.mask_target = ToStep(config.m3.mask_target);
  balance.mask_estimator = ToStep(config.m3.mask_estimator);
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
  monitor.kdr_estimator = ToStep(config.monitor.kdr_estimator);
  monitor.kdr_exact_every = config.monitor.kdr_exact_every;
  monitor.kdr_exact_positions = config.monitor.kdr_exact_positions;
  monitor.seed = services::RlSeed(config);
  // The pairs of settings that contradict each other: one check, the
  // algorithm's, also run by HybridStep's constructor.
  KAPPA_RETURN_IF_ERROR(base::CaptureExceptions(
      "config", [&] { ValidateHybridStepConfig(step); }, absl::StatusCode::kInvalidArgument));
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
  services::Schedule decay;
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
  schedule.decay = ToStep(keys.decay);
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
                      {"trainer.warmup_steps", trainer.warmup_steps, trainer.lr_schedule,
                       "trainer.min_lr_ratio", trainer.min_lr_ratio},
                      trainer.steps);
}

absl::StatusOr<std::optional<LearningRateSchedule>> MakeLambdaSchedule(
    const services::Config& config) {
  const services::Config::Trainer& trainer = config.trainer;
  absl::StatusOr<LearningRateSchedule> schedule =
      MakeSchedule(trainer.lambda,
                   {"trainer.lambda_warmup_steps", trainer.lambda_warmup_steps,
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
  if (absl::Status rollout = services::ValidateRolloutKeys(config); !rollout.ok()) return rollout;
  if (absl::Status lora = StudentLoraConfig(config).status(); !lora.ok()) return lora;
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
