#include "cli/report_experiment.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "cli/report_html.h"
#include "cli/report_run.h"
#include "cli/report_svg.h"
#include "learner/metrics_schema.h"
#include "services/atomic_file.h"

namespace kappa::cli {
namespace {

struct Curve {
  std::vector<double> x, y;
};

Curve RunCurve(const RunSeries& s, const std::string& field) {
  Curve curve;
  const std::vector<double> values = s.Series(field);
  const std::vector<double> positions = s.Series(metrics_jsonl::kDistillPositions);
  for (size_t i = 0; i < s.steps.size(); ++i) {
    double v = values[i];
    // As on the run page: a step that distilled nothing has no L_D.
    if (field == metrics_jsonl::kLossDistill && positions[i] == 0) continue;
    if (!std::isfinite(v)) continue;
    curve.x.push_back(static_cast<double>(s.steps[i]));
    curve.y.push_back(v);
  }
  return curve;
}

// Reward and L_D of one step are too noisy to compare arms by eye.
Curve Smooth(const Curve& curve, int window) {
  Curve out = curve;
  out.y = MovingAverage(curve.y, window);
  return out;
}

// Per step, the mean over the runs that have a value there.
Curve MeanCurve(const std::vector<Curve>& curves) {
  std::map<double, std::pair<double, int>> by_x;
  for (const Curve& c : curves) {
    for (size_t i = 0; i < c.x.size(); ++i) {
      auto& [sum, count] = by_x[c.x[i]];
      sum += c.y[i];
      ++count;
    }
  }
  Curve mean;
  for (const auto& [x, acc] : by_x) {
    mean.x.push_back(x);
    mean.y.push_back(acc.first / acc.second);
  }
  return mean;
}

struct ChartSpec {
  std::string id, field, title, y_label;
  bool log_y = false;
  bool smooth = true;
  bool unit_range = false;
};

std::string ComparisonChart(const ChartSpec& spec, const std::vector<AblationArm>& arms,
                            const std::vector<ExperimentRunSeries>& runs, int window) {
  LineChart chart;
  chart.id = spec.id;
  chart.title = spec.title;
  chart.y_label = spec.y_label;
  chart.log_y = spec.log_y;
  if (spec.unit_range) {
    chart.fixed_y = true;
    chart.y_min = 0;
    chart.y_max = 1;
  }
  const int w = spec.smooth ? window : 1;
  chart.subtitle = absl::StrCat("bold: mean over the arm's seeds; faint: each run",
                                w > 1 ? absl::StrCat("; moving average over ", w, " steps") : "");
  for (size_t a = 0; a < arms.size(); ++a) {
    std::vector<Curve> curves;
    for (const ExperimentRunSeries& run : runs) {
      if (run.result->arm != arms[a].name || !run.series) continue;
      curves.push_back(Smooth(RunCurve(*run.series, spec.field), w));
    }
    for (const Curve& c : curves) {
      if (curves.size() < 2) break;  // one run: its curve is the mean
      ChartSeries faint{arms[a].name, PaletteColor(a), c.x, c.y};
      faint.opacity = 0.3;
      faint.width = 1;
      faint.in_legend = false;
      chart.series.push_back(std::move(faint));
    }
    const Curve mean = MeanCurve(curves);
    ChartSeries bold{arms[a].name, PaletteColor(a), mean.x, mean.y};
    bold.width = 2.2;
    bold.dots = spec.field == metrics_jsonl::kEvalAccuracy;
    chart.series.push_back(std::move(bold));
  }
  return RenderLineChart(chart);
}

constexpr const char* kHtmlFormat = "%.4g";

// FormatMeanAndCi, " (n=k)" when only k of the arm's `ok` runs had the number.
std::string EstimateText(const std::optional<MeanEstimate>& estimate, int ok) {
  std::string text = FormatMeanAndCi(estimate, kHtmlFormat);
  if (estimate && estimate->n < ok) absl::StrAppend(&text, " (n=", estimate->n, ")");
  return text;
}

std::string AlarmText(const std::map<std::string, AlarmStats>& alarms) {
  std::string text;
  for (const auto& [kind, stats] : alarms) {
    if (stats.count == 0) continue;
    absl::StrAppend(&text, text.empty() ? "" : "<br>", "<span style=\"color:", AlarmColor(kind),
                    "\">■</span> ", XmlEscape(kind), " ", stats.count,
                    stats.first_step ? absl::StrCat(" (first @", *stats.first_step, ")") : "");
  }
  return text.empty() ? "0" : text;
}

// The results of the runs with their metrics summarized from the series.
struct ArmStatistics {
  std::vector<ComparedMetric> metrics;
  std::map<std::pair<std::string, std::string>, std::optional<MeanEstimate>> by_arm_and_metric;
  std::vector<ArmDifference> differences;

  std::optional<MeanEstimate> Of(const std::string& arm, const std::string& metric) const {
    auto it = by_arm_and_metric.find({arm, metric});
    return it == by_arm_and_metric.end() ? std::nullopt : it->second;
  }
};

ArmStatistics ComputeStatistics(const std::vector<AblationArm>& arms,
                                const std::vector<ExperimentRunSeries>& runs,
                                const std::vector<RunMetrics>& metrics,
                                const std::string& baseline) {
  std::vector<RunResult> results;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunResult& original = *runs[i].result;
    RunResult result;
    result.arm = original.arm;
    result.seed = original.seed;
    result.name = original.name;
    result.status = original.status;
    result.error = original.error;
    result.wall_seconds = original.wall_seconds;
    if (runs[i].series) result.metrics.emplace(metrics[i]);
    results.push_back(std::move(result));
  }
  ArmStatistics statistics;
  statistics.metrics = ComparedMetrics(results);
  for (const ArmStatistic& s : SummarizeArms(arms, results, statistics.metrics)) {
    statistics.by_arm_and_metric[{s.arm, s.metric}] = s.estimate;
  }
  statistics.differences = PairedDifferences(arms, results, baseline, statistics.metrics);
  return statistics;
}

std::string ArmTable(const std::vector<AblationArm>& arms,
                     const std::vector<ExperimentRunSeries>& runs,
                     const std::vector<RunMetrics>& metrics, const ArmStatistics& statistics) {
  std::string out =
      "<p class=\"meta\">Per arm, over its runs that finished ok: mean ± half-width of the "
      "95 % confidence interval of the mean (Student t, n − 1 df; ± –: a single run); "
      "alarms: fired over those runs.</p>\n"
      "<table class=\"arms\"><thead><tr><th>arm</th><th>runs ok</th><th>final held-out acc</th>"
      "<th>reward, last quarter</th><th>L_D trend</th><th>κ median</th><th>κ_eff median</th>"
      "<th>K_DR&lt;0 weighted median</th><th>alarms</th><th>description</th></tr></thead><tbody>\n";
  for (size_t a = 0; a < arms.size(); ++a) {
    const std::string& arm = arms[a].name;
    int total = 0, ok = 0;
    std::map<std::string, AlarmStats> alarms;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].result->arm != arm) continue;
      ++total;
      if (runs[i].result->status != "ok") continue;
      ++ok;
      if (!runs[i].series) continue;
      for (const auto& [kind, stats] : metrics[i].alarms) {
        AlarmStats& sum = alarms[kind];
        sum.count += stats.count;
        if (stats.first_step && (!sum.first_step || *stats.first_step < *sum.first_step)) {
          sum.first_step = stats.first_step;
        }
      }
    }
    auto cell = [&](const char* metric) {
      return absl::StrCat("</td><td class=\"num\">", EstimateText(statistics.Of(arm, metric), ok));
    };
    absl::StrAppend(&out, "<tr class=\"arm-row\" data-arm=\"", XmlEscape(arm),
                    "\"><th><span style=\"color:", PaletteColor(a), "\">■</span> ", XmlEscape(arm),
                    "</th><td class=\"num\">", ok, "/", total, cell("final_eval_accuracy"),
                    cell("reward_mean_last_quarter"), cell("loss_distill_trend"),
                    cell("kappa_median"), cell("kappa_effective_median"),
                    cell("kdr_negative_weighted_fraction_median"), "</td><td>", AlarmText(alarms),
                    "</td><td>", XmlEscape(arms[a].description), "</td></tr>\n");
  }
  return out + "</tbody></table>\n";
}

// Per arm, the per-subset metrics (none: empty).
std::string SubsetTable(const std::vector<AblationArm>& arms,
                        const std::vector<ExperimentRunSeries>& runs,
                        const ArmStatistics& statistics) {
  std::vector<const ComparedMetric*> columns;
  for (const ComparedMetric& metric : statistics.metrics) {
    if (!metric.subset.empty()) columns.push_back(&metric);
  }
  if (columns.empty()) return "";
  std::string out = "<table class=\"subsets\"><thead><tr><th>arm</th>";
  for (const ComparedMetric* metric : columns) {
    absl::StrAppend(&out, "<th>", XmlEscape(metric->label), "</th>");
  }
  absl::StrAppend(&out, "</tr></thead><tbody>\n");
  for (const AblationArm& arm : arms) {
    int ok = 0;
    for (const ExperimentRunSeries& run : runs) {
      if (run.result->arm == arm.name && run.result->status == "ok") ++ok;
    }
    absl::StrAppend(&out, "<tr class=\"subset-row\"><th>", XmlEscape(arm.name), "</th>");
    for (const ComparedMetric* metric : columns) {
      absl::StrAppend(&out, "<td class=\"num\">",
                      EstimateText(statistics.Of(arm.name, metric->name), ok), "</td>");
    }
    absl::StrAppend(&out, "</tr>\n");
  }
  return absl::StrCat("<h3>Per prompt subset</h3>\n", out, "</tbody></table>\n");
}

// The headline metrics' differences against the baseline, as in results.md.
std::string DifferencesSection(const ArmStatistics& statistics, const std::string& baseline) {
  if (baseline.empty() || statistics.differences.empty()) {
    return "<p class=\"meta\">No baseline arm, so no paired differences.</p>\n";
  }
  std::string out = absl::StrCat(
      "<h2>Differences against ", XmlEscape(baseline),
      " (paired by seed)</h2>\n<p class=\"meta\">Mean over seeds of (arm − ", XmlEscape(baseline),
      "), over the seeds where both runs finished ok and have the number, with its 95 % "
      "confidence interval (paired t) and the two-sided paired t-test's p; p Holm: Holm's "
      "adjustment over the arms compared in that metric; significant: p Holm &lt; 0.05 with at "
      "least 3 pairs.</p>\n"
      "<table class=\"differences\"><thead><tr><th>arm</th><th>metric</th><th>n pairs</th>"
      "<th>diff [95 % CI]</th><th>p</th><th>p Holm</th><th>significant</th></tr></thead>"
      "<tbody>\n");
  for (const ArmDifference& d : statistics.differences) {
    const ComparedMetric* metric = nullptr;
    for (const ComparedMetric& m : statistics.metrics) {
      if (m.name == d.metric) metric = &m;
    }
    if (metric == nullptr || !metric->headline) continue;
    const std::string significance = !d.difference || !d.difference->p_value ? "–"
                                     : d.significant                         ? "<b>yes</b>"
                                                                             : "no";
    absl::StrAppend(&out, "<tr class=\"diff-row\" data-diff=\"", XmlEscape(d.arm), ":",
                    XmlEscape(d.metric), "\"><th>", XmlEscape(d.arm), "</th><td>",
                    XmlEscape(metric->label), "</td><td class=\"num\">", d.n_pairs(),
                    "</td><td class=\"num\">", XmlEscape(FormatDifference(d, kHtmlFormat)),
                    "</td><td class=\"num\">",
                    XmlEscape(FormatPValue(d.difference ? d.difference->p_value : std::nullopt)),
                    "</td><td class=\"num\">", XmlEscape(FormatPValue(d.p_holm)), "</td><td>",
                    significance, "</td></tr>\n");
  }
  absl::StrAppend(&out, "</tbody></table>\n<p>",
                  XmlEscape(SignificanceSentence(statistics.differences, statistics.metrics)),
                  "</p>\n");
  return out;
}

std::string RunTable(const std::vector<ExperimentRunSeries>& runs,
                     const std::vector<RunMetrics>& metrics) {
  std::string out =
      "<table class=\"runs\"><thead><tr><th>run</th><th>arm</th><th>seed</th><th>status</th>"
      "<th>steps</th><th>final held-out acc</th><th>L_D trend</th><th>κ median</th>"
      "<th>alarms</th><th>wall time</th><th>note</th></tr></thead><tbody>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunResult& r = *runs[i].result;
    const RunMetrics& m = metrics[i];
    const bool have = runs[i].series.has_value();
    const std::string name =
        runs[i].report_link.empty()
            ? XmlEscape(r.name)
            : absl::StrCat("<a href=\"", XmlEscape(runs[i].report_link), "\">", XmlEscape(r.name), "</a>");
    absl::StrAppend(&out, "<tr class=\"run-row\" data-run=\"", XmlEscape(r.name), "\"><td>", name,
                    "</td><td>", XmlEscape(r.arm), "</td><td class=\"num\">", r.seed, "</td><td>",
                    XmlEscape(r.status), "</td><td class=\"num\">", have ? absl::StrCat(m.records) : "–",
                    "</td><td class=\"num\">", FormatValue(m.final_accuracy), "</td><td class=\"num\">",
                    FormatValue(m.distill_trend), "</td><td class=\"num\">", FormatValue(m.kappa_median),
                    "</td><td>", have ? AlarmText(m.alarms) : "–", "</td><td class=\"num\">",
                    FormatSeconds(r.wall_seconds), "</td><td>", XmlEscape(r.error),
                    have && runs[i].series->skipped_lines > 0
                        ? absl::StrCat(" ", runs[i].series->skipped_lines, " malformed lines skipped")
                        : "",
                    "</td></tr>\n");
  }
  return out + "</tbody></table>\n";
}

}  // namespace

std::string ExperimentReportHtml(const std::string& title, const std::string& context,
                                 const std::vector<AblationArm>& arms,
                                 const std::vector<ExperimentRunSeries>& runs,
                                 const std::string& baseline) {
  std::vector<RunMetrics> metrics;
  int64_t max_steps = 0;
  for (const ExperimentRunSeries& run : runs) {
    metrics.push_back(run.series ? SummarizeMetrics(run.series->records) : RunMetrics{});
    max_steps = std::max(max_steps, metrics.back().last_step.value_or(0));
  }
  // About fifty independent points across the run, whatever its length.
  const int window = static_cast<int>(std::max<int64_t>(1, max_steps / 50));
  const ChartSpec specs[] = {
      {"exp_eval_accuracy", metrics_jsonl::kEvalAccuracy, "Held-out accuracy", "fraction correct",
       false, false, true},
      {"exp_reward", metrics_jsonl::kRewardMean, "Reward mean", "fraction correct", false, true,
       true},
      {"exp_loss_distill", metrics_jsonl::kLossDistill, "Distillation loss L_D", "loss", false,
       true, false},
      {"exp_kappa", metrics_jsonl::kKappa, "κ = ‖∇L_R‖ / ‖∇L_D‖", "ratio (log)", true, true, false},
  };
  std::string body = absl::StrCat("<h1>", XmlEscape(title), "</h1>\n<p class=\"meta\">",
                                  XmlEscape(context), "</p>\n");
  const ArmStatistics statistics = ComputeStatistics(arms, runs, metrics, baseline);
  absl::StrAppend(&body, "<h2>Arms</h2>\n", ArmTable(arms, runs, metrics, statistics),
                  SubsetTable(arms, runs, statistics), DifferencesSection(statistics, baseline));
  absl::StrAppend(&body, "<h2>Curves</h2>\n<div class=\"charts\">\n");
  for (const ChartSpec& spec : specs) {
    absl::StrAppend(&body, "<div>", ComparisonChart(spec, arms, runs, window), "</div>\n");
  }
  absl::StrAppend(&body, "</div>\n<h2>Runs</h2>\n", RunTable(runs, metrics));
  return HtmlDocument(title, body);
}

absl::Status WriteExperimentReport(const std::string& out_dir, const std::string& title,
                                   const std::string& context,
                                   const std::vector<AblationArm>& arms,
                                   const std::vector<RunResult>& results) {
  return WriteExperimentReport(out_dir, title, context, arms, results, DefaultBaseline(arms));
}

absl::Status WriteExperimentReport(const std::string& out_dir, const std::string& title,
                                   const std::string& context, const std::vector<AblationArm>& arms,
                                   const std::vector<RunResult>& results,
                                   const std::string& baseline) {
  std::vector<ExperimentRunSeries> runs;
  for (const RunResult& result : results) {
    ExperimentRunSeries run;
    run.result = &result;
    const std::string run_dir = absl::StrCat(out_dir, "/runs/", result.name);
    if (absl::StatusOr<RunSeries> series = LoadRunSeries(run_dir); series.ok()) {
      run.series = *std::move(series);
      // The run's own page is cheap to regenerate; it is what a row links to.
      const std::string html =
          RunReportHtml(*run.series, absl::StrCat("kappa run report: ", result.name));
      if (services::WriteFileAtomically(run_dir + "/report.html", html).ok()) {
        run.report_link = absl::StrCat("runs/", result.name, "/report.html");
      }
    }
    runs.push_back(std::move(run));
  }
  return services::WriteFileAtomically(absl::StrCat(out_dir, "/report.html"),
                                       ExperimentReportHtml(title, context, arms, runs, baseline));
}

}  // namespace kappa::cli
