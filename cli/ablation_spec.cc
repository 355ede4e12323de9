#include "cli/ablation_spec.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/config.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;

// The experiment owns these per run (the run directory is found by them; the
// seed it varies is the RL seed, so every run of an arm shares the dataset and
// the bootstrap checkpoints of the base config), so an ablation file may not
// override them.
const std::set<std::string>& ReservedKeys() {
  static const std::set<std::string> keys = {"name", "runs_dir", "trainer.seed"};
  return keys;
}

// Reads one ablation file; every error carries "<file>:<line>: ".
class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  absl::StatusOr<AblationSpec> Parse(const std::string& yaml_text) {
    YAML::Node root;
    try {
      root = YAML::Load(yaml_text);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_, ":", e.mark.line + 1, ": invalid YAML: ", e.msg));
    }
    if (!root.IsMap()) {
      return Error(root, root, "expected a mapping with base, seeds, overrides, quick, arms");
    }
    AblationSpec spec;
    spec.file = file_;
    bool has_base = false;
    bool has_seeds = false;
    bool has_arms = false;
    std::optional<YAML::Node> baseline_key;  // where `baseline` is, for its error
    std::optional<YAML::Node> trend_key;     // where `trend` is, for its arms' errors
    for (auto it = root.begin(); it != root.end(); ++it) {
      const YAML::Node key = it->first;  // copies: the iterator yields a temporary
      const YAML::Node value = it->second;
      const std::string name = key.IsScalar() ? key.Scalar() : "";
      absl::Status status;
      if (name == "base") {
        has_base = true;
        status = ReadBase(key, value, &spec);
      } else if (name == "seeds") {
        has_seeds = true;
        status = ReadSeeds(key, value, &spec.seeds);
      } else if (name == "overrides") {
        status = ReadOverrides(key, value, "overrides", &spec.overrides);
      } else if (name == "quick") {
        spec.has_quick = true;
        status = ReadQuick(key, value, &spec);
      } else if (name == "arms") {
        has_arms = true;
        status = ReadArms(key, value, &spec.arms);
      } else if (name == "baseline") {
        baseline_key = key;
        status = ReadBaseline(key, value, &spec.baseline);
      } else if (name == "effects") {
        status = ReadEffects(key, value, &spec.effects);
      } else if (name == "trend") {
        trend_key = key;
        spec.trend.emplace();
        status = ReadTrend(key, value, &*spec.trend);
      } else {
        status = Error(key, root,
                       absl::StrCat("unknown key '", name,
                                    "' (expected base, seeds, overrides, quick, baseline, "
                                    "effects, trend, arms)"));
      }
      if (!status.ok()) return status;
    }
    if (!has_base) return Error(root, root, "missing 'base' (the run config the arms modify)");
    if (!has_seeds) return Error(root, root, "missing 'seeds' (e.g. seeds: [1, 2, 3])");
    if (!has_arms) return Error(root, root, "missing 'arms'");
    if (!baseline_key) {
      spec.baseline = DefaultBaseline(spec.arms);
    } else if (absl::Status status = CheckBaselineIsAnArm(*baseline_key, root, spec);
               !status.ok()) {
      return status;
    }
    if (trend_key) {
      if (absl::Status status = CheckTrendArms(*trend_key, root, spec); !status.ok()) {
        return status;
      }
    }
    return spec;
  }

 private:
  int LineOf(const YAML::Node& node, const YAML::Node& fallback) const {
    // Null nodes (an empty "- ") carry no mark of their own.
    const int line = node.Mark().line >= 0 ? node.Mark().line : fallback.Mark().line;
    return line + 1;  // yaml-cpp counts from 0
  }

  absl::Status Error(const YAML::Node& node, const YAML::Node& fallback,
                     const std::string& message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ":", LineOf(node, fallback), ": ", message));
  }

  absl::Status ReadBase(const YAML::Node& key, const YAML::Node& value, AblationSpec* spec) {
    if (!value.IsScalar() || value.Scalar().empty()) {
      return Error(value, key, "'base' expects the path of a run config (e.g. demo.yaml)");
    }
    // Relative to the ablation file, so the experiment works from any
    // directory; kept relative when the ablation file's path is.
    const fs::path base(value.Scalar());
    spec->base_config =
        base.is_absolute() ? base.string() : (fs::path(file_).parent_path() / base).string();
    return absl::OkStatus();
  }

  // effects: {metric: δ, ...}: a results.csv column name and a finite number.
  absl::Status ReadEffects(const YAML::Node& key, const YAML::Node& value,
                           std::map<std::string, double>* effects) {
    if (!value.IsMap()) {
      return Error(value, key,
                   "'effects' expects metric: effect pairs (e.g. final_eval_accuracy: 0.1)");
    }
    for (auto it = value.begin(); it != value.end(); ++it) {
      const YAML::Node metric = it->first;
      const YAML::Node effect = it->second;
      double number = 0.0;
      if (!metric.IsScalar() || !effect.IsScalar() || !absl::SimpleAtod(effect.Scalar(), &number) ||
          !std::isfinite(number) || number == 0.0) {
        return Error(effect, key,
                     absl::StrCat("'effects': '", metric.IsScalar() ? metric.Scalar() : "?",
                                  "' needs a finite, nonzero effect size"));
      }
      (*effects)[metric.Scalar()] = number;
    }
    return absl::OkStatus();
  }

  // trend: {metric, against, log10, arms}. The arms are checked against the
  // file's arms once both are read; the metric names when the results are
  // (per-subset columns exist only then).
  absl::Status ReadTrend(const YAML::Node& key, const YAML::Node& value, TrendSpec* trend) {
    if (!value.IsMap()) {
      return Error(value, key, "'trend' expects a mapping (metric, against, log10, arms)");
    }
    for (auto it = value.begin(); it != value.end(); ++it) {
      const YAML::Node sub_key = it->first;
      const YAML::Node sub_value = it->second;
      const std::string name = sub_key.IsScalar() ? sub_key.Scalar() : "";
      if ((name == "metric" || name == "against") &&
          (!sub_value.IsScalar() || sub_value.Scalar().empty())) {
        return Error(sub_value, sub_key,
                     absl::StrCat("'trend.", name, "' expects a results.csv column"));
      }
      if (name == "metric") {
        trend->metric = sub_value.Scalar();
      } else if (name == "against") {
        trend->against = sub_value.Scalar();
      } else if (name == "log10") {
        if (!sub_value.IsScalar() ||
            (sub_value.Scalar() != "true" && sub_value.Scalar() != "false")) {
          return Error(sub_value, sub_key, "'trend.log10' expects true or false");
        }
        trend->log10 = sub_value.Scalar() == "true";
      } else if (name == "arms") {
        if (!sub_value.IsSequence() || sub_value.size() < 2) {
          return Error(sub_value, sub_key, "'trend.arms' expects a list of at least two arms");
        }
        for (const YAML::Node& arm : sub_value) {
          if (!arm.IsScalar()) return Error(arm, sub_key, "'trend.arms' lists arm names");
          trend->arms.push_back(arm.Scalar());
        }
      } else {
        return Error(
            sub_key, value,
            absl::StrCat("unknown key 'trend.", name, "' (expected metric, against, log10, arms)"));
      }
    }
    if (trend->metric.empty() || trend->against.empty() || trend->arms.empty()) {
      return Error(value, key, "'trend' needs metric, against and arms");
    }
    return absl::OkStatus();
  }

  absl::Status CheckTrendArms(const YAML::Node& key, const YAML::Node& root,
                              const AblationSpec& spec) const {
    std::set<std::string> names;
    for (const AblationArm& arm : spec.arms) names.insert(arm.name);
    for (const std::string& arm : spec.trend->arms) {
      if (names.count(arm) == 0) {
        return Error(key, root, absl::StrCat("'trend.arms': '", arm, "' is not an arm"));
      }
    }
    return absl::OkStatus();
  }

  // A null or empty value: no baseline. The name is checked against the arms
  // once they are read (the key may come first).
  absl::Status ReadBaseline(const YAML::Node& key, const YAML::Node& value, std::string* baseline) {
    if (value.IsNull()) return absl::OkStatus();
    if (!value.IsScalar()) {
      return Error(value, key, "'baseline' expects the name of an arm (e.g. baseline: naive)");
    }
    *baseline = value.Scalar();
    return absl::OkStatus();
  }

  absl::Status CheckBaselineIsAnArm(const YAML::Node& key, const YAML::Node& root,
                                    const AblationSpec& spec) const {
    if (spec.baseline.empty()) return absl::OkStatus();
    std::vector<std::string> names;
    for (const AblationArm& arm : spec.arms) {
      if (arm.name == spec.baseline) return absl::OkStatus();
      names.push_back(arm.name);
    }
    return Error(key, root,
                 absl::StrCat("'baseline': '", spec.baseline,
                              "' is not an arm (arms: ", absl::StrJoin(names, ", "), ")"));
  }

  absl::Status ReadSeeds(const YAML::Node& key, const YAML::Node& value,
                         std::vector<uint64_t>* seeds) {
    if (!value.IsSequence() || value.size() == 0) {
      return Error(value, key, "'seeds' expects a non-empty list of integers, e.g. [1, 2, 3]");
    }
    std::set<uint64_t> seen;
    for (const YAML::Node& item : value) {
      uint64_t seed = 0;
      if (!item.IsScalar() || !absl::SimpleAtoi(item.Scalar(), &seed)) {
        return Error(item, key,
                     absl::StrCat("seed '", item.IsScalar() ? item.Scalar() : "?",
                                  "' is not a non-negative integer"));
      }
      if (!seen.insert(seed).second) {
        return Error(item, key, absl::StrCat("seed ", seed, " is listed twice"));
      }
      seeds->push_back(seed);
    }
    return absl::OkStatus();
  }

  absl::Status ReadOverrides(const YAML::Node& key, const YAML::Node& value,
                             const std::string& what, std::vector<std::string>* overrides) {
    if (value.IsNull()) return absl::OkStatus();  // "overrides:" with nothing
    if (!value.IsSequence()) {
      return Error(value, key, absl::StrCat("'", what, "' expects a list of key=value strings"));
    }
    for (const YAML::Node& item : value) {
      const std::string text = item.IsScalar() ? item.Scalar() : "";
      const size_t equals = text.find('=');
      if (!item.IsScalar() || equals == std::string::npos || equals == 0) {
        // A list value inside a flow list ([a=[x,y]]) is the usual cause.
        return Error(item, key,
                     absl::StrCat(what, ": expected key=value strings; quote values with "
                                        "brackets or commas, e.g. \"trainer.balance=[m3_norm,"
                                        "m3_project]\"",
                                  item.IsScalar() ? absl::StrCat(" (got '", text, "')") : ""));
      }
      const std::string config_key(absl::StripAsciiWhitespace(text.substr(0, equals)));
      if (ReservedKeys().count(config_key) > 0) {
        return Error(item, key,
                     absl::StrCat(what, ": '", config_key,
                                  "' is set by kappa experiment for each run and cannot be "
                                  "overridden"));
      }
      overrides->push_back(text);
    }
    return absl::OkStatus();
  }

  absl::Status ReadQuick(const YAML::Node& key, const YAML::Node& value, AblationSpec* spec) {
    if (value.IsNull()) return absl::OkStatus();
    if (!value.IsMap()) return Error(value, key, "'quick' expects a mapping (seeds, overrides)");
    for (auto it = value.begin(); it != value.end(); ++it) {
      const YAML::Node sub_key = it->first;
      const YAML::Node sub_value = it->second;
      const std::string name = sub_key.IsScalar() ? sub_key.Scalar() : "";
      absl::Status status;
      if (name == "seeds") {
        status = ReadSeeds(sub_key, sub_value, &spec->quick_seeds);
      } else if (name == "overrides") {
        status = ReadOverrides(sub_key, sub_value, "quick.overrides", &spec->quick_overrides);
      } else {
        status = Error(sub_key, value,
                       absl::StrCat("unknown key 'quick.", name, "' (expected seeds, overrides)"));
      }
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  absl::Status ReadArms(const YAML::Node& key, const YAML::Node& value,
                        std::vector<AblationArm>* arms) {
    if (!value.IsSequence() || value.size() == 0) {
      return Error(value, key, "'arms' expects a non-empty list of {name, description, overrides}");
    }
    std::set<std::string> names;
    int index = 0;
    for (const YAML::Node& item : value) {
      ++index;
      AblationArm arm;
      arm.line = LineOf(item, key);
      if (!item.IsMap()) {
        return Error(item, key, "an arm is a mapping {name, description, overrides}");
      }
      for (auto it = item.begin(); it != item.end(); ++it) {
        const YAML::Node sub_key = it->first;
        const YAML::Node sub_value = it->second;
        const std::string name = sub_key.IsScalar() ? sub_key.Scalar() : "";
        absl::Status status;
        if (name == "name") {
          if (sub_value.IsScalar()) arm.name = sub_value.Scalar();
        } else if (name == "description") {
          if (!sub_value.IsScalar() && !sub_value.IsNull()) {
            status = Error(sub_value, sub_key, "an arm's description must be a string");
          } else if (sub_value.IsScalar()) {
            arm.description = sub_value.Scalar();
          }
        } else if (name == "overrides") {
          status = ReadOverrides(sub_key, sub_value, "overrides", &arm.overrides);
        } else {
          status = Error(sub_key, item,
                         absl::StrCat("unknown arm key '", name,
                                      "' (expected name, description, overrides)"));
        }
        if (!status.ok()) {
          // Name the arm when it has been named already.
          if (arm.name.empty()) return status;
          return absl::Status(status.code(),
                              absl::StrCat(status.message(), " (arm '", arm.name, "')"));
        }
      }
      if (arm.name.empty()) {
        return Error(item, key,
                     absl::StrCat("arm #", index,
                                  arm.description.empty()
                                      ? std::string()
                                      : absl::StrCat(" (\"", arm.description, "\")"),
                                  " has no name"));
      }
      // The name becomes a directory name and part of a run name.
      for (char c : arm.name) {
        if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' &&
            c != '.') {
          return Error(item, key,
                       absl::StrCat("arm name '", arm.name,
                                    "' may only use letters, digits, '_', '-' and '.'"));
        }
      }
      if (arm.name.front() == '.') {
        return Error(item, key, absl::StrCat("arm name '", arm.name, "' may not start with '.'"));
      }
      if (!names.insert(arm.name).second) {
        return Error(item, key, absl::StrCat("arm '", arm.name, "' is defined twice"));
      }
      arms->push_back(std::move(arm));
    }
    return absl::OkStatus();
  }

  std::string file_;
};

// A YAML single-quoted scalar, so a path with ':' or '#' survives the
// override parser (which reads values as YAML).
std::string YamlQuoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

}  // namespace

std::string DefaultBaseline(const std::vector<AblationArm>& arms) {
  for (const AblationArm& arm : arms) {
    if (arm.name == "naive") return arm.name;
  }
  return "";
}

absl::StatusOr<AblationSpec> ParseAblationSpec(const std::string& yaml_text,
                                               const std::string& file_name) {
  return Parser(file_name).Parse(yaml_text);
}

absl::StatusOr<AblationSpec> LoadAblationSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open ablation file"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseAblationSpec(text.str(), path);
}

absl::Status ApplyQuick(AblationSpec* spec) {
  if (!spec->has_quick) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec->file, ": --quick given but the file has no 'quick' section"));
  }
  if (!spec->quick_seeds.empty()) spec->seeds = spec->quick_seeds;
  spec->overrides.insert(spec->overrides.end(), spec->quick_overrides.begin(),
                         spec->quick_overrides.end());
  return absl::OkStatus();
}

absl::Status AppendCommonOverrides(AblationSpec* spec,
                                   const std::vector<std::string>& overrides) {
  for (const std::string& text : overrides) {
    const std::string key(absl::StripAsciiWhitespace(text.substr(0, text.find('='))));
    if (ReservedKeys().count(key) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "override '", text, "': '", key,
          "' is set by kappa experiment for each run and cannot be overridden"));
    }
    spec->overrides.push_back(text);
  }
  return absl::OkStatus();
}

std::vector<PlannedRun> PlanRuns(const AblationSpec& spec, const std::string& runs_dir) {
  std::vector<PlannedRun> runs;
  for (const AblationArm& arm : spec.arms) {
    for (uint64_t seed : spec.seeds) {
      PlannedRun run;
      run.arm = arm.name;
      run.seed = seed;
      run.name = absl::StrCat(arm.name, "-s", seed);
      // Later overrides win, so the arm's come last.
      run.overrides = {absl::StrCat("name=", run.name),
                       absl::StrCat("runs_dir=", YamlQuoted(runs_dir)),
                       absl::StrCat("trainer.seed=", seed)};
      run.overrides.insert(run.overrides.end(), spec.overrides.begin(), spec.overrides.end());
      run.overrides.insert(run.overrides.end(), arm.overrides.begin(), arm.overrides.end());
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

absl::StatusOr<std::vector<services::Config>> ResolveRunConfigs(
    const AblationSpec& spec, const std::vector<PlannedRun>& runs) {
  // The shared part first, so its mistakes are not blamed on the first arm.
  if (absl::StatusOr<services::Config> base = services::LoadConfig(spec.base_config, spec.overrides);
      !base.ok()) {
    return absl::Status(base.status().code(),
                        absl::StrCat(spec.file, ": base config with the common overrides: ",
                                     base.status().message()));
  }
  std::vector<services::Config> configs;
  for (const PlannedRun& run : runs) {
    absl::StatusOr<services::Config> config = services::LoadConfig(spec.base_config, run.overrides);
    if (!config.ok()) {
      int line = 0;
      for (const AblationArm& arm : spec.arms) {
        if (arm.name == run.arm) line = arm.line;
      }
      return absl::Status(config.status().code(),
                          absl::StrCat(spec.file, ":", line, ": arm '", run.arm,
                                       "': ", config.status().message()));
    }
    configs.push_back(*std::move(config));
  }
  return configs;
}

}  // namespace kappa::cli
