// The comparison page `kappa experiment` writes next to results.md: per arm,
// overlaid curves of held-out accuracy, reward, L_D and κ (the mean over the
// arm's seeds, bold, over each run's own curve, faint) and the results
// tables: per arm, mean ± 95 % CI half-width over its runs that finished ok
// (and per prompt subset when the metrics have subsets); the paired-by-seed
// differences against the baseline arm, as in results.md; per run, linking
// each run's own report, which is written too.
//
// Chart ids: exp_eval_accuracy, exp_reward, exp_loss_distill, exp_kappa.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/ablation_spec.h"
#include "cli/experiment_results.h"
#include "cli/report_data.h"

namespace kappa::cli {

struct ExperimentRunSeries {
  const RunResult* result = nullptr;
  std::optional<RunSeries> series;  // unset: no metrics.jsonl (yet)
  std::string report_link;          // relative href of the run's page; empty: none
};

// `baseline`: the arm the differences table compares the others with
// (empty: no table). The statistics are of the metrics in `runs`' series
// (RunResult::metrics is not read).
std::string ExperimentReportHtml(const std::string& title, const std::string& context,
                                 const std::vector<AblationArm>& arms,
                                 const std::vector<ExperimentRunSeries>& runs,
                                 const std::string& baseline);

// Reads OUT/runs/<name>/metrics.jsonl of every run, writes each run's
// report.html beside it and OUT/report.html. A run without metrics is
// listed, not an error; the status is that of writing the pages.
absl::Status WriteExperimentReport(const std::string& out_dir, const std::string& title,
                                   const std::string& context, const std::vector<AblationArm>& arms,
                                   const std::vector<RunResult>& results,
                                   const std::string& baseline);
// The same against DefaultBaseline(arms).
absl::Status WriteExperimentReport(const std::string& out_dir, const std::string& title,
                                   const std::string& context,
                                   const std::vector<AblationArm>& arms,
                                   const std::vector<RunResult>& results);

}  // namespace kappa::cli
