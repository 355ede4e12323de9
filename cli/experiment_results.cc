#include "cli/experiment_results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "learner/metrics_schema.h"

namespace kappa::cli {
namespace {

constexpr const char* kMissing = "–";

std::optional<double> NumberAt(const nlohmann::json& record, const char* key) {
  auto it = record.find(key);
  if (it == record.end() || !it->is_number()) return std::nullopt;
  const double value = it->get<double>();
  if (!std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<int64_t> IntegerAt(const nlohmann::json& record, const char* key) {
  auto it = record.find(key);
  if (it == record.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

double Mean(const std::vector<double>& values, size_t begin, size_t end) {
  double sum = 0.0;
  for (size_t i = begin; i < end; ++i) sum += values[i];
  return sum / static_cast<double>(end - begin);
}

// Median over the steps of `key`, skipping steps without a number.
std::optional<double> MedianOf(const std::vector<nlohmann::json>& steps, const char* key) {
  std::vector<double> values;
  for (const nlohmann::json& record : steps) {
    if (std::optional<double> v = NumberAt(record, key)) values.push_back(*v);
  }
  return Median(std::move(values));
}

// Median cos(∇L_R, ∇L_D) over the steps where both gradients were measured
// and non-zero: the learner writes 0 where either is zero (GRPO alone, a
// step with nothing distilled), and an undefined angle is not a right one.
std::optional<double> GradCosineMedian(const std::vector<nlohmann::json>& steps) {
  std::vector<double> values;
  for (const nlohmann::json& record : steps) {
    const std::optional<double> reward = NumberAt(record, metrics_jsonl::kGradNormReward);
    const std::optional<double> distill = NumberAt(record, metrics_jsonl::kGradNormDistill);
    const std::optional<double> cosine = NumberAt(record, metrics_jsonl::kGradCosine);
    if (reward > 0.0 && distill > 0.0 && cosine) values.push_back(*cosine);
  }
  return Median(std::move(values));
}

// The per-subset fields (metrics_jsonl::k*BySubset, docs/metrics.md) are
// objects {"<subset>": number or null, ..., "rest": ...}.
constexpr char kRestSubset[] = "rest";

const nlohmann::json* ObjectAt(const nlohmann::json& record, const char* key) {
  auto it = record.find(key);
  if (it == record.end() || !it->is_object()) return nullptr;
  return &*it;
}

// Per subset named in any step's `key` object, the median of its numbers
// over the steps (unset when it never had one).
// Per subset, the finite values of `key` over the first `count` of `steps`
// (a subset named only with nulls maps to an empty list).
std::map<std::string, std::vector<double>> SubsetSeries(const std::vector<nlohmann::json>& steps,
                                                        const char* key, size_t count) {
  std::map<std::string, std::vector<double>> values;
  for (size_t i = 0; i < std::min(count, steps.size()); ++i) {
    const nlohmann::json& record = steps[i];
    const nlohmann::json* by_subset = ObjectAt(record, key);
    if (by_subset == nullptr) continue;
    for (const auto& [subset, value] : by_subset->items()) {
      std::vector<double>& of_subset = values[subset];
      if (value.is_number() && std::isfinite(value.get<double>())) {
        of_subset.push_back(value.get<double>());
      }
    }
  }
  return values;
}

std::map<std::string, std::optional<double>> SubsetMedians(const std::vector<nlohmann::json>& steps,
                                                           const char* key) {
  std::map<std::string, std::optional<double>> medians;
  for (auto& [subset, of_subset] : SubsetSeries(steps, key, steps.size())) {
    medians[subset] = Median(std::move(of_subset));
  }
  return medians;
}

// Per subset, the mean of the finite values of `key` over the first `count`
// of `steps`.
std::map<std::string, std::optional<double>> SubsetMeans(const std::vector<nlohmann::json>& steps,
                                                         const char* key, size_t count) {
  std::map<std::string, std::optional<double>> means;
  for (const auto& [subset, of_subset] : SubsetSeries(steps, key, count)) {
    means[subset] = of_subset.empty() ? std::nullopt
                                      : std::optional<double>(Mean(of_subset, 0, of_subset.size()));
  }
  return means;
}

// The values of the object, null (or not a finite number) as unset.
std::map<std::string, std::optional<double>> SubsetValues(const nlohmann::json& by_subset) {
  std::map<std::string, std::optional<double>> values;
  for (const auto& [subset, value] : by_subset.items()) {
    std::optional<double>& slot = values[subset];
    if (value.is_number() && std::isfinite(value.get<double>())) slot = value.get<double>();
  }
  return values;
}

std::optional<double> ValueOf(const std::map<std::string, std::optional<double>>& by_subset,
                              const std::string& subset) {
  auto it = by_subset.find(subset);
  return it == by_subset.end() ? std::nullopt : it->second;
}

void CountAlarms(const nlohmann::json& record, int64_t step,
                 std::map<std::string, AlarmStats>* alarms) {
  auto it = record.find(metrics_jsonl::kAlarms);
  if (it == record.end() || !it->is_array()) return;
  for (const nlohmann::json& alarm : *it) {
    if (!alarm.is_object()) continue;
    auto kind = alarm.find("kind");
    if (kind == alarm.end() || !kind->is_string()) continue;
    AlarmStats& stats = (*alarms)[kind->get<std::string>()];
    ++stats.count;
    // The alarm's own step when it says one (it should equal the record's).
    const int64_t fired_at = IntegerAt(alarm, "step").value_or(step);
    if (!stats.first_step || fired_at < *stats.first_step) stats.first_step = fired_at;
  }
}

// `format`: one printf conversion of a double (the callers' literals).
std::string FormatOr(const std::optional<double>& value, const char* format, const char* missing) {
  if (!value) return missing;
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, *value);
  return buffer;
}

std::string Csv(const std::optional<double>& value) { return FormatOr(value, "%.6g", ""); }
std::string Csv(const std::optional<int64_t>& value) {
  return value ? absl::StrCat(*value) : std::string();
}
// The statistics files keep more digits: they are read by programs.
std::string PreciseCsv(const std::optional<double>& value) { return FormatOr(value, "%.10g", ""); }

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

std::string MarkdownCell(const std::string& text) {
  return absl::StrReplaceAll(text, {{"|", "\\|"}, {"\n", " "}});
}

// "%.3f" -> "%+.3f": a difference shows its sign.
std::string SignedFormat(const char* format) {
  std::string signed_format(format);
  if (signed_format.size() > 1 && signed_format[0] == '%' && signed_format[1] != '+') {
    signed_format.insert(1, "+");
  }
  return signed_format;
}

// A spread (a CI half-width) printed with a signed column's format has no sign.
std::string WithoutPlus(std::string text) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  return text;
}

bool FinishedOk(const RunResult& run) { return run.status == "ok"; }

std::optional<double> ValueOfRun(const RunResult& run, const ComparedMetric& metric) {
  return run.metrics ? metric.value(*run.metrics) : std::nullopt;
}

std::optional<double> AlarmCount(const RunMetrics& m, const std::string& kind) {
  if (m.records == 0) return std::nullopt;  // no steps: no alarm could fire
  auto it = m.alarms.find(kind);
  return static_cast<double>(it == m.alarms.end() ? 0 : it->second.count);
}

constexpr char kAlarmPrefix[] = "alarms_";

// The kind of an alarm-count metric ("alarms_collapse" -> "collapse"); empty
// for other metrics.
std::string AlarmKindOf(const ComparedMetric& metric) {
  const std::string prefix = kAlarmPrefix;
  return metric.name.compare(0, prefix.size(), prefix) == 0 ? metric.name.substr(prefix.size())
                                                            : "";
}

// " (first @3)": the earliest step `kind` fired at over `runs`; empty when it
// never did.
std::string FirstFiredText(const std::vector<const RunResult*>& runs, const std::string& kind) {
  std::optional<int64_t> first;
  for (const RunResult* run : runs) {
    if (!run->metrics) continue;
    auto it = run->metrics->alarms.find(kind);
    if (it == run->metrics->alarms.end() || !it->second.first_step) continue;
    if (!first || *it->second.first_step < *first) first = it->second.first_step;
  }
  return first ? absl::StrCat(" (first @", *first, ")") : "";
}

// A per-arm cell: FormatMeanAndCi, " (n=k)" when only k of the arm's `ok`
// runs had the number.
std::string ArmCell(const std::optional<MeanEstimate>& estimate, const char* format, int ok) {
  std::string text = FormatMeanAndCi(estimate, format);
  if (estimate && estimate->n < ok) absl::StrAppend(&text, " (n=", estimate->n, ")");
  return text;
}

using StatisticIndex = std::map<std::pair<std::string, std::string>, std::optional<MeanEstimate>>;

StatisticIndex IndexByArmAndMetric(const std::vector<ArmStatistic>& statistics) {
  StatisticIndex index;
  for (const ArmStatistic& s : statistics) index[{s.arm, s.metric}] = s.estimate;
  return index;
}

// A markdown table: per arm in `arms`, "runs ok" and one column per metric.
// `with_wall`: a last column of wall seconds.
std::string ArmTableMarkdown(const std::vector<AblationArm>& arms,
                             const std::vector<RunResult>& runs,
                             const std::vector<const ComparedMetric*>& columns,
                             const StatisticIndex& statistics, bool with_wall) {
  std::vector<std::string> header = {"arm", "runs ok"};
  for (const ComparedMetric* metric : columns) header.push_back(MarkdownCell(metric->label));
  if (with_wall) header.push_back("wall s");
  std::string out = absl::StrCat("| ", absl::StrJoin(header, " | "), " |\n|");
  for (size_t i = 0; i < header.size(); ++i) absl::StrAppend(&out, "---|");
  absl::StrAppend(&out, "\n");

  for (const AblationArm& arm : arms) {
    std::vector<const RunResult*> ok_runs;
    int total = 0;
    for (const RunResult& run : runs) {
      if (run.arm != arm.name) continue;
      ++total;
      if (FinishedOk(run)) ok_runs.push_back(&run);
    }
    if (total == 0) continue;
    const int ok = static_cast<int>(ok_runs.size());
    std::vector<std::string> row = {MarkdownCell(arm.name), absl::StrCat(ok, "/", total)};
    for (const ComparedMetric* metric : columns) {
      auto it = statistics.find({arm.name, metric->name});
      std::string cell =
          ArmCell(it == statistics.end() ? std::nullopt : it->second, metric->format, ok);
      if (const std::string kind = AlarmKindOf(*metric); !kind.empty()) {
        absl::StrAppend(&cell, FirstFiredText(ok_runs, kind));
      }
      row.push_back(cell);
    }
    if (with_wall) {
      std::vector<std::optional<double>> walls;
      for (const RunResult* run : ok_runs) walls.push_back(run->wall_seconds);
      row.push_back(ArmCell(Aggregate(walls), "%.0f", ok));
    }
    absl::StrAppend(&out, "| ", absl::StrJoin(row, " | "), " |\n");
  }
  return out;
}

// "yes" (bold), "no", "no (2 pairs)" when p is small but the pairs too few,
// "–" without a p.
std::string SignificanceCell(const ArmDifference& d) {
  if (!d.difference || !d.difference->p_value) return kMissing;
  if (d.significant) return "**yes**";
  if (*d.difference->p_value < kSignificanceLevel) {
    return absl::StrCat("no (", d.n_pairs(), " pairs)");
  }
  return "no";
}

std::string DifferencesMarkdown(const std::vector<ArmDifference>& differences,
                                const std::vector<ComparedMetric>& metrics,
                                const std::string& baseline) {
  if (baseline.empty()) {
    return "No baseline arm, so no paired differences (`baseline: <arm>` in the ablation file "
           "names one).\n";
  }
  int tests = 0;  // the rows that could come out significant
  std::string rows;
  for (const ArmDifference& d : differences) {
    const ComparedMetric* metric = FindMetric(metrics, d.metric);
    if (metric == nullptr || !metric->headline) continue;
    if (d.n_pairs() >= kMinPairsForSignificance) ++tests;
    absl::StrAppend(&rows, "| ", MarkdownCell(d.arm), " | ", MarkdownCell(metric->label), " | ",
                    d.n_pairs(), " | ", FormatDifference(d, metric->format), " | ",
                    FormatPValue(d.difference ? d.difference->p_value : std::nullopt), " | ",
                    FormatPValue(d.p_holm), " | ", SignificanceCell(d), " | ",
                    d.effect ? absl::StrCat(FormatOr(d.effect, "%+.3g", kMissing), ": ",
                                            FormatOr(d.power, "%.2f", kMissing))
                             : std::string(kMissing),
                    " |\n");
  }
  std::string out =
      absl::StrCat("## Differences against ", MarkdownCell(baseline), " (paired by seed)\n\n");
  if (rows.empty()) return absl::StrCat(out, "No other arm to compare with it.\n");
  absl::StrAppend(
      &out, "Per arm and metric: the mean over seeds of (arm − ", MarkdownCell(baseline),
      "), over the seeds where both runs finished ok and have the number (n pairs), with its "
      "95 % confidence interval (paired t, n − 1 df) and the two-sided paired t-test's p; "
      "p Holm: Holm's adjustment over the arms compared in that metric (",
      tests, " rows below have enough pairs). Significant: p Holm < ", kSignificanceLevel,
      " with at least ", kMinPairsForSignificance,
      " pairs; no interval or p below 2 pairs. Effect: power: where the experiment names the "
      "effect a metric must show (`effects:`), the power of the paired t-test to find it at "
      "Holm's strictest level, from the observed spread of the differences. differences.csv "
      "has every metric, alarm counts included.\n\n");
  absl::StrAppend(&out,
                  "| arm | metric | n pairs | diff [95 % CI] | p | p Holm | significant | effect: "
                  "power |\n",
                  "|---|---|---|---|---|---|---|---|\n", rows, "\n",
                  SignificanceSentence(differences, metrics), "\n");
  return out;
}

}  // namespace

const std::vector<std::string>& AlarmKinds() {
  static const std::vector<std::string> kinds = {"magnitude_drowning", "directional_conflict",
                                                 "collapse", "inference_mismatch"};
  return kinds;
}

std::optional<double> Median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::optional<MeanEstimate> Aggregate(const std::vector<std::optional<double>>& values) {
  std::vector<double> present;
  for (const std::optional<double>& v : values) {
    if (v) present.push_back(*v);
  }
  return EstimateMean(present);
}

namespace {

void SummarizeAccuracyCurve(const std::vector<std::pair<int64_t, double>>& curve,
                            RunMetrics* metrics) {
  for (const auto& [step, accuracy] : curve) {
    if (!metrics->peak_accuracy || accuracy > *metrics->peak_accuracy) {
      metrics->peak_accuracy = accuracy;
      metrics->peak_accuracy_step = step;
    }
  }
  if (curve.size() < 2 || curve.back().first <= curve.front().first) return;
  double area = 0.0;
  for (size_t i = 1; i < curve.size(); ++i) {
    area += 0.5 * (curve[i].second + curve[i - 1].second) *
            static_cast<double>(curve[i].first - curve[i - 1].first);
  }
  metrics->accuracy_auc = area / static_cast<double>(curve.back().first - curve.front().first);
}

}  // namespace

RunMetrics SummarizeMetrics(const std::vector<nlohmann::json>& records) {
  RunMetrics metrics;
  // step -> its last record. Step 0 is the evaluation before training: it
  // counts for accuracy only.
  std::map<int64_t, const nlohmann::json*> by_step;
  for (const nlohmann::json& record : records) {
    if (!record.is_object()) continue;
    if (std::optional<int64_t> step = IntegerAt(record, metrics_jsonl::kStep))
      by_step[*step] = &record;
  }
  std::vector<nlohmann::json> steps;  // step >= 1, in step order
  std::vector<std::pair<int64_t, double>> curve;  // (step, eval_accuracy), step 0 included
  for (const auto& [step, record] : by_step) {
    if (std::optional<double> accuracy = NumberAt(*record, metrics_jsonl::kEvalAccuracy)) {
      metrics.final_accuracy = accuracy;
      metrics.final_accuracy_step = step;
      curve.emplace_back(step, *accuracy);
    }
    if (const nlohmann::json* by_subset = ObjectAt(*record, metrics_jsonl::kEvalAccuracyBySubset)) {
      metrics.final_accuracy_by_subset = SubsetValues(*by_subset);
    }
    if (step < 1) continue;
    steps.push_back(*record);
    metrics.last_step = step;
    if (std::optional<double> elapsed = NumberAt(*record, metrics_jsonl::kElapsedSeconds)) {
      metrics.train_seconds = elapsed;
    }
  }
  SummarizeAccuracyCurve(curve, &metrics);
  metrics.records = static_cast<int64_t>(steps.size());
  if (steps.empty()) return metrics;

  std::vector<double> distill;
  std::vector<double> reward;
  for (const nlohmann::json& record : steps) {
    // A step that distilled no position (distill_gate none, or an RSTG step
    // with no gated group) logs loss_distill 0: no measurement, not a value.
    const bool distilled = IntegerAt(record, metrics_jsonl::kDistillPositions).value_or(1) > 0;
    if (std::optional<double> v = NumberAt(record, metrics_jsonl::kLossDistill); v && distilled) {
      distill.push_back(*v);
    }
    if (std::optional<double> v = NumberAt(record, metrics_jsonl::kRewardMean))
      reward.push_back(*v);
  }
  if (distill.size() >= 2) {
    const size_t quarter = std::max<size_t>(1, distill.size() / 4);
    metrics.distill_first_quarter = Mean(distill, 0, quarter);
    metrics.distill_last_quarter = Mean(distill, distill.size() - quarter, distill.size());
    metrics.distill_trend = *metrics.distill_last_quarter - *metrics.distill_first_quarter;
  }
  if (!reward.empty()) {
    const size_t quarter = std::max<size_t>(1, reward.size() / 4);
    metrics.reward_last_quarter = Mean(reward, reward.size() - quarter, reward.size());
  }
  metrics.kappa_median = MedianOf(steps, metrics_jsonl::kKappa);
  metrics.kappa_effective_median = MedianOf(steps, metrics_jsonl::kKappaEffective);
  metrics.kdr_negative_fraction_median = MedianOf(steps, metrics_jsonl::kKdrNegativeFraction);
  metrics.kdr_negative_weighted_fraction_median =
      MedianOf(steps, metrics_jsonl::kKdrNegativeWeightedFraction);
  metrics.kdr_mean_median_by_subset = SubsetMedians(steps, metrics_jsonl::kKdrMeanBySubset);
  metrics.kdr_sign_agreement_logit_median = MedianOf(steps, metrics_jsonl::kKdrSignAgreementLogit);
  metrics.grad_cosine_median = GradCosineMedian(steps);
  metrics.kdr_mean_early_by_subset =
      SubsetMeans(steps, metrics_jsonl::kKdrMeanBySubset, std::max<size_t>(1, steps.size() / 4));
  metrics.kdr_negative_fraction_median_by_subset =
      SubsetMedians(steps, metrics_jsonl::kKdrNegativeFractionBySubset);
  for (const std::string& kind : AlarmKinds()) metrics.alarms[kind] = AlarmStats{};
  for (const nlohmann::json& record : steps) {
    CountAlarms(record, record[metrics_jsonl::kStep].get<int64_t>(), &metrics.alarms);
  }
  return metrics;
}

absl::StatusOr<RunMetrics> ReadRunMetrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": no metrics"));
  std::vector<nlohmann::json> records;
  int64_t skipped = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A run killed mid-write leaves a partial last line; skip it, keep the rest.
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object()) {
      records.push_back(std::move(record));
    } else {
      ++skipped;
    }
  }
  RunMetrics metrics = SummarizeMetrics(records);
  metrics.skipped_lines = skipped;
  return metrics;
}

std::vector<std::string> SubsetNames(const std::vector<RunResult>& runs) {
  std::set<std::string> names;
  for (const RunResult& run : runs) {
    if (!run.metrics) continue;
    for (const auto* by_subset :
         {&run.metrics->final_accuracy_by_subset, &run.metrics->kdr_mean_median_by_subset,
          &run.metrics->kdr_negative_fraction_median_by_subset,
          &run.metrics->kdr_mean_early_by_subset}) {
      for (const auto& [subset, value] : *by_subset) names.insert(subset);
    }
  }
  std::vector<std::string> ordered;
  for (const std::string& name : names) {
    if (name != kRestSubset) ordered.push_back(name);
  }
  if (names.count(kRestSubset) > 0) ordered.push_back(kRestSubset);
  return ordered;
}

std::vector<ComparedMetric> ComparedMetrics(const std::vector<RunResult>& runs) {
  using Value = std::function<std::optional<double>(const RunMetrics&)>;
  std::vector<ComparedMetric> metrics;
  auto add = [&](std::string name, std::string label, const char* format, bool headline,
                 Value value, std::string subset = "") {
    metrics.push_back(
        {std::move(name), std::move(label), format, headline, std::move(value), std::move(subset)});
  };
  add("final_eval_accuracy", "final acc", "%.3f", true,
      [](const RunMetrics& m) { return m.final_accuracy; });
  add("peak_eval_accuracy", "peak acc", "%.3f", true,
      [](const RunMetrics& m) { return m.peak_accuracy; });
  add("eval_accuracy_auc", "acc AUC", "%.3f", true,
      [](const RunMetrics& m) { return m.accuracy_auc; });
  add("reward_mean_last_quarter", "reward last ¼", "%.3f", true,
      [](const RunMetrics& m) { return m.reward_last_quarter; });
  add("loss_distill_first_quarter", "L_D first ¼", "%.4g", false,
      [](const RunMetrics& m) { return m.distill_first_quarter; });
  add("loss_distill_last_quarter", "L_D last ¼", "%.4g", false,
      [](const RunMetrics& m) { return m.distill_last_quarter; });
  add("loss_distill_trend", "L_D trend", "%+.3g", true,
      [](const RunMetrics& m) { return m.distill_trend; });
  add("kappa_median", "κ median", "%.3g", false,
      [](const RunMetrics& m) { return m.kappa_median; });
  add("kappa_effective_median", "κ_eff median", "%.3g", true,
      [](const RunMetrics& m) { return m.kappa_effective_median; });
  add("kdr_negative_fraction_median", "K_DR<0 frac", "%.3f", true,
      [](const RunMetrics& m) { return m.kdr_negative_fraction_median; });
  add("kdr_negative_weighted_fraction_median", "K_DR<0 |K|-wtd", "%.3f", false,
      [](const RunMetrics& m) { return m.kdr_negative_weighted_fraction_median; });
  add("kdr_sign_agreement_logit_median", "K_DR sign agreement", "%.3f", false,
      [](const RunMetrics& m) { return m.kdr_sign_agreement_logit_median; });
  add("grad_cosine_median", "cos median", "%+.3f", false,
      [](const RunMetrics& m) { return m.grad_cosine_median; });
  for (const std::string& kind : AlarmKinds()) {
    add(absl::StrCat(kAlarmPrefix, kind), kind, "%.3g", false,
        [kind](const RunMetrics& m) { return AlarmCount(m, kind); });
  }
  const std::vector<std::string> subsets = SubsetNames(runs);
  for (const std::string& s : subsets) {
    add(
        absl::StrCat("final_accuracy_", s), absl::StrCat("acc ", s), "%.3f", true,
        [s](const RunMetrics& m) { return ValueOf(m.final_accuracy_by_subset, s); }, s);
  }
  for (const std::string& s : subsets) {
    add(
        absl::StrCat("kdr_mean_median_", s), absl::StrCat("K_DR mean ", s), "%.3g", true,
        [s](const RunMetrics& m) { return ValueOf(m.kdr_mean_median_by_subset, s); }, s);
  }
  for (const std::string& s : subsets) {
    add(
        absl::StrCat("kdr_negative_fraction_median_", s), absl::StrCat("K_DR<0 frac ", s), "%.3f",
        true,
        [s](const RunMetrics& m) { return ValueOf(m.kdr_negative_fraction_median_by_subset, s); },
        s);
  }
  for (const std::string& s : subsets) {
    add(
        absl::StrCat("kdr_mean_early_", s), absl::StrCat("K_DR early ", s), "%.3g", true,
        [s](const RunMetrics& m) { return ValueOf(m.kdr_mean_early_by_subset, s); }, s);
  }
  return metrics;
}

const ComparedMetric* FindMetric(const std::vector<ComparedMetric>& metrics,
                                 const std::string& name) {
  for (const ComparedMetric& metric : metrics) {
    if (metric.name == name) return &metric;
  }
  return nullptr;
}

std::vector<ArmStatistic> SummarizeArms(const std::vector<AblationArm>& arms,
                                        const std::vector<RunResult>& runs,
                                        const std::vector<ComparedMetric>& metrics) {
  std::vector<ArmStatistic> statistics;
  for (const AblationArm& arm : arms) {
    for (const ComparedMetric& metric : metrics) {
      std::vector<std::optional<double>> values;
      for (const RunResult& run : runs) {
        if (run.arm == arm.name && FinishedOk(run)) values.push_back(ValueOfRun(run, metric));
      }
      ArmStatistic statistic;
      statistic.arm = arm.name;
      statistic.metric = metric.name;
      statistic.estimate = Aggregate(values);
      statistics.push_back(std::move(statistic));
    }
  }
  return statistics;
}

namespace {

// One metric's differences (one per arm) as a family: Holm-adjusted p, the
// significance on it, and the power for `effect` at Holm's strictest level.
void CorrectFamily(const std::string& metric, std::optional<double> effect,
                   std::vector<ArmDifference>* differences) {
  std::vector<ArmDifference*> family;
  std::vector<double> p_values;
  for (ArmDifference& d : *differences) {
    if (d.metric != metric || !d.difference || !d.difference->p_value) continue;
    family.push_back(&d);
    p_values.push_back(*d.difference->p_value);
  }
  const std::vector<double> adjusted = HolmAdjust(p_values);
  for (size_t i = 0; i < family.size(); ++i) {
    ArmDifference& d = *family[i];
    d.p_holm = adjusted[i];
    d.significant = adjusted[i] < kSignificanceLevel && d.n_pairs() >= kMinPairsForSignificance;
    if (!effect) continue;
    d.effect = effect;
    const double power = PairedTPower(d.n_pairs(), *effect, d.difference->std,
                                      kSignificanceLevel / static_cast<double>(family.size()));
    if (std::isfinite(power)) d.power = power;
  }
}

}  // namespace

std::vector<ArmDifference> PairedDifferences(const std::vector<AblationArm>& arms,
                                             const std::vector<RunResult>& runs,
                                             const std::string& baseline,
                                             const std::vector<ComparedMetric>& metrics,
                                             const std::map<std::string, double>& effects) {
  std::vector<ArmDifference> differences;
  if (std::none_of(arms.begin(), arms.end(),
                   [&](const AblationArm& arm) { return arm.name == baseline; })) {
    return differences;  // also: no baseline
  }
  // seed -> the arm's run that finished ok with it (an arm has each seed once).
  auto ok_runs_by_seed = [&](const std::string& arm) {
    std::map<uint64_t, const RunResult*> by_seed;
    for (const RunResult& run : runs) {
      if (run.arm == arm && FinishedOk(run)) by_seed[run.seed] = &run;
    }
    return by_seed;
  };
  const std::map<uint64_t, const RunResult*> baseline_runs = ok_runs_by_seed(baseline);
  for (const AblationArm& arm : arms) {
    if (arm.name == baseline) continue;
    const std::map<uint64_t, const RunResult*> arm_runs = ok_runs_by_seed(arm.name);
    for (const ComparedMetric& metric : metrics) {
      std::vector<double> paired;
      for (const auto& [seed, run] : arm_runs) {
        auto base = baseline_runs.find(seed);
        if (base == baseline_runs.end()) continue;
        const std::optional<double> value = ValueOfRun(*run, metric);
        const std::optional<double> base_value = ValueOfRun(*base->second, metric);
        if (value && base_value) paired.push_back(*value - *base_value);
      }
      ArmDifference d;
      d.arm = arm.name;
      d.baseline = baseline;
      d.metric = metric.name;
      d.difference = EstimateMean(paired);
      differences.push_back(std::move(d));
    }
  }
  for (const ComparedMetric& metric : metrics) {
    auto effect = effects.find(metric.name);
    CorrectFamily(metric.name,
                  effect == effects.end() ? std::nullopt : std::optional<double>(effect->second),
                  &differences);
  }
  return differences;
}

std::string FormatMeanAndCi(const std::optional<MeanEstimate>& estimate, const char* format) {
  if (!estimate) return kMissing;
  return absl::StrCat(FormatOr(estimate->mean, format, kMissing), " ± ",
                      WithoutPlus(FormatOr(estimate->ci_half_width, format, kMissing)));
}

std::string FormatDifference(const ArmDifference& difference, const char* format) {
  if (!difference.difference) return kMissing;
  const MeanEstimate& d = *difference.difference;
  const std::string signed_format = SignedFormat(format);
  const char* f = signed_format.c_str();
  std::string text = FormatOr(d.mean, f, kMissing);
  if (!d.ci_half_width) return absl::StrCat(text, " [", kMissing, "]");
  return absl::StrCat(text, " [", FormatOr(d.ci_low(), f, kMissing), ", ",
                      FormatOr(d.ci_high(), f, kMissing), "]");
}

std::string FormatPValue(const std::optional<double>& p) {
  if (!p) return kMissing;
  if (*p < 0.001) return "< 0.001";
  return FormatOr(p, "%.3f", kMissing);
}

std::string SignificanceSentence(const std::vector<ArmDifference>& differences,
                                 const std::vector<ComparedMetric>& metrics) {
  if (differences.empty()) return "";
  std::vector<std::string> significant;
  for (const ArmDifference& d : differences) {
    const ComparedMetric* metric = FindMetric(metrics, d.metric);
    if (!d.significant || metric == nullptr || !metric->headline) continue;
    significant.push_back(
        absl::StrCat(d.arm, " ", metric->label, " ",
                     FormatOr(d.difference->mean, SignedFormat(metric->format).c_str(), kMissing),
                     " (p Holm ", *d.p_holm < 0.001 ? "" : "= ", FormatPValue(d.p_holm), ")"));
  }
  const std::string criterion = absl::StrCat("p Holm < ", kSignificanceLevel, " with at least ",
                                             kMinPairsForSignificance, " pairs");
  const std::string& baseline = differences.front().baseline;
  if (significant.empty()) {
    return absl::StrCat("No difference against ", baseline, " is significant (", criterion, ").");
  }
  return absl::StrCat("Significant against ", baseline, " (", criterion,
                      "): ", absl::StrJoin(significant, "; "), ".");
}

std::string ResultsCsv(const std::vector<RunResult>& runs) {
  std::vector<std::string> header = {
      "arm", "seed", "name", "status", "wall_seconds", "train_seconds", "last_step",
      "final_eval_accuracy", "final_eval_step", "loss_distill_first_quarter",
      "loss_distill_last_quarter", "loss_distill_trend", "reward_mean_last_quarter",
      "kappa_median", "kappa_effective_median", "kdr_negative_fraction_median",
      "kdr_negative_weighted_fraction_median"};
  for (const std::string& kind : AlarmKinds()) {
    header.push_back(absl::StrCat("alarms_", kind));
    header.push_back(absl::StrCat("first_step_", kind));
  }
  header.push_back("alarms_other");
  const std::vector<std::string> subsets = SubsetNames(runs);
  for (const char* prefix :
       {"final_accuracy_", "kdr_mean_median_", "kdr_negative_fraction_median_"}) {
    for (const std::string& subset : subsets) {
      header.push_back(CsvField(absl::StrCat(prefix, subset)));
    }
  }
  for (const char* column : {"peak_eval_accuracy", "peak_eval_step", "eval_accuracy_auc",
                             "kdr_sign_agreement_logit_median", "grad_cosine_median"}) {
    header.push_back(column);
  }
  for (const std::string& subset : subsets) {
    header.push_back(CsvField(absl::StrCat("kdr_mean_early_", subset)));
  }
  header.push_back("error");
  std::string out = absl::StrCat(absl::StrJoin(header, ","), "\n");

  for (const RunResult& run : runs) {
    const RunMetrics empty;
    const RunMetrics& m = run.metrics ? *run.metrics : empty;
    const bool have = run.metrics.has_value() && m.records > 0;
    std::vector<std::string> row = {
        CsvField(run.arm), absl::StrCat(run.seed), CsvField(run.name), run.status,
        Csv(run.wall_seconds), Csv(m.train_seconds), Csv(m.last_step), Csv(m.final_accuracy),
        Csv(m.final_accuracy_step), Csv(m.distill_first_quarter), Csv(m.distill_last_quarter),
        Csv(m.distill_trend), Csv(m.reward_last_quarter), Csv(m.kappa_median),
        Csv(m.kappa_effective_median),
        Csv(m.kdr_negative_fraction_median), Csv(m.kdr_negative_weighted_fraction_median)};
    int64_t other = 0;
    for (const auto& [kind, stats] : m.alarms) {
      if (std::find(AlarmKinds().begin(), AlarmKinds().end(), kind) == AlarmKinds().end()) {
        other += stats.count;
      }
    }
    for (const std::string& kind : AlarmKinds()) {
      auto it = m.alarms.find(kind);
      row.push_back(have ? absl::StrCat(it == m.alarms.end() ? 0 : it->second.count) : "");
      row.push_back(it == m.alarms.end() ? "" : Csv(it->second.first_step));
    }
    row.push_back(have ? absl::StrCat(other) : "");
    for (const auto* by_subset : {&m.final_accuracy_by_subset, &m.kdr_mean_median_by_subset,
                                  &m.kdr_negative_fraction_median_by_subset}) {
      for (const std::string& subset : subsets) row.push_back(Csv(ValueOf(*by_subset, subset)));
    }
    row.insert(row.end(), {Csv(m.peak_accuracy), Csv(m.peak_accuracy_step), Csv(m.accuracy_auc),
                           Csv(m.kdr_sign_agreement_logit_median), Csv(m.grad_cosine_median)});
    for (const std::string& subset : subsets) {
      row.push_back(Csv(ValueOf(m.kdr_mean_early_by_subset, subset)));
    }
    row.push_back(CsvField(run.error));
    absl::StrAppend(&out, absl::StrJoin(row, ","), "\n");
  }
  return out;
}

std::string SummaryCsv(const std::vector<ArmStatistic>& statistics) {
  std::string out = "arm,metric,n,mean,std,ci_low,ci_high\n";
  for (const ArmStatistic& s : statistics) {
    std::vector<std::string> row = {CsvField(s.arm), CsvField(s.metric)};
    if (!s.estimate) {
      row.insert(row.end(), {"0", "", "", "", ""});
    } else {
      const MeanEstimate& e = *s.estimate;
      row.insert(row.end(), {absl::StrCat(e.n), PreciseCsv(e.mean),
                             e.n > 1 ? PreciseCsv(e.std) : std::string(), PreciseCsv(e.ci_low()),
                             PreciseCsv(e.ci_high())});
    }
    absl::StrAppend(&out, absl::StrJoin(row, ","), "\n");
  }
  return out;
}

std::string DifferencesCsv(const std::vector<ArmDifference>& differences) {
  std::string out =
      "arm,baseline,metric,n_pairs,mean_diff,ci_low,ci_high,p_value,significant,p_holm,effect,"
      "power\n";
  for (const ArmDifference& d : differences) {
    std::vector<std::string> row = {CsvField(d.arm), CsvField(d.baseline), CsvField(d.metric),
                                    absl::StrCat(d.n_pairs())};
    if (!d.difference) {
      row.insert(row.end(), {"", "", "", ""});
    } else {
      row.insert(row.end(),
                 {PreciseCsv(d.difference->mean), PreciseCsv(d.difference->ci_low()),
                  PreciseCsv(d.difference->ci_high()), PreciseCsv(d.difference->p_value)});
    }
    row.push_back(d.significant ? "true" : "false");
    row.insert(row.end(), {PreciseCsv(d.p_holm), PreciseCsv(d.effect), PreciseCsv(d.power)});
    absl::StrAppend(&out, absl::StrJoin(row, ","), "\n");
  }
  return out;
}

std::string ResultsMarkdown(const std::string& title, const std::string& context,
                            const std::vector<AblationArm>& arms,
                            const std::vector<RunResult>& runs, const std::string& baseline,
                            const std::map<std::string, double>& effects) {
  const std::vector<ComparedMetric> metrics = ComparedMetrics(runs);
  const StatisticIndex statistics = IndexByArmAndMetric(SummarizeArms(arms, runs, metrics));
  std::vector<const ComparedMetric*> main_columns;
  std::vector<const ComparedMetric*> subset_columns;
  for (const ComparedMetric& metric : metrics) {
    (metric.subset.empty() ? main_columns : subset_columns).push_back(&metric);
  }

  std::string out = absl::StrCat("# ", title, "\n\n");
  if (!context.empty()) absl::StrAppend(&out, context, "\n\n");
  absl::StrAppend(
      &out,
      "Per arm, over its runs that finished ok: **mean ± half-width of the 95 % confidence "
      "interval of the mean** (Student t, n − 1 df; ± –: a single run, no interval; n=k: only "
      "k runs had the number; –: none). summary.csv has n, mean, sample std and the interval's "
      "bounds.\n"
      "L_D ¼: mean loss_distill over the first / last quarter of steps; trend = last − first.\n"
      "κ (‖∇L_R‖/‖∇L_D‖), κ_eff (the applied ratio, κ/λ when mixing naively) and K_DR<0 "
      "fractions: per-run medians over steps. Alarms: fired per run "
      "(first @step: earliest over seeds).\n\n");
  absl::StrAppend(&out, ArmTableMarkdown(arms, runs, main_columns, statistics, true));
  if (!subset_columns.empty()) {
    absl::StrAppend(&out,
                    "\nPer prompt subset (same statistics): final held-out accuracy on the "
                    "subset, and the per-run medians over steps of its K_DR mean and K_DR<0 "
                    "fraction.\n\n",
                    ArmTableMarkdown(arms, runs, subset_columns, statistics, false));
  }
  absl::StrAppend(&out, "\n",
                  DifferencesMarkdown(PairedDifferences(arms, runs, baseline, metrics, effects),
                                      metrics, baseline));

  absl::StrAppend(&out, "\nArms:\n\n");
  for (const AblationArm& arm : arms) {
    absl::StrAppend(&out, "- `", arm.name, "`: ",
                    arm.description.empty() ? std::string(kMissing) : arm.description,
                    arm.overrides.empty() ? ""
                                          : absl::StrCat(" (`", absl::StrJoin(arm.overrides, " "),
                                                         "`)"),
                    "\n");
  }
  std::vector<std::string> problems;
  for (const RunResult& run : runs) {
    if (FinishedOk(run)) continue;
    problems.push_back(absl::StrCat("- `", run.name, "`: ", run.status,
                                    run.error.empty() ? "" : absl::StrCat(": ", run.error)));
  }
  if (!problems.empty()) {
    absl::StrAppend(&out,
                    "\nRuns that did not finish (left out of the statistics; their partial "
                    "metrics are in results.csv):\n\n",
                    absl::StrJoin(problems, "\n"), "\n");
  }
  return out;
}

}  // namespace kappa::cli
