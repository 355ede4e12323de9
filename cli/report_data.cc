#include "cli/report_data.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/jsonl_lines.h"
#include "learner/metrics_schema.h"
#include "services/config.h"

namespace kappa::cli {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double NumberOrNaN(const nlohmann::json& value) {
  if (!value.is_number()) return kNaN;
  const double v = value.get<double>();
  return std::isfinite(v) ? v : kNaN;
}

// Why `record` cannot be a step record, or empty when it can.
std::string Rejection(const nlohmann::json& record) {
  if (!record.is_object()) return "not a JSON object";
  auto step = record.find(metrics_jsonl::kStep);
  if (step == record.end()) return "no \"step\" field";
  if (!step->is_number_integer()) return "\"step\" is not an integer";
  return "";
}

void AddDerivedSeries(RunSeries* series) {
  // Tokens per second of wall time between steps: the learner logs samples/s
  // over the interval and the step's tokens, not tokens/s itself.
  const std::vector<double> sps = series->Series(metrics_jsonl::kSamplesPerSecond);
  const std::vector<double> tokens = series->Series(metrics_jsonl::kTokens);
  const std::vector<double> samples = series->Series(metrics_jsonl::kSamples);
  std::vector<double> tps(series->steps.size(), kNaN);
  bool any = false;
  for (size_t i = 0; i < tps.size(); ++i) {
    if (samples[i] > 0 && std::isfinite(sps[i]) && std::isfinite(tokens[i])) {
      tps[i] = sps[i] * tokens[i] / samples[i];
      any = true;
    }
  }
  if (any) series->values["tokens_per_second"] = std::move(tps);
}

// student.lora.target_modules as a YAML list or as the comma-separated
// text ConfigToYaml writes; absent: the default's count.
int64_t LoraTargetCount(const YAML::Node& targets) {
  if (!targets) return static_cast<int64_t>(services::Config().student.lora.target_modules.size());
  if (targets.IsSequence()) return static_cast<int64_t>(targets.size());
  const std::vector<std::string> names =
      absl::StrSplit(targets.as<std::string>(), ',', absl::SkipWhitespace());
  return static_cast<int64_t>(names.size());
}

}  // namespace

std::vector<double> RunSeries::Series(const std::string& field) const {
  auto it = values.find(field);
  if (it == values.end()) return std::vector<double>(steps.size(), kNaN);
  return it->second;
}

bool RunSeries::Has(const std::string& field) const {
  auto it = values.find(field);
  if (it == values.end()) return false;
  for (double v : it->second) {
    if (std::isfinite(v)) return true;
  }
  return false;
}

std::vector<double> MovingAverage(const std::vector<double>& values, int window) {
  if (window <= 1) return values;
  std::vector<size_t> finite;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) finite.push_back(i);
  }
  std::vector<double> prefix(finite.size() + 1, 0.0);
  for (size_t k = 0; k < finite.size(); ++k) prefix[k + 1] = prefix[k] + values[finite[k]];
  std::vector<double> out(values.size(), kNaN);
  const size_t half = static_cast<size_t>(window / 2);
  for (size_t k = 0; k < finite.size(); ++k) {
    const size_t a = k >= half ? k - half : 0;
    const size_t b = std::min(finite.size(), k + half + 1);
    out[finite[k]] = (prefix[b] - prefix[a]) / static_cast<double>(b - a);
  }
  return out;
}

RunSeries ParseMetricsText(const std::string& text, const std::string& file_name) {
  RunSeries series;
  series.metrics_path = file_name;
  std::map<int64_t, nlohmann::json> by_step;  // the later record of a step wins
  ForEachJsonLine(text, Rejection, [&](JsonLine& line) {
    ++series.lines;
    if (line.why.empty()) {
      const int64_t step = line.record[metrics_jsonl::kStep].get<int64_t>();
      by_step[step] = std::move(line.record);
      return;
    }
    if (!line.terminated) {
      // The writer appends whole lines; an unterminated tail is one still
      // being written, not damage.
      series.partial_tail = true;
      --series.lines;
      return;
    }
    ++series.skipped_lines;
    series.problems.push_back(absl::StrCat(file_name, ":", line.number, ": ", line.why));
  });

  const size_t n = by_step.size();
  series.steps.reserve(n);
  series.kdr_position_mean.resize(n);
  size_t index = 0;
  for (auto& [step, record] : by_step) {
    series.steps.push_back(step);
    for (const auto& [key, value] : record.items()) {
      if (!value.is_number() && !value.is_null()) continue;
      if (key == metrics_jsonl::kStep) continue;
      auto [it, inserted] = series.values.try_emplace(key);
      if (inserted) it->second.assign(n, kNaN);
      it->second[index] = NumberOrNaN(value);
    }
    if (auto kdr = record.find(metrics_jsonl::kKdrPositionMean);
        kdr != record.end() && kdr->is_array()) {
      for (const nlohmann::json& v : *kdr) series.kdr_position_mean[index].push_back(NumberOrNaN(v));
    }
    if (auto alarms = record.find(metrics_jsonl::kAlarms);
        alarms != record.end() && alarms->is_array()) {
      for (const nlohmann::json& alarm : *alarms) {
        if (!alarm.is_object()) continue;
        AlarmMark mark;
        mark.step = step;
        if (auto s = alarm.find("step"); s != alarm.end() && s->is_number_integer()) {
          mark.step = s->get<int64_t>();
        }
        if (auto k = alarm.find("kind"); k != alarm.end() && k->is_string()) {
          mark.kind = k->get<std::string>();
        } else {
          mark.kind = "unknown";
        }
        if (auto m = alarm.find("message"); m != alarm.end() && m->is_string()) {
          mark.message = m->get<std::string>();
        }
        series.alarms.push_back(std::move(mark));
      }
    }
    series.records.push_back(std::move(record));
    ++index;
  }
  AddDerivedSeries(&series);
  return series;
}

void ApplyConfigText(const std::string& config_text, const std::string& file_name,
                     RunSeries* series) {
  const services::Config defaults;
  series->kappa_threshold = defaults.alarms.kappa_threshold;
  series->conflict_threshold = defaults.alarms.conflict_threshold;
  try {
    const YAML::Node root = YAML::Load(config_text);
    const YAML::Node lora = root["student"] ? root["student"]["lora"] : YAML::Node();
    if (lora && lora.IsMap() && lora["rank"]) {
      series->lora_rank = lora["rank"].as<int64_t>();
      series->lora_targets = LoraTargetCount(lora["target_modules"]);
    }
    const YAML::Node alarms = root["alarms"];
    if (alarms && alarms.IsMap()) {
      if (alarms["kappa_threshold"]) {
        series->kappa_threshold = alarms["kappa_threshold"].as<double>();
        series->thresholds_from_config = true;
      }
      if (alarms["conflict_threshold"]) {
        series->conflict_threshold = alarms["conflict_threshold"].as<double>();
      }
    }
  } catch (const YAML::Exception& e) {
    series->config_problem =
        absl::StrCat(file_name, ":", e.mark.line + 1, ": ", e.msg, " (default thresholds used)");
    series->thresholds_from_config = false;
  }
}

absl::StatusOr<RunSeries> LoadRunSeries(const std::string& run_dir) {
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  std::ifstream metrics(metrics_path, std::ios::binary);
  if (!metrics) {
    return absl::NotFoundError(
        absl::StrCat(metrics_path, ": not found (is ", run_dir, " a run directory?)"));
  }
  std::stringstream text;
  text << metrics.rdbuf();
  RunSeries series = ParseMetricsText(text.str(), metrics_path);

  series.config_path = run_dir + "/config.yaml";
  std::ifstream config(series.config_path, std::ios::binary);
  if (config) {
    std::stringstream config_text;
    config_text << config.rdbuf();
    series.config_text = config_text.str();
    ApplyConfigText(series.config_text, series.config_path, &series);
  } else {
    ApplyConfigText("", series.config_path, &series);
    series.config_problem = absl::StrCat(series.config_path, ": not found (default thresholds used)");
  }
  series.atlas = LoadConflictAtlas(run_dir);
  return series;
}

}  // namespace kappa::cli
