// What `kappa experiment` reports: each run's metrics.jsonl reduced to a few
// numbers (final held-out accuracy, L_D trend, κ median, K_DR negative
// fractions, alarms), written per run as results.csv and per arm (mean ± std
// over seeds) as results.md. No processes here, so tests can feed it
// synthetic metrics.
//
// A number the metrics do not contain stays unset (std::nullopt) and prints
// as "–" in results.md and as an empty cell in results.csv (so the CSV still
// loads as numbers); it is never shown as 0.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "cli/ablation_spec.h"

namespace kappa::cli {

// The alarm kinds the learner raises (docs/algorithms.md §3.3), in report order.
const std::vector<std::string>& AlarmKinds();

struct AlarmStats {
  int64_t count = 0;
  std::optional<int64_t> first_step;  // unset: never fired
};

struct RunMetrics {
  int64_t records = 0;        // per-step records (step >= 1) after de-duplication
  int64_t skipped_lines = 0;  // lines that were not JSON objects
  std::optional<int64_t> last_step;
  // eval_accuracy of the last step that has one.
  std::optional<double> final_accuracy;
  std::optional<int64_t> final_accuracy_step;
  // Mean loss_distill over the first and last quarter of the steps that
  // report it (at least one step each; unset below two steps), and
  // last - first: > 0 means L_D rose over the run. Steps with
  // distill_positions 0 (nothing distilled) do not count.
  std::optional<double> distill_first_quarter;
  std::optional<double> distill_last_quarter;
  std::optional<double> distill_trend;
  std::optional<double> reward_last_quarter;  // mean reward_mean, same last quarter
  // Medians over steps; null or missing values are skipped.
  std::optional<double> kappa_median;            // field "kappa": ‖∇L_R‖ / ‖∇L_D‖
  std::optional<double> kappa_effective_median;  // "kappa_effective": the ratio applied (κ/λ naive)
  std::optional<double> kdr_negative_fraction_median;
  std::optional<double> kdr_negative_weighted_fraction_median;
  std::optional<double> train_seconds;  // elapsed_seconds of the last step
  // By kind; every kind of AlarmKinds() is present once there are records,
  // plus any other kind seen.
  std::map<std::string, AlarmStats> alarms;
};

// `records`: the metrics.jsonl objects in file order. A step recorded twice
// (a resumed run repeats the steps after its last checkpoint) counts once,
// with its later record.
RunMetrics SummarizeMetrics(const std::vector<nlohmann::json>& records);
// Reads and summarizes a metrics.jsonl; NOT_FOUND when it does not exist.
absl::StatusOr<RunMetrics> ReadRunMetrics(const std::string& path);

struct RunResult {
  std::string arm;
  uint64_t seed = 0;
  std::string name;
  std::string status = "not run";  // "ok" | "failed" | "interrupted" | "not run"
  std::string error;               // why it failed, for the reports
  std::optional<double> wall_seconds;
  std::optional<RunMetrics> metrics;  // unset: no metrics.jsonl
};

struct MeanStd {
  double mean = 0.0;
  double std = 0.0;  // sample standard deviation (n - 1); 0 when n == 1
  int n = 0;
};
// Over the values that are set; unset when none is.
std::optional<MeanStd> Aggregate(const std::vector<std::optional<double>>& values);
// Median of `values` (unsorted); unset when empty.
std::optional<double> Median(std::vector<double> values);

// One row per run, a header naming every column.
std::string ResultsCsv(const std::vector<RunResult>& runs);
// A markdown report: `title` as heading, `context` (markdown, e.g. the base
// config and overrides) below it, one table row per arm (in `arms` order,
// mean ± std over that arm's runs), the arms' descriptions and the runs that
// did not finish.
std::string ResultsMarkdown(const std::string& title, const std::string& context,
                            const std::vector<AblationArm>& arms,
                            const std::vector<RunResult>& runs);

}  // namespace kappa::cli
