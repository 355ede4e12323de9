// What `kappa experiment` reports: each run's metrics.jsonl reduced to a few
// numbers (final held-out accuracy, L_D trend, κ median, K_DR negative
// fractions, alarms, and the same per prompt subset when the learner logs
// subsets), written per run as results.csv; per arm (n, mean, sample std and
// the 95 % Student-t confidence interval of the mean, over the arm's runs
// that finished ok) as summary.csv; per arm against a baseline arm (the mean
// paired-by-seed difference, its 95 % CI and the paired t-test's p) as
// differences.csv; and both as tables in results.md. No processes here, so
// tests can feed it synthetic metrics.
//
// A number the metrics do not contain stays unset (std::nullopt) and prints
// as "–" in results.md and as an empty cell in the CSVs (so they still load
// as numbers); it is never shown as 0.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/ablation_spec.h"
#include "cli/stats.h"

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
  // The highest eval_accuracy of the run (the earliest step when tied), and
  // the area under the accuracy curve over the evaluations (step 0
  // included): the trapezoid rule divided by the steps spanned, so a mean
  // accuracy over the run; unset below two evaluations.
  std::optional<double> peak_accuracy;
  std::optional<int64_t> peak_accuracy_step;
  std::optional<double> accuracy_auc;
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
  // Median over the steps that ran the exact K_DR of the share of its
  // sampled positions where the logit estimator has the exact one's sign.
  std::optional<double> kdr_sign_agreement_logit_median;
  // Median cos(∇L_R, ∇L_D) over the steps that measured both gradients and
  // found both non-zero (unset for GRPO alone: no angle there).
  std::optional<double> grad_cosine_median;
  std::optional<double> train_seconds;  // elapsed_seconds of the last step
  // By kind; every kind of AlarmKinds() is present once there are records,
  // plus any other kind seen.
  std::map<std::string, AlarmStats> alarms;
  // Per prompt subset, keyed by subset name (e.g. "hard", "rest"), when the
  // records carry them. Accuracy: eval_accuracy_by_subset of the last record
  // that has that object. K_DR: the medians over steps of kdr_mean_by_subset
  // and kdr_negative_fraction_by_subset. A subset that is named but whose
  // values are all null maps to an unset value.
  std::map<std::string, std::optional<double>> final_accuracy_by_subset;
  std::map<std::string, std::optional<double>> kdr_mean_median_by_subset;
  std::map<std::string, std::optional<double>> kdr_negative_fraction_median_by_subset;
  // The mean of kdr_mean_by_subset over the first quarter of the run's steps
  // (those that have it): a conflict measured while the subset still has
  // reward variance, before a lost subset's K_DR goes to 0.
  std::map<std::string, std::optional<double>> kdr_mean_early_by_subset;
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

// EstimateMean over the values that are set; unset when none is.
std::optional<MeanEstimate> Aggregate(const std::vector<std::optional<double>>& values);
// Median of `values` (unsorted); unset when empty.
std::optional<double> Median(std::vector<double> values);

// The subset names seen in any run's metrics, sorted, "rest" last.
std::vector<std::string> SubsetNames(const std::vector<RunResult>& runs);

// A number of a run that the per-arm statistics and the paired differences
// cover.
struct ComparedMetric {
  std::string name;    // its results.csv column, e.g. "final_eval_accuracy"
  std::string label;   // for results.md and report.html, e.g. "final acc"
  const char* format;  // one printf conversion of a double, for results.md
  bool headline;       // in results.md's differences table (differences.csv has all)
  std::function<std::optional<double>(const RunMetrics&)> value;
  std::string subset;  // the prompt subset of a per-subset metric; empty for the others
};
// Final, peak and mean (AUC) accuracy, reward last quarter, L_D first /
// last quarter and trend, κ and κ_eff medians, the K_DR<0 fraction medians,
// the exact/logit sign agreement median, the alarm counts per kind of
// AlarmKinds(), then per subset of SubsetNames(runs):
// final_accuracy_<subset>, kdr_mean_median_<subset>,
// kdr_negative_fraction_median_<subset>, kdr_mean_early_<subset>.
std::vector<ComparedMetric> ComparedMetrics(const std::vector<RunResult>& runs);
// The metric called `name` in `metrics`; null when none is.
const ComparedMetric* FindMetric(const std::vector<ComparedMetric>& metrics,
                                 const std::string& name);

// One arm's numbers for one metric, over the arm's runs that finished ok.
struct ArmStatistic {
  std::string arm;
  std::string metric;                    // ComparedMetric::name
  std::optional<MeanEstimate> estimate;  // unset: no such run has the number
};
// Arms in `arms` order, metrics in `metrics` order within each.
std::vector<ArmStatistic> SummarizeArms(const std::vector<AblationArm>& arms,
                                        const std::vector<RunResult>& runs,
                                        const std::vector<ComparedMetric>& metrics);

inline constexpr double kSignificanceLevel = 0.05;
inline constexpr int kMinPairsForSignificance = 3;

// One arm against the baseline arm for one metric: the runs of the two arms
// paired by seed, over the seeds where both finished ok and both have the
// number.
struct ArmDifference {
  std::string arm;
  std::string baseline;
  std::string metric;  // ComparedMetric::name
  // Of the paired differences arm − baseline: n is the number of pairs, the
  // CI is the paired-t interval and p_value the two-sided paired t-test's
  // (unset below two pairs). Unset: no pair.
  std::optional<MeanEstimate> difference;
  // Holm's adjustment of p_value over the family of every arm's difference
  // in this metric (one test per arm against the baseline); unset with
  // p_value.
  std::optional<double> p_holm;
  bool significant = false;  // p_holm < kSignificanceLevel with >= kMinPairsForSignificance pairs
  // For a metric the experiment names an effect size for (AblationSpec
  // effects): that effect, and the power of the paired t-test to find it at
  // level kSignificanceLevel / (the family's size), Holm's strictest, with
  // the observed standard deviation of the paired differences. Unset below
  // two pairs or with no spread.
  std::optional<double> effect;
  std::optional<double> power;

  int n_pairs() const { return difference ? difference->n : 0; }
};
// Every arm but the baseline (in `arms` order) x every metric; empty when
// `baseline` is empty or no arm has that name.
std::vector<ArmDifference> PairedDifferences(const std::vector<AblationArm>& arms,
                                             const std::vector<RunResult>& runs,
                                             const std::string& baseline,
                                             const std::vector<ComparedMetric>& metrics,
                                             const std::map<std::string, double>& effects = {});

// "0.600 ± 0.248": the mean ± the CI half-width in `format`; "0.600 ± –"
// for a single value (no CI); "–" when unset.
std::string FormatMeanAndCi(const std::optional<MeanEstimate>& estimate, const char* format);
// "+0.012 [-0.030, +0.054]": the mean difference and its CI, signed;
// "+0.012 [–]" for one pair; "–" for none.
std::string FormatDifference(const ArmDifference& difference, const char* format);
// "0.041", "< 0.001"; "–" when unset.
std::string FormatPValue(const std::optional<double>& p);
// One sentence naming the significant differences among `differences` of
// the headline metrics (or saying that there are none).
std::string SignificanceSentence(const std::vector<ArmDifference>& differences,
                                 const std::vector<ComparedMetric>& metrics);

// One row per run, a header naming every column: the columns of earlier
// versions keep their names and order; the per-subset columns, then peak and
// AUC accuracy, the sign agreement and the early per-subset K_DR come before
// the last one, "error".
std::string ResultsCsv(const std::vector<RunResult>& runs);
// arm,metric,n,mean,std,ci_low,ci_high: one row per ArmStatistic (std and
// the CI empty below two values; everything but arm and metric empty at n 0).
std::string SummaryCsv(const std::vector<ArmStatistic>& statistics);
// arm,baseline,metric,n_pairs,mean_diff,ci_low,ci_high,p_value,significant
// (true/false, on the Holm-adjusted p),p_holm,effect,power: one row per
// ArmDifference.
std::string DifferencesCsv(const std::vector<ArmDifference>& differences);
// A markdown report: `title` as heading, `context` (markdown, e.g. the base
// config and overrides) below it; one table row per arm (in `arms` order,
// mean ± 95 % CI half-width over the arm's runs that finished ok), and a
// per-subset table when there are subsets; the differences against
// `baseline` (empty: none) with the sentence naming the significant ones;
// the arms' descriptions and the runs that did not finish.
std::string ResultsMarkdown(const std::string& title, const std::string& context,
                            const std::vector<AblationArm>& arms,
                            const std::vector<RunResult>& runs, const std::string& baseline,
                            const std::map<std::string, double>& effects = {});

}  // namespace kappa::cli
