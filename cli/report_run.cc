#include "cli/report_run.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/experiment_results.h"
#include "cli/report_atlas.h"
#include "cli/report_html.h"
#include "cli/report_svg.h"
#include "learner/metrics_schema.h"
#include "services/atomic_file.h"

namespace kappa::cli {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> StepAxis(const RunSeries& s) {
  return std::vector<double>(s.steps.begin(), s.steps.end());
}

ChartSeries Line(const RunSeries& s, const std::string& field, const std::string& name,
                 size_t color) {
  ChartSeries line;
  line.name = name;
  line.color = PaletteColor(color);
  line.x = StepAxis(s);
  line.y = s.Series(field);
  return line;
}

// Long runs are noise at one point per step: the raw curve goes faint and a
// moving average (about 50 independent points over the run) is drawn on it.
int SmoothingWindow(const RunSeries& s) {
  return s.steps.size() > 200 ? static_cast<int>(s.steps.size() / 50) : 1;
}

void AddSmoothed(const RunSeries& s, std::vector<ChartSeries>* series) {
  const int window = SmoothingWindow(s);
  if (window <= 1) return;
  std::vector<ChartSeries> smoothed;
  for (ChartSeries& raw : *series) {
    if (raw.dots) continue;  // sparse already (held-out accuracy)
    ChartSeries mean = raw;
    mean.name = absl::StrCat(raw.name, ", mean of ", window);
    mean.y = MovingAverage(raw.y, window);
    mean.width = 2;
    raw.opacity = 0.3;
    raw.width = 1;
    smoothed.push_back(std::move(mean));
  }
  for (ChartSeries& mean : smoothed) series->push_back(std::move(mean));
}

std::vector<ChartMarker> AlarmMarkers(const RunSeries& s, const std::string& only_kind = "") {
  std::vector<ChartMarker> markers;
  for (const AlarmMark& alarm : s.alarms) {
    if (!only_kind.empty() && alarm.kind != only_kind) continue;
    markers.push_back({static_cast<double>(alarm.step), alarm.kind,
                       absl::StrCat("step ", alarm.step, ": ", alarm.kind,
                                    alarm.message.empty() ? "" : " — ", alarm.message),
                       AlarmColor(alarm.kind)});
  }
  return markers;
}

int64_t CountFinite(const std::vector<double>& values) {
  return std::count_if(values.begin(), values.end(), [](double v) { return std::isfinite(v); });
}

// L_D of a step that distilled nothing is logged as 0 but is no measurement
// (as in SummarizeMetrics): a gap, not a dip to zero.
std::vector<double> MeasuredDistillLoss(const RunSeries& s) {
  std::vector<double> loss = s.Series(metrics_jsonl::kLossDistill);
  const std::vector<double> positions = s.Series(metrics_jsonl::kDistillPositions);
  for (size_t i = 0; i < loss.size(); ++i) {
    if (positions[i] == 0) loss[i] = kNaN;
  }
  return loss;
}

// κ, with its effective value and threshold, and the two gradient norms it
// is the ratio of.
std::vector<LineChart> KappaAndGradientCharts(const RunSeries& s) {
  const int64_t train_steps =
      std::count_if(s.steps.begin(), s.steps.end(), [](int64_t step) { return step >= 1; });
  LineChart kappa;
  kappa.id = "kappa";
  kappa.title = "κ = ‖∇L_R‖ / ‖∇L_D‖";
  if (s.lora_rank > 0) {
    // Only the adapters train: the gradients, and so κ, are theirs.
    absl::StrAppend(&kappa.title, " over the LoRA adapters (r = ", s.lora_rank, ", ",
                    s.lora_targets, " projections per layer)");
  }
  const int64_t measured = CountFinite(s.Series(metrics_jsonl::kKappa));
  kappa.subtitle = absl::StrCat("measured on ", measured, " of ", train_steps,
                                " steps; κ_eff = κ/λ when naive; alarm: κ_eff EMA > threshold");
  kappa.y_label = "ratio (log)";
  kappa.log_y = true;
  kappa.series = {Line(s, metrics_jsonl::kKappa, "κ", 0),
                  Line(s, metrics_jsonl::kKappaEffective, "κ_eff", 1)};
  kappa.series[1].dashed = true;  // equal to κ when λ = 1: both stay visible
  AddSmoothed(s, &kappa.series);
  kappa.thresholds.push_back(
      {s.kappa_threshold,
       absl::StrCat("alarms.kappa_threshold", s.thresholds_from_config ? "" : " (default)"),
       "#d62728"});
  kappa.markers = AlarmMarkers(s);

  LineChart norms;
  norms.id = "grad_norms";
  norms.title = "Gradient norms ‖∇L_R‖ and ‖∇L_D‖";
  norms.y_label = "L2 norm (log)";
  norms.log_y = true;
  norms.series = {Line(s, metrics_jsonl::kGradNormReward, "‖∇L_R‖", 0),
                  Line(s, metrics_jsonl::kGradNormDistill, "‖∇L_D‖", 1)};
  // After M3 only when it changed something (naive mixing logs it equal).
  const std::vector<double> raw = s.Series(metrics_jsonl::kGradNormReward);
  const std::vector<double> balanced = s.Series(metrics_jsonl::kGradNormRewardBalanced);
  bool differs = false;
  for (size_t i = 0; i < raw.size(); ++i) {
    differs |= std::isfinite(balanced[i]) &&
               !(std::fabs(balanced[i] - raw[i]) <= 1e-9 * std::fabs(raw[i]));
  }
  if (differs) {
    ChartSeries after_m3 = Line(s, metrics_jsonl::kGradNormRewardBalanced, "‖∇L_R‖ after M3", 2);
    after_m3.dashed = true;
    norms.series.push_back(std::move(after_m3));
  }
  return {std::move(kappa), std::move(norms)};
}

// The losses (L_D only where measured), and reward with held-out accuracy.
std::vector<LineChart> LossAndRewardCharts(const RunSeries& s) {
  LineChart losses;
  losses.id = "losses";
  losses.title = "Losses";
  losses.subtitle = "L_D left out on steps that distilled no position";
  losses.y_label = "loss";
  losses.series = {Line(s, metrics_jsonl::kLossReward, "L_R", 0)};
  ChartSeries distill = Line(s, metrics_jsonl::kLossDistill, "L_D", 1);
  distill.y = MeasuredDistillLoss(s);
  losses.series.push_back(std::move(distill));
  const std::vector<double> sft = s.Series(metrics_jsonl::kLossSft);
  if (std::any_of(sft.begin(), sft.end(), [](double v) { return std::isfinite(v) && v != 0; })) {
    losses.series.push_back(Line(s, metrics_jsonl::kLossSft, "L_SFT", 2));
  }
  AddSmoothed(s, &losses.series);

  LineChart reward;
  reward.id = "reward";
  reward.title = "Reward mean and held-out accuracy";
  reward.y_label = "fraction correct";
  reward.fixed_y = true;
  reward.y_min = 0;
  reward.y_max = 1;
  reward.series = {Line(s, metrics_jsonl::kRewardMean, "reward mean (batch)", 0)};
  AddSmoothed(s, &reward.series);
  ChartSeries eval = Line(s, metrics_jsonl::kEvalAccuracy, "held-out accuracy", 2);
  eval.dots = true;
  eval.width = 2;
  reward.series.push_back(std::move(eval));
  reward.markers = AlarmMarkers(s);
  return {std::move(losses), std::move(reward)};
}

// Where the reward and distillation gradients disagree: the K_DR < 0
// fractions with the conflict threshold, and the gradients' cosine.
std::vector<LineChart> ConflictCharts(const RunSeries& s) {
  LineChart negative;
  negative.id = "kdr_negative";
  negative.title = "K_DR < 0: fraction of positions";
  negative.subtitle =
      "directional conflict fires when the weighted fraction stays above the threshold";
  negative.y_label = "fraction";
  negative.fixed_y = true;
  negative.y_min = 0;
  negative.y_max = 1;
  negative.series = {
      Line(s, metrics_jsonl::kKdrNegativeFraction, "negative fraction", 0),
      Line(s, metrics_jsonl::kKdrNegativeWeightedFraction, "|K|-weighted negative fraction", 1)};
  AddSmoothed(s, &negative.series);
  negative.thresholds.push_back({s.conflict_threshold, "alarms.conflict_threshold", "#9467bd"});
  negative.markers = AlarmMarkers(s, "directional_conflict");

  LineChart cosine;
  cosine.id = "grad_cosine";
  cosine.title = "cos(∇L_R, ∇L_D)";
  cosine.y_label = "cosine";
  cosine.fixed_y = true;
  cosine.y_min = -1;
  cosine.y_max = 1;
  cosine.series = {Line(s, metrics_jsonl::kGradCosine, "cosine", 0)};
  AddSmoothed(s, &cosine.series);
  cosine.thresholds.push_back({0.0, "0", "#999999"});
  return {std::move(negative), std::move(cosine)};
}

// The student's entropy and the distillation weight λ (with the applied scale).
std::vector<LineChart> PolicyCharts(const RunSeries& s) {
  LineChart entropy;
  entropy.id = "entropy";
  entropy.title = "Student entropy";
  entropy.y_label = "nats per token";
  entropy.series = {Line(s, metrics_jsonl::kEntropy, "entropy", 0)};
  AddSmoothed(s, &entropy.series);

  LineChart lambda;
  lambda.id = "lambda";
  lambda.title = "λ (distillation weight)";
  lambda.y_label = "λ";
  lambda.series = {Line(s, metrics_jsonl::kLambda, "λ", 0)};
  if (s.Has(metrics_jsonl::kDistillScale)) {
    ChartSeries scale = Line(s, metrics_jsonl::kDistillScale, "applied L_D scale", 1);
    scale.dashed = true;
    lambda.series.push_back(std::move(scale));
  }
  return {std::move(entropy), std::move(lambda)};
}

// The system: throughput, step time and the staleness of consumed groups.
std::vector<LineChart> SystemCharts(const RunSeries& s) {
  LineChart throughput;
  throughput.id = "throughput";
  throughput.title = "Throughput";
  throughput.y_label = "per second (log)";
  throughput.log_y = true;
  throughput.series = {Line(s, "tokens_per_second", "tokens/s", 0),
                       Line(s, metrics_jsonl::kSamplesPerSecond, "samples/s", 1)};

  LineChart step_time;
  step_time.id = "step_seconds";
  step_time.title = "Step time";
  step_time.y_label = "seconds";
  step_time.series = {Line(s, metrics_jsonl::kStepSeconds, "training step", 0)};
  if (s.Has(metrics_jsonl::kKdrExactSeconds)) {
    step_time.series.push_back(Line(s, metrics_jsonl::kKdrExactSeconds, "exact K_DR", 1));
  }

  LineChart staleness;
  staleness.id = "staleness";
  staleness.title = "Staleness of consumed groups";
  staleness.y_label = "policy versions";
  staleness.series = {Line(s, metrics_jsonl::kStalenessMean, "mean staleness", 0)};
  return {std::move(throughput), std::move(step_time), std::move(staleness)};
}

// The line charts of RunChartIds(), in that order, rendered.
std::vector<std::string> Charts(const RunSeries& s) {
  std::vector<std::string> charts;
  for (const auto& group :
       {KappaAndGradientCharts, LossAndRewardCharts, ConflictCharts, PolicyCharts, SystemCharts}) {
    for (const LineChart& chart : group(s)) charts.push_back(RenderLineChart(chart));
  }
  return charts;
}

std::string PositionHeatmap(const RunSeries& s) {
  Heatmap h;
  h.id = "kdr_position_heatmap";
  h.title = "K_DR by relative position in the response";
  h.subtitle = "mean K_DR per position bucket and step; red: reward step raises L_D there";
  h.y_label = "position (start → end)";
  h.value_label = "mean K_DR";
  size_t buckets = 0;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    if (s.kdr_position_mean[i].empty()) continue;
    h.x.push_back(static_cast<double>(s.steps[i]));
    h.cells.push_back(s.kdr_position_mean[i]);
    buckets = std::max(buckets, s.kdr_position_mean[i].size());
  }
  for (size_t b = 0; b < buckets; ++b) {
    h.row_labels.push_back(absl::StrFormat("%d–%d%%", static_cast<int>(100 * b / buckets),
                                           static_cast<int>(100 * (b + 1) / buckets)));
  }
  return RenderHeatmap(h);
}

// metrics.jsonl's kdr_positions_by_subset summed over the steps the atlas
// has entries of: what the atlas's subset shares compare with.
AtlasContext AtlasContextOf(const RunSeries& s) {
  AtlasContext context;
  if (!s.atlas.ok()) return context;
  std::set<int64_t> atlas_steps;
  for (const AtlasEntry& entry : s.atlas->entries) atlas_steps.insert(entry.step);
  for (size_t i = 0; i < s.records.size(); ++i) {
    if (atlas_steps.count(s.steps[i]) == 0) continue;
    auto by_subset = s.records[i].find(metrics_jsonl::kKdrPositionsBySubset);
    if (by_subset == s.records[i].end() || !by_subset->is_object()) continue;
    for (const auto& [subset, positions] : by_subset->items()) {
      if (positions.is_number_integer()) {
        context.positions_by_subset[subset] += positions.get<int64_t>();
      }
    }
  }
  return context;
}

// The atlas's malformed lines (the first few, then how many more) and a read
// error other than its absence, for the command's warnings.
std::vector<std::string> AtlasProblems(const absl::StatusOr<ConflictAtlasFile>& atlas) {
  if (!atlas.ok()) {
    if (absl::IsNotFound(atlas.status())) return {};
    return {absl::StrCat("conflict atlas: ", atlas.status().message())};
  }
  constexpr size_t kListed = 10;
  std::vector<std::string> problems(
      atlas->problems.begin(), atlas->problems.begin() + std::min(kListed, atlas->problems.size()));
  if (atlas->problems.size() > kListed) {
    problems.push_back(absl::StrCat(atlas->path, ": ", atlas->problems.size() - kListed,
                                    " more malformed lines skipped"));
  }
  return problems;
}

std::optional<double> QuarterMean(const std::vector<double>& values, bool last) {
  std::vector<double> present;
  for (double v : values) {
    if (std::isfinite(v)) present.push_back(v);
  }
  if (present.size() < 2) return std::nullopt;
  const size_t quarter = std::max<size_t>(1, present.size() / 4);
  double sum = 0;
  const size_t begin = last ? present.size() - quarter : 0;
  for (size_t i = begin; i < begin + quarter; ++i) sum += present[i];
  return sum / static_cast<double>(quarter);
}

std::string SummaryTable(const RunSeries& s) {
  const RunMetrics m = SummarizeMetrics(s.records);
  std::optional<double> best;
  std::optional<int64_t> best_step;
  std::optional<double> initial;
  const std::vector<double> eval = s.Series(metrics_jsonl::kEvalAccuracy);
  for (size_t i = 0; i < eval.size(); ++i) {
    if (!std::isfinite(eval[i])) continue;
    if (s.steps[i] == 0) initial = eval[i];
    if (!best || eval[i] > *best) {
      best = eval[i];
      best_step = s.steps[i];
    }
  }
  auto at_step = [](const std::optional<double>& v, const std::optional<int64_t>& step) {
    return v ? absl::StrCat(FormatValue(v), step ? absl::StrCat(" (step ", *step, ")") : "")
             : std::string("–");
  };
  std::vector<double> steps_with_reward = s.Series(metrics_jsonl::kRewardMean);
  std::string rows;
  absl::StrAppend(&rows, TableRow("steps", "training steps recorded",
                                  {absl::StrCat(m.records), m.last_step ? absl::StrCat("last step ", *m.last_step) : "–"}));
  absl::StrAppend(&rows, TableRow("wall_time", "training wall time", {FormatSeconds(m.train_seconds), ""}));
  absl::StrAppend(&rows, TableRow("eval_accuracy", "held-out accuracy: initial / final",
                                  {FormatValue(initial), at_step(m.final_accuracy, m.final_accuracy_step)}));
  absl::StrAppend(&rows, TableRow("best_eval_accuracy", "held-out accuracy: best", {at_step(best, best_step), ""}));
  absl::StrAppend(&rows, TableRow("reward_quarters", "reward mean: first / last quarter",
                                  {FormatValue(QuarterMean(steps_with_reward, false)),
                                   FormatValue(QuarterMean(steps_with_reward, true))}));
  absl::StrAppend(&rows, TableRow("distill_quarters", "L_D: first / last quarter",
                                  {FormatValue(m.distill_first_quarter), FormatValue(m.distill_last_quarter)}));
  absl::StrAppend(&rows, TableRow("kappa_median", "median κ / κ_eff",
                                  {FormatValue(m.kappa_median), FormatValue(m.kappa_effective_median)}));
  absl::StrAppend(&rows, TableRow("kdr_negative_median", "median K_DR&lt;0 fraction / |K|-weighted",
                                  {FormatValue(m.kdr_negative_fraction_median),
                                   FormatValue(m.kdr_negative_weighted_fraction_median)}));
  std::map<std::string, AlarmStats> alarms = m.alarms;
  for (const std::string& kind : AlarmKinds()) alarms.try_emplace(kind);
  for (const auto& [kind, stats] : alarms) {
    absl::StrAppend(&rows, TableRow(absl::StrCat("alarm_", kind),
                                    absl::StrCat("alarms: <span style=\"color:", AlarmColor(kind),
                                                 "\">■</span> ", XmlEscape(kind)),
                                    {absl::StrCat(stats.count),
                                     stats.first_step ? absl::StrCat("first at step ", *stats.first_step) : "–"}));
  }
  return absl::StrCat("<table class=\"summary\"><tbody>\n", rows, "</tbody></table>\n");
}

std::string AlarmTable(const RunSeries& s) {
  if (s.alarms.empty()) return "<p class=\"meta\">No alarm fired.</p>\n";
  constexpr size_t kMaxRows = 200;
  std::string out = "<table class=\"alarms\"><thead><tr><th>step</th><th>kind</th><th>message</th></tr></thead><tbody>\n";
  for (size_t i = 0; i < s.alarms.size() && i < kMaxRows; ++i) {
    const AlarmMark& a = s.alarms[i];
    absl::StrAppend(&out, "<tr class=\"alarm-row\"><td class=\"num\">", a.step,
                    "</td><td><span style=\"color:", AlarmColor(a.kind), "\">■</span> ",
                    XmlEscape(a.kind), "</td><td>", XmlEscape(a.message), "</td></tr>\n");
  }
  absl::StrAppend(&out, "</tbody></table>\n");
  if (s.alarms.size() > kMaxRows) {
    absl::StrAppend(&out, "<p class=\"meta\">… and ", s.alarms.size() - kMaxRows,
                    " more (see metrics.jsonl).</p>\n");
  }
  return out;
}

std::string Notices(const RunSeries& s) {
  std::vector<std::string> items;
  if (s.skipped_lines > 0) {
    items.push_back(absl::StrCat(s.skipped_lines, " malformed line", s.skipped_lines == 1 ? "" : "s",
                                 " skipped; the charts use the other ", s.lines - s.skipped_lines));
    constexpr size_t kShown = 10;
    for (size_t i = 0; i < s.problems.size() && i < kShown; ++i) items.push_back(XmlEscape(s.problems[i]));
  }
  if (s.partial_tail) items.push_back("the last line is incomplete (run still writing?); left out");
  if (!s.config_problem.empty()) items.push_back(XmlEscape(s.config_problem));
  if (items.empty()) return "";
  std::string out = "<div class=\"notice\"><ul>";
  for (const std::string& item : items) absl::StrAppend(&out, "<li>", item, "</li>");
  return out + "</ul></div>\n";
}

}  // namespace

const std::vector<std::string>& RunChartIds() {
  static const std::vector<std::string> ids = {
      "kappa",   "grad_norms", "losses",     "reward",       "kdr_negative", "grad_cosine",
      "entropy", "lambda",     "throughput", "step_seconds", "staleness",    "kdr_position_heatmap"};
  return ids;
}

std::string RunReportHtml(const RunSeries& series, const std::string& title) {
  std::string body = absl::StrCat("<h1>", XmlEscape(title), "</h1>\n<p class=\"meta\">",
                                  XmlEscape(series.metrics_path), " — ", series.records.size(),
                                  " records, ", series.alarms.size(), " alarm events</p>\n",
                                  Notices(series));
  absl::StrAppend(&body, "<h2>Summary</h2>\n", SummaryTable(series));
  absl::StrAppend(&body, "<h2>Training dynamics</h2>\n<div class=\"charts\">\n");
  for (const std::string& chart : Charts(series)) absl::StrAppend(&body, "<div>", chart, "</div>\n");
  absl::StrAppend(&body, "</div>\n<h2>K_DR by response position</h2>\n<div class=\"wide\">",
                  PositionHeatmap(series), "</div>\n");
  absl::StrAppend(&body, "<h2>Conflict atlas</h2>\n",
                  ConflictAtlasSectionHtml(series.atlas, AtlasContextOf(series)));
  absl::StrAppend(&body, "<h2>Alarms</h2>\n", AlarmTable(series));
  absl::StrAppend(&body, "<h2>Configuration</h2>\n<p class=\"meta\">", XmlEscape(series.config_path),
                  "</p>\n<pre class=\"config\">",
                  series.config_text.empty() ? "(not available)" : XmlEscape(series.config_text),
                  "</pre>\n");
  return HtmlDocument(title, body);
}

absl::StatusOr<RunReportOutcome> WriteRunReport(const std::string& run_dir,
                                                const std::string& out_path) {
  absl::StatusOr<RunSeries> series = LoadRunSeries(run_dir);
  if (!series.ok()) return series.status();
  RunReportOutcome outcome;
  outcome.path = out_path.empty() ? run_dir + "/report.html" : out_path;
  outcome.steps = std::count_if(series->steps.begin(), series->steps.end(),
                                [](int64_t step) { return step >= 1; });
  outcome.skipped_lines = series->skipped_lines;
  outcome.problems = series->problems;
  if (!series->config_problem.empty()) outcome.problems.push_back(series->config_problem);
  for (std::string& problem : AtlasProblems(series->atlas)) {
    outcome.problems.push_back(std::move(problem));
  }
  std::filesystem::path dir = std::filesystem::path(run_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "runs/demo/"
  const std::string name = dir.filename().string();
  const std::string html = RunReportHtml(*series, absl::StrCat("kappa run report: ", name));
  if (absl::Status status = services::WriteFileAtomically(outcome.path, html); !status.ok()) return status;
  return outcome;
}

}  // namespace kappa::cli
