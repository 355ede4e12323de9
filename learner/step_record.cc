#include "learner/step_record.h"

#include <torch/torch.h>

#include <cmath>
#include <numeric>

#include "learner/metrics_schema.h"

namespace kappa::learner {
namespace keys = metrics_jsonl;
namespace {

nlohmann::json NumberOrNull(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

nlohmann::json NumberOrNull(const std::optional<double>& value) {
  return value ? NumberOrNull(*value) : nlohmann::json(nullptr);
}

template <typename Container>
nlohmann::json Numbers(const Container& values) {
  nlohmann::json out = nlohmann::json::array();
  for (double v : values) out.push_back(NumberOrNull(v));
  return out;
}

// The keys one KdrSummary fills, for the cheap estimator or the exact one.
struct KdrKeys {
  const char* positions;
  const char* mean;
  const char* negative_fraction;
  const char* negative_weighted_fraction;
  const char* quantiles;
};
constexpr KdrKeys kCheapKdr = {keys::kKdrPositions, keys::kKdrMean, keys::kKdrNegativeFraction,
                               keys::kKdrNegativeWeightedFraction, keys::kKdrQuantiles};
constexpr KdrKeys kExactKdr = {keys::kKdrExactPositions, keys::kKdrExactMean,
                               keys::kKdrExactNegativeFraction,
                               keys::kKdrExactNegativeWeightedFraction, keys::kKdrExactQuantiles};

void AddKdr(const KdrSummary& kdr, const KdrKeys& names, nlohmann::json& line) {
  line[names.positions] = kdr.positions;
  line[names.mean] = NumberOrNull(kdr.mean);
  line[names.negative_fraction] = NumberOrNull(kdr.negative_fraction);
  line[names.negative_weighted_fraction] = NumberOrNull(kdr.negative_weighted_fraction);
  line[names.quantiles] = Numbers(kdr.quantiles);
}

void AddBatch(const StepRecord& record, nlohmann::json& line) {
  line[keys::kRewardMean] = record.reward_mean;
  line[keys::kTruncatedFraction] = record.truncated_fraction;
  line[keys::kSamples] = record.samples;
  line[keys::kTokens] = record.tokens;
  line[keys::kSamplesPerSecond] = record.samples_per_second();
  line[keys::kStalenessMean] = record.staleness_mean();
  const CoordinatorCounters& c = record.counters;
  line[keys::kGroupsAccepted] = c.groups_accepted;
  line[keys::kGroupsConsumed] = c.groups_consumed;
  line[keys::kGroupsDroppedStale] = c.dropped_stale;
  line[keys::kGroupsDroppedDuplicate] = c.dropped_duplicate;
  line[keys::kGroupsDroppedUnknownLease] = c.dropped_unknown_lease;
  line[keys::kLeasesReissued] = c.leases_reissued;
  line[keys::kBufferGroups] = c.buffered;
  line[keys::kStepSeconds] = record.step_seconds;
  line[keys::kElapsedSeconds] = record.elapsed_seconds;
  line[keys::kLeaseIds] = record.lease_ids;
  line[keys::kGroupVersions] = record.group_versions;
}

void AddOptimizer(const HybridStepReport& report, nlohmann::json& line) {
  const StepStats& s = report.stats;
  line[keys::kLossReward] = s.reward_loss;
  line[keys::kLossDistill] = s.distill_loss;
  line[keys::kLossSft] = s.sft_loss;
  line[keys::kEntropy] = report.entropy;
  line[keys::kClipFraction] = report.clip_fraction;
  line[keys::kApproxKl] = report.approx_kl;
  line[keys::kGradNorm] = s.grad_norm;
  line[keys::kLr] = s.lr;
  line[keys::kLambda] = report.lambda;
  line[keys::kDistillScale] = s.distill_scale;
  line[keys::kKappa] = NumberOrNull(s.kappa());
  line[keys::kKappaEffective] = NumberOrNull(s.kappa_effective());
  if (s.measured) {
    line[keys::kGradNormReward] = s.reward_grad_norm;
    line[keys::kGradNormDistill] = s.distill_grad_norm;
    line[keys::kGradCosine] = s.grad_cosine;
    line[keys::kGradNormRewardBalanced] = s.balanced_reward_grad_norm;
    line[keys::kProjected] = s.projected;
  } else {
    for (const char* key : {keys::kGradNormReward, keys::kGradNormDistill, keys::kGradCosine}) {
      line[key] = nullptr;
    }
  }
}

void AddMonitors(const HybridStepReport& report, nlohmann::json& line) {
  if (report.kdr) {
    AddKdr(*report.kdr, kCheapKdr, line);
    line[keys::kKdrPositionMean] = Numbers(report.kdr->position_mean);
  }
  if (report.kdr_exact) {
    AddKdr(*report.kdr_exact, kExactKdr, line);
    line[keys::kKdrExactSeconds] = report.exact_seconds;
    line[keys::kKdrSignAgreementLogit] = NumberOrNull(report.agreement_logit);
    line[keys::kKdrSignAgreementLastLayer] = NumberOrNull(report.agreement_last_layer);
  }
  line[keys::kDistillPositions] = report.distill_positions;
  line[keys::kRstgGatedGroups] = report.gated_groups;
  line[keys::kM3MaskedPositions] = report.masked_positions;
  line[keys::kDemonstrations] = report.demonstrations;
  const std::optional<TailMass>& tail = report.teacher_tail_mass;
  line[keys::kTeacherTailMassMean] = tail ? nlohmann::json(tail->mean) : nlohmann::json(nullptr);
  line[keys::kTeacherTailMassP95] = tail ? nlohmann::json(tail->p95) : nlohmann::json(nullptr);
  line[keys::kTeacherBytes] = report.teacher_bytes;
  line[keys::kMismatchAbsMean] = NumberOrNull(report.mismatch_abs_mean);
  line[keys::kMismatchK3] = NumberOrNull(report.mismatch_k3);
  line[keys::kMismatchTokens] = report.mismatch_tokens;
}

// The by-subset keys, written only when a subset is configured.
void AddSubsets(const StepRecord& record, nlohmann::json& line) {
  if (!record.kdr_by_subset.empty()) {
    nlohmann::json mean = nlohmann::json::object(), negative = nlohmann::json::object(),
                   positions = nlohmann::json::object(), token_mean = nlohmann::json::object();
    for (const auto& [name, kdr] : record.kdr_by_subset) {
      mean[name] = NumberOrNull(kdr.mean);
      negative[name] = NumberOrNull(kdr.negative_fraction);
      positions[name] = kdr.positions;
      nlohmann::json per_token = nlohmann::json::array();
      for (const std::optional<double>& k : kdr.token_mean) per_token.push_back(NumberOrNull(k));
      token_mean[name] = std::move(per_token);
    }
    line[keys::kKdrMeanBySubset] = std::move(mean);
    line[keys::kKdrNegativeFractionBySubset] = std::move(negative);
    line[keys::kKdrPositionsBySubset] = std::move(positions);
    line[keys::kKdrTokenMeanBySubset] = std::move(token_mean);
  }
  if (!record.eval_accuracy_by_subset.empty()) {
    line[keys::kEvalAccuracyBySubset] = record.eval_accuracy_by_subset;
  }
}

void AddAlarms(const StepRecord& record, nlohmann::json& line) {
  if (!record.alarm_events.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const AlarmEvent& e : record.alarm_events) {
      nlohmann::json values = nlohmann::json::object();
      for (const auto& [name, value] : e.values) values[name] = NumberOrNull(value);
      list.push_back({{"kind", AlarmName(e.kind)},
                      {"step", e.step},
                      {"message", e.message},
                      {"values", std::move(values)}});
    }
    line[keys::kAlarms] = std::move(list);
  }
  nlohmann::json active = nlohmann::json::object();
  for (size_t k = 0; k < std::size(kAllAlarmKinds); ++k) {
    active[AlarmName(kAllAlarmKinds[k])] = record.alarm_active[k] ? 1 : 0;
  }
  line[keys::kAlarmActive] = std::move(active);
}

}  // namespace

double StepRecord::samples_per_second() const {
  return interval_seconds > 0 ? static_cast<double>(samples) / interval_seconds : 0.0;
}

double StepRecord::staleness_mean() const {
  if (staleness.empty()) return 0.0;
  return static_cast<double>(std::accumulate(staleness.begin(), staleness.end(), int64_t{0})) /
         static_cast<double>(staleness.size());
}

StepObservation ObservationOf(const StepRecord& record) {
  const HybridStepReport& report = record.report;
  StepObservation o;
  o.step = record.step;
  // Drowning is judged on the ratio the update applied (κ/λ under naive
  // mixing), so a small λ trips it; the papers state it for raw κ (λ = 1).
  // docs/algorithms.md §3.3.
  o.kappa = report.stats.kappa_effective();
  if (report.distill_positions > 0) o.distill_loss = report.stats.distill_loss;
  if (report.kdr) o.kdr_negative_weighted_fraction = report.kdr->negative_weighted_fraction;
  o.reward_mean = record.reward_mean;
  o.entropy = report.entropy;
  o.inference_mismatch = report.mismatch_abs_mean;
  return o;
}

nlohmann::json ToJson(const StepRecord& record) {
  nlohmann::json line = {{keys::kStep, record.step}, {keys::kPolicyVersion, record.policy_version}};
  AddBatch(record, line);
  AddOptimizer(record.report, line);
  AddMonitors(record.report, line);
  AddAlarms(record, line);
  if (record.eval_accuracy) line[keys::kEvalAccuracy] = *record.eval_accuracy;
  AddSubsets(record, line);
  return line;
}

nlohmann::json EvaluationJson(int64_t step, int64_t policy_version, double eval_accuracy,
                              const std::map<std::string, double>& accuracy_by_subset) {
  nlohmann::json line = {{keys::kStep, step},
                         {keys::kPolicyVersion, policy_version},
                         {keys::kEvalAccuracy, eval_accuracy},
                         {keys::kElapsedSeconds, 0.0}};
  if (!accuracy_by_subset.empty()) line[keys::kEvalAccuracyBySubset] = accuracy_by_subset;
  return line;
}

}  // namespace kappa::learner
