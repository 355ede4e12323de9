// What `kappa report` draws, read from a run directory: metrics.jsonl as
// per-step series (NaN where a step has no value, so charts show gaps, never
// zeros), the alarm events, the K_DR-by-position rows, config.yaml and the
// conflict atlas (cli/report_atlas.h).
//
// Reading is forgiving because the run may still be writing: a partial last
// line is expected and silently left out; any other line that is not a JSON
// object with an integer "step" is skipped and reported as "<file>:<line>:
// why", and everything else is still drawn.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/report_atlas.h"

namespace kappa::cli {

struct AlarmMark {
  int64_t step = 0;
  std::string kind;
  std::string message;
};

struct RunSeries {
  std::string metrics_path;  // as named in messages
  // Per-step records after de-duplication (a resumed run repeats the steps
  // after its last checkpoint; the later record wins), in step order. Step 0
  // is the evaluation before training.
  std::vector<nlohmann::json> records;
  std::vector<int64_t> steps;  // records[i]'s step
  // Every numeric top-level field, per step (aligned with `steps`); NaN where
  // the field is missing, null or not finite. Also "tokens_per_second",
  // derived from samples_per_second × tokens / samples.
  std::map<std::string, std::vector<double>> values;
  // kdr_position_mean per step (aligned with `steps`); empty where the step
  // did not measure K_DR. Elements may be NaN (an empty bucket).
  std::vector<std::vector<double>> kdr_position_mean;
  std::vector<AlarmMark> alarms;  // in step order

  int64_t lines = 0;          // non-empty lines read
  int64_t skipped_lines = 0;  // malformed lines left out (not the partial tail)
  std::vector<std::string> problems;  // "<file>:<line>: why", one per skipped line
  bool partial_tail = false;  // the file ended inside a line (run still writing)

  // config.yaml of the run directory, verbatim; empty with `config_problem`
  // set when it could not be read.
  std::string config_path;
  std::string config_text;
  std::string config_problem;
  // alarms.kappa_threshold / alarms.conflict_threshold from the config, else
  // the defaults of services::Config (`thresholds_from_config` false).
  double kappa_threshold = 10.0;
  double conflict_threshold = 0.5;
  bool thresholds_from_config = false;
  // student.lora from the config: rank 0 when every weight trained; else κ
  // and the gradient norms are over the adapters (docs/algorithms.md §3.4).
  int64_t lora_rank = 0;
  int64_t lora_targets = 0;  // projections per layer with adapters

  // <run_dir>/conflict_atlas.jsonl as LoadConflictAtlas read it; NOT_FOUND
  // when the run has none or the series was not loaded from a directory.
  absl::StatusOr<ConflictAtlasFile> atlas = absl::NotFoundError("no conflict atlas loaded");

  // The series of `field`; an all-NaN series when the field never appeared.
  std::vector<double> Series(const std::string& field) const;
  // Whether `field` has at least one finite value.
  bool Has(const std::string& field) const;
};

// Centred moving average over `window` consecutive finite values (fewer at
// the ends); NaN stays NaN, so gaps survive. window <= 1: `values` as is.
std::vector<double> MovingAverage(const std::vector<double>& values, int window);

// Parses metrics.jsonl text; `file_name` names it in `problems`.
RunSeries ParseMetricsText(const std::string& text, const std::string& file_name);

// Reads `config_text` (YAML) into the thresholds and the LoRA settings of
// `series`; a parse error
// goes to config_problem with the line.
void ApplyConfigText(const std::string& config_text, const std::string& file_name,
                     RunSeries* series);

// <run_dir>/metrics.jsonl, <run_dir>/config.yaml and the conflict atlas.
// NOT_FOUND naming the file when metrics.jsonl does not exist; a missing or
// broken config is not an error (config_problem says why, the default
// thresholds are used), nor is a missing or unreadable atlas (`atlas`).
absl::StatusOr<RunSeries> LoadRunSeries(const std::string& run_dir);

}  // namespace kappa::cli
