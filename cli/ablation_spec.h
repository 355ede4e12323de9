// The ablation file read by `kappa experiment`: a base run configuration,
// seeds, overrides shared by every run, and a list of arms (named override
// sets). Expanded into one `kappa run` per (arm, seed).
//
//   base: demo.yaml             # relative to this file's directory
//   seeds: [1, 2, 3]
//   overrides: [trainer.steps=300]
//   quick: {seeds: [1], overrides: [trainer.steps=100]}   # --quick
//   baseline: naive             # optional: the arm the others are compared with
//   effects: {final_eval_accuracy: 0.1}   # optional: the power is reported for these
//   trend:                      # optional: one regression over several arms' runs
//     metric: eval_accuracy_auc         # y, a results.csv column
//     against: kappa_effective_median   # x, a results.csv column
//     log10: true                       # x as its base-10 logarithm
//     arms: [naive_l1, naive_l0.03]     # every run of these arms is a point
//   arms:
//     - name: grpo_only
//       description: "GRPO alone"
//       overrides: [trainer.distill_gate=none]
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/config.h"

namespace kappa::cli {

struct AblationArm {
  std::string name;
  std::string description;
  std::vector<std::string> overrides;  // "key=value", as `kappa run` takes them
  int line = 0;                        // of the arm in the ablation file, for messages
};

// A pre-registered single test across arms: the least-squares slope of one
// run number against another over every run of `arms` (cli/experiment_trend.h).
struct TrendSpec {
  std::string metric;             // y: a results.csv column, e.g. eval_accuracy_auc
  std::string against;            // x: a results.csv column, e.g. kappa_effective_median
  bool log10 = false;             // x enters as log10(x); runs with x <= 0 are left out, named
  std::vector<std::string> arms;  // at least two, each an arm of the file
};

struct AblationSpec {
  std::string file;         // the ablation file, as given
  std::string base_config;  // resolved against the ablation file's directory
  std::vector<uint64_t> seeds;
  std::vector<std::string> overrides;  // applied to every run, before the arm's
  bool has_quick = false;
  std::vector<uint64_t> quick_seeds;            // empty: keep `seeds`
  std::vector<std::string> quick_overrides;     // appended to `overrides`
  std::vector<AblationArm> arms;
  // The arm the results compare every other arm with, paired by seed;
  // empty: no comparison. Without the key: "naive" when an arm has that
  // name; `baseline: null` (or an empty value) asks for none.
  std::string baseline;
  // metric (a results.csv column, e.g. final_eval_accuracy) -> the effect
  // size the experiment's pre-registered rule names for it; the results
  // report the paired test's power to find it.
  std::map<std::string, double> effects;
  std::optional<TrendSpec> trend;
};

// The baseline of a file without a `baseline` key: "naive" when an arm has
// that name, else empty.
std::string DefaultBaseline(const std::vector<AblationArm>& arms);

// One `kappa run` of the experiment.
struct PlannedRun {
  std::string arm;
  uint64_t seed = 0;
  std::string name;                    // "<arm>-s<seed>": the run directory's name
  std::vector<std::string> overrides;  // everything after `kappa run <base>`
};

// Parses the ablation file. Errors (INVALID_ARGUMENT, NOT_FOUND) start with
// "<file>:<line>: " whenever a line is known: unknown keys, an arm without a
// name, duplicate arm names, seeds that are not non-negative integers,
// overrides that are not "key=value" strings, a baseline that names no arm,
// a trend without metric or against, or with fewer than two arms or one that
// is not an arm.
absl::StatusOr<AblationSpec> LoadAblationSpec(const std::string& path);
// The same from text (`file_name` for messages and for resolving `base`).
absl::StatusOr<AblationSpec> ParseAblationSpec(const std::string& yaml_text,
                                               const std::string& file_name);

// --quick: the quick seeds replace the seeds, the quick overrides are
// appended (so they win). FAILED_PRECONDITION when the file has no `quick`.
absl::Status ApplyQuick(AblationSpec* spec);

// Appends command-line overrides to the common ones (after the file's and
// the quick ones). The keys the experiment sets per run (name, runs_dir,
// seed) are refused, as in the file.
absl::Status AppendCommonOverrides(AblationSpec* spec, const std::vector<std::string>& overrides);

// Arms in file order, seeds in order within each arm. `runs_dir` is passed to
// every run, so all run directories land under it.
std::vector<PlannedRun> PlanRuns(const AblationSpec& spec, const std::string& runs_dir);

// Loads the base config with each run's overrides (services::LoadConfig), so
// an unknown key or a wrong type fails before minutes of training are spent;
// one config per run, in order. The message names the ablation file, the
// arm's line and the arm (or "common overrides" when those are wrong).
absl::StatusOr<std::vector<services::Config>> ResolveRunConfigs(
    const AblationSpec& spec, const std::vector<PlannedRun>& runs);

}  // namespace kappa::cli
