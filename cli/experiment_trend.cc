#include "cli/experiment_trend.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kappa::cli {
namespace {

std::string XLabel(const TrendSpec& spec) {
  return spec.log10 ? absl::StrCat("log10(", spec.against, ")") : spec.against;
}

// The point run `run` gives, or why it gives none.
std::optional<TrendPoint> PointOf(const RunResult& run, const TrendSpec& spec,
                                  const ComparedMetric& x_metric, const ComparedMetric& y_metric,
                                  std::string* why) {
  if (run.status != "ok" || !run.metrics) {
    *why = absl::StrCat("status ", run.status);
    return std::nullopt;
  }
  const std::optional<double> x = x_metric.value(*run.metrics);
  const std::optional<double> y = y_metric.value(*run.metrics);
  if (!x || !y) {
    *why = absl::StrCat("no ", !x ? spec.against : spec.metric);
    return std::nullopt;
  }
  if (spec.log10 && !(*x > 0.0)) {
    *why = absl::StrFormat("%s = %g, no logarithm", spec.against, *x);
    return std::nullopt;
  }
  return TrendPoint{run.name, run.arm, spec.log10 ? std::log10(*x) : *x, *y};
}

}  // namespace

TrendResult FitTrend(const TrendSpec& spec, const std::vector<RunResult>& runs,
                     const std::vector<ComparedMetric>& metrics) {
  TrendResult result;
  result.spec = spec;
  const ComparedMetric* x_metric = FindMetric(metrics, spec.against);
  const ComparedMetric* y_metric = FindMetric(metrics, spec.metric);
  if (x_metric == nullptr || y_metric == nullptr) {
    result.error = absl::StrCat("'", x_metric == nullptr ? spec.against : spec.metric,
                                "' is not a results.csv column");
    return result;
  }
  std::vector<double> x;
  std::vector<double> y;
  for (const RunResult& run : runs) {
    if (std::find(spec.arms.begin(), spec.arms.end(), run.arm) == spec.arms.end()) continue;
    std::string why;
    std::optional<TrendPoint> point = PointOf(run, spec, *x_metric, *y_metric, &why);
    if (!point) {
      result.left_out.push_back(absl::StrCat(run.name, ": ", why));
      continue;
    }
    x.push_back(point->x);
    y.push_back(point->y);
    result.points.push_back(*std::move(point));
  }
  result.fit = FitLine(x, y);
  return result;
}

std::string TrendCsv(const TrendResult& trend) {
  std::string csv = absl::StrCat("run,arm,", XLabel(trend.spec), ",", trend.spec.metric, "\n");
  for (const TrendPoint& p : trend.points) {
    absl::StrAppendFormat(&csv, "%s,%s,%.10g,%.10g\n", p.run, p.arm, p.x, p.y);
  }
  return csv;
}

std::string TrendMarkdown(const TrendResult& trend) {
  const TrendSpec& spec = trend.spec;
  std::string md = absl::StrCat("\n## Trend: ", spec.metric, " against ", XLabel(spec), "\n\n",
                                "Over every run of ", absl::StrJoin(spec.arms, ", "),
                                " (one least-squares line; one test, not adjusted).\n\n");
  if (!trend.error.empty()) return absl::StrCat(md, "Not fitted: ", trend.error, ".\n");
  if (!trend.fit) {
    absl::StrAppend(&md, "Not fitted: ", trend.points.size(),
                    " points (a line needs three, with two different x).\n");
  } else {
    const LineFit& fit = *trend.fit;
    absl::StrAppendFormat(
        &md,
        "slope **%+.4g** per unit of %s, 95 %% CI [%+.4g, %+.4g]; t = %.3g with %d df, "
        "p = %s (%s at 0.05); intercept %.4g; R² = %.3f; n = %d runs.\n",
        fit.slope, XLabel(spec), fit.ci_low(), fit.ci_high(), fit.t, fit.n - 2,
        FormatPValue(fit.p_value),
        fit.p_value < kSignificanceLevel ? "significant" : "not significant", fit.intercept,
        fit.r_squared, fit.n);
  }
  if (!trend.left_out.empty()) {
    absl::StrAppend(&md, "\nLeft out: ", absl::StrJoin(trend.left_out, "; "), ".\n");
  }
  absl::StrAppend(&md, "\n| run | ", XLabel(spec), " | ", spec.metric, " |\n|---|---|---|\n");
  for (const TrendPoint& p : trend.points) {
    absl::StrAppendFormat(&md, "| %s | %.4g | %.4g |\n", p.run, p.x, p.y);
  }
  return md;
}

}  // namespace kappa::cli
