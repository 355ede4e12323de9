#include "cli/experiment_results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
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

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

std::string MarkdownCell(const std::string& text) {
  return absl::StrReplaceAll(text, {{"|", "\\|"}, {"\n", " "}});
}

// "0.512 ± 0.034", "0.512" for one value, " (n=2)" when some runs of the arm
// lacked the number.
std::string FormatAggregate(const std::optional<MeanStd>& aggregate, const char* format,
                            int runs) {
  if (!aggregate) return kMissing;
  std::string text = FormatOr(aggregate->mean, format, kMissing);
  if (aggregate->n > 1) {
    std::string spread = FormatOr(aggregate->std, format, kMissing);
    if (!spread.empty() && spread[0] == '+') spread.erase(0, 1);  // a signed column's std
    absl::StrAppend(&text, " ± ", spread);
  }
  if (aggregate->n < runs) absl::StrAppend(&text, " (n=", aggregate->n, ")");
  return text;
}

using Getter = std::function<std::optional<double>(const RunMetrics&)>;

std::optional<MeanStd> AggregateRuns(const std::vector<const RunResult*>& runs,
                                     const Getter& get) {
  std::vector<std::optional<double>> values;
  for (const RunResult* run : runs) {
    values.push_back(run->metrics ? get(*run->metrics) : std::nullopt);
  }
  return Aggregate(values);
}

// Count mean ± std over the runs that have metrics, and the earliest step any
// of them fired at.
std::string FormatAlarmCell(const std::vector<const RunResult*>& runs, const std::string& kind) {
  std::vector<std::optional<double>> counts;
  std::optional<int64_t> first;
  for (const RunResult* run : runs) {
    if (!run->metrics || run->metrics->records == 0) {
      counts.push_back(std::nullopt);
      continue;
    }
    auto it = run->metrics->alarms.find(kind);
    const AlarmStats stats = it == run->metrics->alarms.end() ? AlarmStats{} : it->second;
    counts.push_back(static_cast<double>(stats.count));
    if (stats.first_step && (!first || *stats.first_step < *first)) first = stats.first_step;
  }
  std::string text = FormatAggregate(Aggregate(counts), "%.3g", static_cast<int>(runs.size()));
  if (first) absl::StrAppend(&text, " (first @", *first, ")");
  return text;
}

}  // namespace

const std::vector<std::string>& AlarmKinds() {
  static const std::vector<std::string> kinds = {"magnitude_drowning", "directional_conflict",
                                                 "collapse"};
  return kinds;
}

std::optional<double> Median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::optional<MeanStd> Aggregate(const std::vector<std::optional<double>>& values) {
  std::vector<double> present;
  for (const std::optional<double>& v : values) {
    if (v) present.push_back(*v);
  }
  if (present.empty()) return std::nullopt;
  MeanStd result;
  result.n = static_cast<int>(present.size());
  result.mean = Mean(present, 0, present.size());
  if (result.n > 1) {
    double squares = 0.0;
    for (double v : present) squares += (v - result.mean) * (v - result.mean);
    result.std = std::sqrt(squares / static_cast<double>(result.n - 1));
  }
  return result;
}

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
  for (const auto& [step, record] : by_step) {
    if (std::optional<double> accuracy = NumberAt(*record, metrics_jsonl::kEvalAccuracy)) {
      metrics.final_accuracy = accuracy;
      metrics.final_accuracy_step = step;
    }
    if (step < 1) continue;
    steps.push_back(*record);
    metrics.last_step = step;
    if (std::optional<double> elapsed = NumberAt(*record, metrics_jsonl::kElapsedSeconds)) {
      metrics.train_seconds = elapsed;
    }
  }
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
    row.push_back(CsvField(run.error));
    absl::StrAppend(&out, absl::StrJoin(row, ","), "\n");
  }
  return out;
}

std::string ResultsMarkdown(const std::string& title, const std::string& context,
                            const std::vector<AblationArm>& arms,
                            const std::vector<RunResult>& runs) {
  std::string out = absl::StrCat("# ", title, "\n\n");
  if (!context.empty()) absl::StrAppend(&out, context, "\n\n");
  absl::StrAppend(
      &out,
      "Per arm: mean ± sample std over seeds (n=k: only k runs had the number; – none).\n"
      "L_D ¼: mean loss_distill over the first / last quarter of steps; trend = last − first.\n"
      "κ (‖∇L_R‖/‖∇L_D‖), κ_eff (the applied ratio, κ/λ when mixing naively) and K_DR<0 "
      "fractions: per-run medians over steps. Alarms: fired per run "
      "(first @step: earliest over seeds).\n\n");
  absl::StrAppend(&out,
                  "| arm | runs ok | final acc | L_D first ¼ | L_D last ¼ | L_D trend | κ median | "
                  "κ_eff median | K_DR<0 frac | K_DR<0 \\|K\\|-wtd | magnitude_drowning | directional_conflict "
                  "| collapse | wall s |\n",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const AblationArm& arm : arms) {
    std::vector<const RunResult*> arm_runs;
    int ok = 0;
    for (const RunResult& run : runs) {
      if (run.arm != arm.name) continue;
      arm_runs.push_back(&run);
      if (run.status == "ok") ++ok;
    }
    if (arm_runs.empty()) continue;
    const int n = static_cast<int>(arm_runs.size());
    auto cell = [&](const Getter& get, const char* format) {
      return FormatAggregate(AggregateRuns(arm_runs, get), format, n);
    };
    std::vector<std::string> row = {
        MarkdownCell(arm.name),
        absl::StrCat(ok, "/", n),
        cell([](const RunMetrics& m) { return m.final_accuracy; }, "%.3f"),
        cell([](const RunMetrics& m) { return m.distill_first_quarter; }, "%.4g"),
        cell([](const RunMetrics& m) { return m.distill_last_quarter; }, "%.4g"),
        cell([](const RunMetrics& m) { return m.distill_trend; }, "%+.3g"),
        cell([](const RunMetrics& m) { return m.kappa_median; }, "%.3g"),
        cell([](const RunMetrics& m) { return m.kappa_effective_median; }, "%.3g"),
        cell([](const RunMetrics& m) { return m.kdr_negative_fraction_median; }, "%.3f"),
        cell([](const RunMetrics& m) { return m.kdr_negative_weighted_fraction_median; }, "%.3f")};
    for (const std::string& kind : AlarmKinds()) row.push_back(FormatAlarmCell(arm_runs, kind));
    std::vector<std::optional<double>> walls;
    for (const RunResult* run : arm_runs) walls.push_back(run->wall_seconds);
    row.push_back(FormatAggregate(Aggregate(walls), "%.0f", n));
    absl::StrAppend(&out, "| ", absl::StrJoin(row, " | "), " |\n");
  }

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
    if (run.status == "ok") continue;
    problems.push_back(absl::StrCat("- `", run.name, "`: ", run.status,
                                    run.error.empty() ? "" : absl::StrCat(": ", run.error)));
  }
  if (!problems.empty()) {
    absl::StrAppend(&out, "\nRuns that did not finish (their partial metrics are included):\n\n",
                    absl::StrJoin(problems, "\n"), "\n");
  }
  return out;
}

}  // namespace kappa::cli
