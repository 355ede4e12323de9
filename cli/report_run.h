// The single-run page of `kappa report RUN_DIR`: the curves of the Grafana
// dashboard (κ, gradient norms, losses, reward and held-out accuracy, K_DR,
// cosine, entropy, λ, throughput, staleness) with alarm markers, the K_DR by
// response-position heatmap, the conflict atlas (cli/report_atlas.h: the
// positions with the most negative K_DR), a summary table, the alarms and the
// config.
//
// Chart ids (data-chart=...): kappa, grad_norms, losses, reward, kdr_negative,
// grad_cosine, entropy, lambda, throughput, step_seconds, staleness,
// kdr_position_heatmap. Every chart is always present ("no data" when the run
// has none), so a page's layout does not depend on the run; so is the
// <section data-section="conflict_atlas"> after the heatmap (saying so when
// the run has no atlas).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/report_data.h"

namespace kappa::cli {

// The ids above, in page order.
const std::vector<std::string>& RunChartIds();

std::string RunReportHtml(const RunSeries& series, const std::string& title);

struct RunReportOutcome {
  std::string path;          // the page written
  int64_t steps = 0;         // training steps drawn (step 0, the evaluation before, not counted)
  int64_t skipped_lines = 0;
  // What was skipped and why (metrics.jsonl's lines, then the atlas's),
  // config trouble, an unreadable atlas.
  std::vector<std::string> problems;
};

// Loads `run_dir` and writes the page to `out_path` (empty: RUN_DIR/report.html).
// NOT_FOUND when metrics.jsonl is missing; malformed lines (of metrics.jsonl
// or conflict_atlas.jsonl) are reported in the outcome (and on the page), not
// as an error; `skipped_lines` counts metrics.jsonl's only.
absl::StatusOr<RunReportOutcome> WriteRunReport(const std::string& run_dir,
                                                const std::string& out_path);

}  // namespace kappa::cli
