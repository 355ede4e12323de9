#include "learner/step_record.h"

#include <cmath>

namespace kappa::learner {
namespace {

nlohmann::json NumberOrNull(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

template <typename Container>
nlohmann::json Numbers(const Container& values) {
  nlohmann::json out = nlohmann::json::array();
  for (double v : values) out.push_back(NumberOrNull(v));
  return out;
}

void AddKdr(const KdrSummary& kdr, const char* prefix, nlohmann::json& record) {
  const std::string p = prefix;
  record[p + "_positions"] = kdr.positions;
  record[p + "_mean"] = NumberOrNull(kdr.mean);
  record[p + "_negative_fraction"] = NumberOrNull(kdr.negative_fraction);
  record[p + "_negative_weighted_fraction"] = NumberOrNull(kdr.negative_weighted_fraction);
  record[p + "_quantiles"] = Numbers(kdr.quantiles);
}

}  // namespace

void AddStepReport(const HybridStepReport& report, nlohmann::json& record) {
  const StepStats& s = report.stats;
  record["loss_reward"] = s.reward_loss;
  record["loss_distill"] = s.distill_loss;
  record["loss_sft"] = s.sft_loss;
  record["entropy"] = report.entropy;
  record["clip_fraction"] = report.clip_fraction;
  record["approx_kl"] = report.approx_kl;
  record["grad_norm"] = s.grad_norm;
  record["lr"] = s.lr;
  record["lambda"] = report.lambda;
  record["distill_scale"] = s.distill_scale;
  const auto kappa = s.kappa();
  record["kappa"] = kappa ? nlohmann::json(*kappa) : nlohmann::json(nullptr);
  const auto kappa_effective = s.kappa_effective();
  record["kappa_effective"] =
      kappa_effective ? nlohmann::json(*kappa_effective) : nlohmann::json(nullptr);
  if (s.measured) {
    record["grad_norm_reward"] = s.reward_grad_norm;
    record["grad_norm_distill"] = s.distill_grad_norm;
    record["grad_cosine"] = s.grad_cosine;
    record["grad_norm_reward_balanced"] = s.balanced_reward_grad_norm;
    record["projected"] = s.projected;
  } else {
    for (const char* key : {"grad_norm_reward", "grad_norm_distill", "grad_cosine"}) {
      record[key] = nullptr;
    }
  }
  if (report.kdr) {
    AddKdr(*report.kdr, "kdr", record);
    record["kdr_position_mean"] = Numbers(report.kdr->position_mean);
  }
  if (report.kdr_exact) {
    AddKdr(*report.kdr_exact, "kdr_exact", record);
    record["kdr_exact_seconds"] = report.exact_seconds;
    record["kdr_sign_agreement_logit"] = NumberOrNull(report.agreement_logit.value_or(NAN));
    record["kdr_sign_agreement_last_layer"] =
        NumberOrNull(report.agreement_last_layer.value_or(NAN));
  }
  record["distill_positions"] = report.distill_positions;
  record["rstg_gated_groups"] = report.gated_groups;
  record["m3_masked_positions"] = report.masked_positions;
  record["demonstrations"] = report.demonstrations;
}

void AddAlarms(const std::vector<AlarmEvent>& events, const AlarmMonitor& monitor,
               nlohmann::json& record) {
  if (!events.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const AlarmEvent& e : events) {
      nlohmann::json values = nlohmann::json::object();
      for (const auto& [name, value] : e.values) values[name] = NumberOrNull(value);
      list.push_back({{"kind", AlarmName(e.kind)},
                      {"step", e.step},
                      {"message", e.message},
                      {"values", std::move(values)}});
    }
    record["alarms"] = std::move(list);
  }
  nlohmann::json active = nlohmann::json::object();
  for (AlarmKind kind : kAllAlarmKinds) active[AlarmName(kind)] = monitor.active(kind) ? 1 : 0;
  record["alarm_active"] = std::move(active);
}

StepObservation ObservationOf(int64_t step, const HybridStepReport& report, double reward_mean,
                              bool has_distill) {
  StepObservation o;
  o.step = step;
  // Drowning is judged on the ratio the update applied (κ/λ under naive
  // mixing), so a small λ trips it; DESIGN.md §4 states it for raw κ (λ = 1).
  o.kappa = report.stats.kappa_effective();
  if (has_distill) o.distill_loss = report.stats.distill_loss;
  if (report.kdr) o.kdr_negative_weighted_fraction = report.kdr->negative_weighted_fraction;
  o.reward_mean = reward_mean;
  o.entropy = report.entropy;
  return o;
}

}  // namespace kappa::learner
