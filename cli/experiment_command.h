// `kappa experiment ABLATION.yaml [key=value ...] [--quick] [--resume] [--out DIR]`:
// one `kappa run` per (arm, seed) of the ablation file, one after another,
// then results.csv (per run) and results.md (per arm, mean ± std over seeds)
// in DIR (default <base runs_dir>/<ablation file stem>). Command-line
// overrides apply to every run, after the file's common overrides and before
// each arm's. A previous DIR is moved aside; with --resume it is kept
// instead, and a run whose metrics.jsonl there reaches its trainer.steps is
// not run again: its metrics are read back into the results (so an
// interrupted experiment, or one with failed runs, is finished by running
// the same command with --resume).
#pragma once

#include <string>
#include <vector>

namespace kappa::cli {

// args: everything after "experiment". Returns 0 when every run finished,
// 1 when one failed (the others still ran and are reported) or the ablation
// file is wrong, 2 usage, 130 interrupted.
int ExperimentCommand(const std::vector<std::string>& args);

}  // namespace kappa::cli
