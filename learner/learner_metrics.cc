#include "learner/learner_metrics.h"

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <utility>

namespace kappa::learner {
namespace {

using services::metrics::Registry;

// K_DR spans orders of magnitude around 0: symmetric decades, with le="0"
// splitting negative from non-negative.
const std::vector<double>& KdrBuckets() {
  static const std::vector<double> buckets = {-10, -1, -0.1, -0.01, -0.001, 0,
                                              0.001, 0.01, 0.1, 1, 10};
  return buckets;
}

constexpr char kWriteFailuresHelp[] =
    "Writes to the run directory that failed (disk full, I/O error), by what was written.";
constexpr char kStepsSkippedHelp[] =
    "Training steps skipped, nothing applied or published (nonfinite: a loss term or the "
    "gradient norm was NaN or inf; exception: the step threw, its batch was dropped).";

void SetIfFinite(services::metrics::Gauge& gauge, double value) {
  if (std::isfinite(value)) gauge.Set(value);
}

}  // namespace

LearnerMetrics::LearnerMetrics(Registry& registry) : registry_(registry) {
  // Register every alarm kind up front so the series exist (at 0) before
  // anything fires.
  for (AlarmKind kind : kAllAlarmKinds) {
    registry_.GetGauge("kappa_learner_alarm", "1 while the alarm is active, else 0.",
                       {{"kind", AlarmName(kind)}});
    registry_.GetCounter("kappa_learner_alarms_total", "Alarms fired (turned active).",
                         {{"kind", AlarmName(kind)}});
  }
  for (const char* what : {"checkpoint", "metrics_log", "tensorboard"}) {
    registry_.GetCounter("kappa_learner_write_failures_total", kWriteFailuresHelp,
                         {{"what", what}});
  }
  // At 0 from the start, so increase() sees the first skip.
  registry_.GetCounter("kappa_learner_steps_skipped_total", kStepsSkippedHelp,
                       {{"reason", "nonfinite"}});
}

void LearnerMetrics::RecordWriteFailure(const std::string& what) {
  registry_.GetCounter("kappa_learner_write_failures_total", kWriteFailuresHelp, {{"what", what}})
      .Increment();
}

void LearnerMetrics::RecordSkippedStep(const std::string& reason) {
  registry_.GetCounter("kappa_learner_steps_skipped_total", kStepsSkippedHelp, {{"reason", reason}})
      .Increment();
}

void LearnerMetrics::RecordStep(const StepRecord& step) {
  Registry& r = registry_;
  const HybridStepReport& report = step.report;
  const StepStats& s = report.stats;
  r.GetGauge("kappa_learner_step", "Optimizer steps taken.").Set(static_cast<double>(step.step));
  r.GetGauge("kappa_learner_policy_version", "Version of the published policy.")
      .Set(static_cast<double>(step.policy_version));
  if (const auto kappa = s.kappa()) {
    r.GetGauge("kappa_learner_grad_norm_ratio",
               "kappa = |grad L_R| / |grad L_D| at the last measured step.")
        .Set(*kappa);
  }
  if (const auto applied = s.kappa_effective()) {
    r.GetGauge("kappa_learner_applied_grad_norm_ratio",
               "The ratio the update applied: |g_R'| / |s grad L_D| (kappa / lambda when naive).")
        .Set(*applied);
  }
  if (s.measured) {
    const char* help = "Gradient norm of one signal at the last measured step.";
    r.GetGauge("kappa_learner_grad_norm", help, {{"signal", "reward"}}).Set(s.reward_grad_norm);
    r.GetGauge("kappa_learner_grad_norm", help, {{"signal", "distill"}}).Set(s.distill_grad_norm);
    r.GetGauge("kappa_learner_grad_cosine", "cos(grad L_R, grad L_D) at the last measured step.")
        .Set(s.grad_cosine);
  }
  if (report.kdr) {
    SetIfFinite(r.GetGauge("kappa_learner_kdr_negative_ratio",
                           "Share of response positions with K_DR < 0 (last step)."),
                report.kdr->negative_fraction);
    SetIfFinite(r.GetGauge("kappa_learner_kdr_negative_weighted_ratio",
                           "Sum of |K_DR| over negative positions / sum of |K_DR| (last step)."),
                report.kdr->negative_weighted_fraction);
    auto& histogram = r.GetHistogram("kappa_learner_kdr",
                                     "K_DR(n) per response position (cheap estimator).",
                                     KdrBuckets());
    for (float value : report.kdr_values) histogram.Observe(value);
  }
  const char* loss_help = "Loss term of the last step.";
  r.GetGauge("kappa_learner_loss", loss_help, {{"term", "reward"}}).Set(s.reward_loss);
  r.GetGauge("kappa_learner_loss", loss_help, {{"term", "distill"}}).Set(s.distill_loss);
  r.GetGauge("kappa_learner_loss", loss_help, {{"term", "sft"}}).Set(s.sft_loss);
  r.GetGauge("kappa_learner_reward_mean", "Mean verifier reward of the last batch.")
      .Set(step.reward_mean);
  r.GetGauge("kappa_learner_truncated_ratio",
             "Share of the last batch's responses that hit their token budget without a stop.")
      .Set(step.truncated_fraction);
  r.GetGauge("kappa_learner_entropy", "Mean student entropy over response tokens (nats).")
      .Set(report.entropy);
  r.GetGauge("kappa_learner_lambda", "Distillation weight lambda in force.").Set(report.lambda);
  if (report.teacher_tail_mass) {
    const char* help = "Top-k teacher rows: the teacher's mass outside its k ids, last batch.";
    r.GetGauge("kappa_learner_teacher_tail_mass_ratio", help, {{"stat", "mean"}})
        .Set(report.teacher_tail_mass->mean);
    r.GetGauge("kappa_learner_teacher_tail_mass_ratio", help, {{"stat", "p95"}})
        .Set(report.teacher_tail_mass->p95);
  }
  r.GetGauge("kappa_learner_teacher_bytes", "Bytes of the last batch's teacher rows.")
      .Set(static_cast<double>(report.teacher_bytes));
  // Only from steps with on-policy tokens, and only finite values (a gauge
  // exists from its first Set): a step without any leaves the last one.
  const char* mismatch_help =
      "Training-inference mismatch on the last measured step's on-policy tokens: mean "
      "|log pi_learner - log pi_behaviour| (abs_mean) and mean k3 KL (k3).";
  for (const auto& [stat, value] :
       {std::pair{"abs_mean", report.mismatch_abs_mean}, std::pair{"k3", report.mismatch_k3}}) {
    if (value && std::isfinite(*value)) {
      r.GetGauge("kappa_learner_inference_mismatch", mismatch_help, {{"stat", stat}}).Set(*value);
    }
  }
  if (step.eval_accuracy) {
    r.GetGauge("kappa_learner_eval_accuracy_ratio", "Held-out greedy accuracy, last evaluation.")
        .Set(*step.eval_accuracy);
  }
  for (const AlarmEvent& event : step.alarm_events) {
    r.GetCounter("kappa_learner_alarms_total", "Alarms fired (turned active).",
                 {{"kind", AlarmName(event.kind)}})
        .Increment();
  }
  for (size_t k = 0; k < std::size(kAllAlarmKinds); ++k) {
    r.GetGauge("kappa_learner_alarm", "1 while the alarm is active, else 0.",
               {{"kind", AlarmName(kAllAlarmKinds[k])}})
        .Set(step.alarm_active[k] ? 1 : 0);
  }
  auto& staleness = r.GetHistogram("kappa_learner_staleness_versions",
                                   "Policy versions between sampling and training, per group.",
                                   {0, 1, 2, 3, 4, 8});
  for (int64_t versions : step.staleness) staleness.Observe(static_cast<double>(versions));
  r.GetHistogram("kappa_learner_step_seconds", "Wall time of one training step.",
                 {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10})
      .Observe(step.step_seconds);
  r.GetCounter("kappa_learner_tokens_total", "Response tokens trained on.")
      .Increment(static_cast<double>(step.tokens));
}

namespace {
constexpr char kDroppedHelp[] = "Scored groups dropped before training.";
}  // namespace

void LearnerMetrics::RecordInvalidGroups(int64_t total) {
  registry_.GetCounter("kappa_learner_groups_dropped_total", kDroppedHelp, {{"reason", "invalid"}})
      .SetTotal(static_cast<double>(total));
}

constexpr char kGroupsRefusedHelp[] =
    "Groups a worker returned that the learner refused, by reason: malformed (a field), "
    "positions (longer than the student's max_position_embeddings), prompt (not the prompt of "
    "the example leased), policy_version (never published), batch (buffered, but the step "
    "could not build a batch from it).";

void LearnerMetrics::RecordUnbatchableGroup() {
  registry_
      .GetCounter("kappa_learner_groups_refused_total", kGroupsRefusedHelp, {{"reason", "batch"}})
      .Increment();
}

void LearnerMetrics::RecordRefusedGroups(const GroupRefusals& refused) {
  const char* help = kGroupsRefusedHelp;
  const std::pair<const char*, int64_t> reasons[] = {{"malformed", refused.malformed},
                                                     {"positions", refused.positions},
                                                     {"prompt", refused.prompt},
                                                     {"policy_version", refused.policy_version}};
  for (const auto& [reason, total] : reasons) {
    registry_.GetCounter("kappa_learner_groups_refused_total", help, {{"reason", reason}})
        .SetTotal(static_cast<double>(total));
  }
}

void LearnerMetrics::RecordPolicyTraffic(const PolicyTraffic& traffic) {
  Registry& r = registry_;
  const char* sent = "Policy weight bytes sent to rollout workers (chunk data).";
  r.GetCounter("kappa_learner_policy_bytes_sent_total", sent, {{"encoding", "full"}})
      .SetTotal(static_cast<double>(traffic.bytes_full));
  r.GetCounter("kappa_learner_policy_bytes_sent_total", sent, {{"encoding", "delta"}})
      .SetTotal(static_cast<double>(traffic.bytes_delta));
  const char* saved = "Policy weight bytes not sent thanks to an encoding.";
  r.GetCounter("kappa_learner_policy_bytes_saved_total", saved, {{"by", "delta"}})
      .SetTotal(static_cast<double>(traffic.saved_delta));
  r.GetCounter("kappa_learner_policy_bytes_saved_total", saved, {{"by", "bfloat16"}})
      .SetTotal(static_cast<double>(traffic.saved_bfloat16));
  const char* versions = "Policy versions sent to rollout workers (one per worker stream).";
  r.GetCounter("kappa_learner_policy_versions_sent_total", versions, {{"encoding", "full"}})
      .SetTotal(static_cast<double>(traffic.versions_full));
  r.GetCounter("kappa_learner_policy_versions_sent_total", versions, {{"encoding", "delta"}})
      .SetTotal(static_cast<double>(traffic.versions_delta));
  r.GetCounter("kappa_learner_weight_group_versions_total",
               "Policy versions broadcast to the same-host weight group (once for all members).")
      .SetTotal(static_cast<double>(traffic.group_versions));
  r.GetCounter("kappa_learner_weight_group_bytes_total",
               "Tensor bytes of the versions broadcast to the weight group (once, not per member).")
      .SetTotal(static_cast<double>(traffic.group_bytes));
  r.GetCounter("kappa_learner_weight_group_seconds_total",
               "Seconds the learner spent broadcasting versions to the weight group.")
      .SetTotal(traffic.group_seconds);
}

void LearnerMetrics::RecordCoordinator(const CoordinatorCounters& counters) {
  Registry& r = registry_;
  r.GetCounter("kappa_learner_groups_total", "Scored groups accepted from rollout workers.")
      .SetTotal(static_cast<double>(counters.groups_accepted));
  const char* dropped_help = kDroppedHelp;
  r.GetCounter("kappa_learner_groups_dropped_total", dropped_help, {{"reason", "stale"}})
      .SetTotal(static_cast<double>(counters.dropped_stale));
  r.GetCounter("kappa_learner_groups_dropped_total", dropped_help, {{"reason", "duplicate"}})
      .SetTotal(static_cast<double>(counters.dropped_duplicate));
  r.GetCounter("kappa_learner_groups_dropped_total", dropped_help, {{"reason", "unknown_lease"}})
      .SetTotal(static_cast<double>(counters.dropped_unknown_lease));
  r.GetCounter("kappa_learner_leases_reissued_total",
               "Work leases handed out again after they expired or their worker left.")
      .SetTotal(static_cast<double>(counters.leases_reissued));
  r.GetCounter("kappa_learner_leases_renewed_total",
               "Work lease deadlines moved because their worker still works on them.")
      .SetTotal(static_cast<double>(counters.leases_renewed));
  r.GetCounter("kappa_learner_streams_silenced_total",
               "Times a worker stream let a lease expire without a group or renewal; until it "
               "sends one it is leased nothing for a lease timeout, then one lease at a time.")
      .SetTotal(static_cast<double>(counters.streams_silenced));
  r.GetGauge("kappa_learner_buffer_groups", "Scored groups waiting in the buffer.")
      .Set(static_cast<double>(counters.buffered));
  r.GetGauge("kappa_learner_outstanding_leases", "Work leases handed out and not yet returned.")
      .Set(static_cast<double>(counters.outstanding));
}

}  // namespace kappa::learner
