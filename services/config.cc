#include "services/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace kappa::services {
namespace {

// One entry per configuration key. The parser, the override parser and
// ConfigToYaml all walk this table, so a new key is one line here.
using StringList = std::vector<std::string>;
using FieldRef = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, StringList*>;
struct Field {
  const char* key;
  FieldRef (*get)(Config&);
};

// The key path is the member path, so the macro writes both.
#define KAPPA_CONFIG_FIELD(path) \
  Field { #path, [](Config& c) -> FieldRef { return &c.path; } }

const std::vector<Field>& Fields() {
  static const std::vector<Field> kFields = {
      KAPPA_CONFIG_FIELD(name),
      KAPPA_CONFIG_FIELD(runs_dir),
      KAPPA_CONFIG_FIELD(data_dir),
      KAPPA_CONFIG_FIELD(seed),
      KAPPA_CONFIG_FIELD(workers),
      KAPPA_CONFIG_FIELD(host),
      KAPPA_CONFIG_FIELD(threads_per_process),

      KAPPA_CONFIG_FIELD(task.kind),
      KAPPA_CONFIG_FIELD(task.min_digits),
      KAPPA_CONFIG_FIELD(task.max_digits),
      KAPPA_CONFIG_FIELD(task.operators),
      KAPPA_CONFIG_FIELD(task.train_size),
      KAPPA_CONFIG_FIELD(task.heldout_size),
      KAPPA_CONFIG_FIELD(task.train_path),
      KAPPA_CONFIG_FIELD(task.heldout_path),
      KAPPA_CONFIG_FIELD(task.prompt_template),
      KAPPA_CONFIG_FIELD(task.system_prompt),
      KAPPA_CONFIG_FIELD(task.chat_template_context),

      KAPPA_CONFIG_FIELD(student.checkpoint),
      KAPPA_CONFIG_FIELD(student.dtype),
      KAPPA_CONFIG_FIELD(student.shape.hidden_size),
      KAPPA_CONFIG_FIELD(student.shape.intermediate_size),
      KAPPA_CONFIG_FIELD(student.shape.num_hidden_layers),
      KAPPA_CONFIG_FIELD(student.shape.num_attention_heads),
      KAPPA_CONFIG_FIELD(student.shape.num_key_value_heads),
      KAPPA_CONFIG_FIELD(student.shape.max_position_embeddings),
      KAPPA_CONFIG_FIELD(student.bootstrap.steps),
      KAPPA_CONFIG_FIELD(student.bootstrap.batch_size),
      KAPPA_CONFIG_FIELD(student.bootstrap.lr),
      KAPPA_CONFIG_FIELD(student.bootstrap.weight_decay),
      KAPPA_CONFIG_FIELD(student.bootstrap.warmup_steps),
      KAPPA_CONFIG_FIELD(student.bootstrap.train_examples),
      KAPPA_CONFIG_FIELD(student.bootstrap.seed),

      KAPPA_CONFIG_FIELD(teacher.checkpoint),
      KAPPA_CONFIG_FIELD(teacher.dtype),
      KAPPA_CONFIG_FIELD(teacher.shape.hidden_size),
      KAPPA_CONFIG_FIELD(teacher.shape.intermediate_size),
      KAPPA_CONFIG_FIELD(teacher.shape.num_hidden_layers),
      KAPPA_CONFIG_FIELD(teacher.shape.num_attention_heads),
      KAPPA_CONFIG_FIELD(teacher.shape.num_key_value_heads),
      KAPPA_CONFIG_FIELD(teacher.shape.max_position_embeddings),
      KAPPA_CONFIG_FIELD(teacher.bootstrap.steps),
      KAPPA_CONFIG_FIELD(teacher.bootstrap.batch_size),
      KAPPA_CONFIG_FIELD(teacher.bootstrap.lr),
      KAPPA_CONFIG_FIELD(teacher.bootstrap.weight_decay),
      KAPPA_CONFIG_FIELD(teacher.bootstrap.warmup_steps),
      KAPPA_CONFIG_FIELD(teacher.bootstrap.train_examples),
      KAPPA_CONFIG_FIELD(teacher.bootstrap.seed),
      KAPPA_CONFIG_FIELD(teacher.address),
      KAPPA_CONFIG_FIELD(teacher.max_batch_sequences),
      KAPPA_CONFIG_FIELD(teacher.max_wait_ms),
      KAPPA_CONFIG_FIELD(teacher.threads),
      KAPPA_CONFIG_FIELD(teacher.device),

      KAPPA_CONFIG_FIELD(verifier.address),
      KAPPA_CONFIG_FIELD(verifier.max_items),

      KAPPA_CONFIG_FIELD(learner.address),
      KAPPA_CONFIG_FIELD(learner.lease_timeout_ms),
      KAPPA_CONFIG_FIELD(learner.buffer_groups),
      KAPPA_CONFIG_FIELD(learner.max_staleness),
      KAPPA_CONFIG_FIELD(learner.threads),
      KAPPA_CONFIG_FIELD(learner.device),
      KAPPA_CONFIG_FIELD(learner.world_size),
      KAPPA_CONFIG_FIELD(learner.dist_store),

      KAPPA_CONFIG_FIELD(security.tls),
      KAPPA_CONFIG_FIELD(security.cert_file),
      KAPPA_CONFIG_FIELD(security.key_file),
      KAPPA_CONFIG_FIELD(security.ca_file),
      KAPPA_CONFIG_FIELD(security.mutual_tls),
      KAPPA_CONFIG_FIELD(security.server_name),
      KAPPA_CONFIG_FIELD(security.token_file),
      KAPPA_CONFIG_FIELD(security.max_message_bytes),

      KAPPA_CONFIG_FIELD(rollout.max_outstanding),
      KAPPA_CONFIG_FIELD(rollout.temperature),
      KAPPA_CONFIG_FIELD(rollout.top_p),
      KAPPA_CONFIG_FIELD(rollout.max_new_tokens),
      KAPPA_CONFIG_FIELD(rollout.threads),
      KAPPA_CONFIG_FIELD(rollout.rpc_deadline_ms),
      KAPPA_CONFIG_FIELD(rollout.device),
      KAPPA_CONFIG_FIELD(rollout.stop_strings),

      KAPPA_CONFIG_FIELD(trainer.steps),
      KAPPA_CONFIG_FIELD(trainer.groups_per_step),
      KAPPA_CONFIG_FIELD(trainer.group_size),
      KAPPA_CONFIG_FIELD(trainer.lr),
      KAPPA_CONFIG_FIELD(trainer.weight_decay),
      KAPPA_CONFIG_FIELD(trainer.max_grad_norm),
      KAPPA_CONFIG_FIELD(trainer.lambda),
      KAPPA_CONFIG_FIELD(trainer.reward_weight),
      KAPPA_CONFIG_FIELD(trainer.aggregation),
      KAPPA_CONFIG_FIELD(trainer.distill_loss),
      KAPPA_CONFIG_FIELD(trainer.norm_std),
      KAPPA_CONFIG_FIELD(trainer.truncated),
      KAPPA_CONFIG_FIELD(trainer.precision),
      KAPPA_CONFIG_FIELD(trainer.micro_batch_sequences),
      KAPPA_CONFIG_FIELD(trainer.clip_low),
      KAPPA_CONFIG_FIELD(trainer.clip_high),
      KAPPA_CONFIG_FIELD(trainer.dual_clip),
      KAPPA_CONFIG_FIELD(trainer.eval_every),
      KAPPA_CONFIG_FIELD(trainer.eval_examples),
      KAPPA_CONFIG_FIELD(trainer.checkpoint_every),
      KAPPA_CONFIG_FIELD(trainer.distill_topk),
      KAPPA_CONFIG_FIELD(trainer.teacher_values),
      KAPPA_CONFIG_FIELD(trainer.seed),
      KAPPA_CONFIG_FIELD(trainer.distill_gate),
      KAPPA_CONFIG_FIELD(trainer.balance),
      KAPPA_CONFIG_FIELD(trainer.kappa_target),

      KAPPA_CONFIG_FIELD(m3.mask_target),
      KAPPA_CONFIG_FIELD(m3.mask_estimator),
      KAPPA_CONFIG_FIELD(m3.mask_temperature),
      KAPPA_CONFIG_FIELD(m3.adapt_gain),
      KAPPA_CONFIG_FIELD(m3.adapt_ema),
      KAPPA_CONFIG_FIELD(m3.adapt_max_factor),
      KAPPA_CONFIG_FIELD(m3.lambda_min),
      KAPPA_CONFIG_FIELD(m3.lambda_max),

      KAPPA_CONFIG_FIELD(rstg.confidence),
      KAPPA_CONFIG_FIELD(rstg.token_selector),
      KAPPA_CONFIG_FIELD(rstg.token_frac),
      KAPPA_CONFIG_FIELD(rstg.entropy_threshold),
      KAPPA_CONFIG_FIELD(rstg.divergence_threshold),
      KAPPA_CONFIG_FIELD(rstg.teacher_samples),
      KAPPA_CONFIG_FIELD(rstg.teacher_temperature),
      KAPPA_CONFIG_FIELD(rstg.sft_weight),

      KAPPA_CONFIG_FIELD(monitor.kappa_every),
      KAPPA_CONFIG_FIELD(monitor.kdr_every),
      KAPPA_CONFIG_FIELD(monitor.kdr_estimator),
      KAPPA_CONFIG_FIELD(monitor.kdr_exact_every),
      KAPPA_CONFIG_FIELD(monitor.kdr_exact_positions),

      KAPPA_CONFIG_FIELD(alarms.kappa_threshold),
      KAPPA_CONFIG_FIELD(alarms.ema_alpha),
      KAPPA_CONFIG_FIELD(alarms.slope_window),
      KAPPA_CONFIG_FIELD(alarms.min_relative_rise),
      KAPPA_CONFIG_FIELD(alarms.conflict_threshold),
      KAPPA_CONFIG_FIELD(alarms.conflict_window),
      KAPPA_CONFIG_FIELD(alarms.collapse_window),
      KAPPA_CONFIG_FIELD(alarms.reward_drop_ratio),
      KAPPA_CONFIG_FIELD(alarms.distill_rise_factor),
      KAPPA_CONFIG_FIELD(alarms.entropy_floor),
      KAPPA_CONFIG_FIELD(alarms.warmup_steps),
      KAPPA_CONFIG_FIELD(alarms.clear_steps),
  };
  return kFields;
}

#undef KAPPA_CONFIG_FIELD

const Field* FindField(const std::string& key) {
  for (const Field& field : Fields()) {
    if (key == field.key) return &field;
  }
  return nullptr;
}

// True if `key` is a section ("trainer", "student.shape") of some field.
bool IsSection(const std::string& key) {
  const std::string prefix = key + ".";
  for (const Field& field : Fields()) {
    if (std::string(field.key).rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// What a field expects, for messages.
struct Expectation {
  const char* operator()(int64_t*) const { return "an integer"; }
  const char* operator()(uint64_t*) const { return "a non-negative integer"; }
  const char* operator()(double*) const { return "a finite number"; }
  const char* operator()(bool*) const { return "a boolean"; }
  const char* operator()(std::string*) const { return "a string"; }
  const char* operator()(StringList*) const { return "a list of names"; }
};

// Parses `text` into the field; false if it does not have the field's type.
struct Assign {
  const std::string& text;
  bool operator()(int64_t* out) const { return absl::SimpleAtoi(text, out); }
  bool operator()(uint64_t* out) const {
    return text.find('-') == std::string::npos && absl::SimpleAtoi(text, out);
  }
  bool operator()(double* out) const {
    double value = 0;
    if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) return false;
    *out = value;
    return true;
  }
  bool operator()(bool* out) const {
    // YAML 1.1 spellings, which yaml-cpp also uses.
    for (const char* yes : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"}) {
      if (text == yes) return *out = true, true;
    }
    for (const char* no : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"}) {
      if (text == no) return *out = false, true;
    }
    return false;
  }
  bool operator()(std::string* out) const {
    *out = text;
    return true;
  }
  // A scalar list value: "a" or "a,b" (the override form of [a, b]).
  bool operator()(StringList* out) const {
    out->clear();
    for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
      out->push_back(std::string(absl::StripAsciiWhitespace(part)));
    }
    return true;
  }
};

// Shortest decimal text that parses back to exactly `value`.
std::string FormatDouble(double value) {
  char buffer[64];
  for (int precision : {15, 16, 17}) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    double parsed = 0;
    if (absl::SimpleAtod(buffer, &parsed) && parsed == value) break;
  }
  std::string text = buffer;
  // Keep it visibly a number of the right kind ("1" would read as an integer).
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

struct Format {
  std::string operator()(int64_t* value) const { return absl::StrCat(*value); }
  std::string operator()(uint64_t* value) const { return absl::StrCat(*value); }
  std::string operator()(double* value) const { return FormatDouble(*value); }
  std::string operator()(bool* value) const { return *value ? "true" : "false"; }
  std::string operator()(std::string* value) const { return *value; }
  std::string operator()(StringList* value) const { return absl::StrJoin(*value, ","); }
};

const char* NodeKind(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a sequence";
  if (node.IsNull()) return "nothing";
  return "a scalar";
}

// Assigns a YAML value to a field; `where` prefixes messages ("<file>:<line>"
// or "override 'k=v'"). A null value means the empty string for strings.
absl::Status AssignNode(const Field& field, const YAML::Node& value, const std::string& where,
                        Config* config) {
  const FieldRef ref = field.get(*config);
  std::string problem;
  if (value.IsScalar()) {
    if (std::visit(Assign{value.Scalar()}, ref)) return absl::OkStatus();
    problem = absl::StrCat("'", value.Scalar(), "'");
  } else if (value.IsNull() && std::holds_alternative<std::string*>(ref)) {
    std::get<std::string*>(ref)->clear();
    return absl::OkStatus();
  } else if (value.IsSequence() && std::holds_alternative<StringList*>(ref)) {
    StringList list;
    for (const YAML::Node& item : value) {
      if (!item.IsScalar()) {
        problem = absl::StrCat("a sequence holding ", NodeKind(item));
        break;
      }
      list.push_back(item.Scalar());
    }
    if (problem.empty()) {
      *std::get<StringList*>(ref) = std::move(list);
      return absl::OkStatus();
    }
  } else {
    problem = NodeKind(value);
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": key '", field.key, "' expects ",
                                                 std::visit(Expectation{}, ref), ", got ",
                                                 problem));
}

int LineOf(const YAML::Node& node, const YAML::Node& fallback) {
  const int line = node.Mark().line >= 0 ? node.Mark().line : fallback.Mark().line;
  return line + 1;  // yaml-cpp counts from 0
}

absl::Status ApplyMapping(const YAML::Node& mapping, const std::string& prefix,
                          const std::string& file_name, std::set<std::string>* seen,
                          Config* config) {
  for (auto it = mapping.begin(); it != mapping.end(); ++it) {
    const YAML::Node key_node = it->first;  // copies: the iterator yields a temporary
    const YAML::Node value = it->second;
    const std::string where = absl::StrCat(file_name, ":", LineOf(key_node, mapping));
    if (!key_node.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": keys must be plain names"));
    }
    const std::string key =
        prefix.empty() ? key_node.Scalar() : absl::StrCat(prefix, ".", key_node.Scalar());
    if (!seen->insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate key '", key, "'"));
    }
    if (const Field* field = FindField(key)) {
      absl::Status status =
          AssignNode(*field, value, absl::StrCat(file_name, ":", value.IsNull() ? LineOf(key_node, mapping) : LineOf(value, key_node)),
          config);
      if (!status.ok()) return status;
    } else if (IsSection(key)) {
      if (value.IsNull()) continue;  // "trainer:" with nothing below
      if (!value.IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": key '", key, "' is a section and expects a mapping, got ", NodeKind(value)));
      }
      absl::Status status = ApplyMapping(value, key, file_name, seen, config);
      if (!status.ok()) return status;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", key, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyOverride(const std::string& text, Config* config) {
  const std::string where = absl::StrCat("override '", text, "'");
  const size_t equals = text.find('=');
  if (equals == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected key=value"));
  }
  const std::string key = text.substr(0, equals);
  const std::string value_text = text.substr(equals + 1);
  const Field* field = FindField(key);
  if (field == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", key, "'"));
  }
  // The value reads as a YAML scalar (so quotes work: name='my run'); text
  // that is not valid YAML on its own, like "*", is taken literally.
  YAML::Node value;
  try {
    value = YAML::Load(value_text);
  } catch (const YAML::Exception&) {
    value = YAML::Node(value_text);
  }
  return AssignNode(*field, value, where, config);
}

}  // namespace

absl::StatusOr<Config> ParseConfig(const std::string& yaml_text, const std::string& file_name,
                                   const std::vector<std::string>& overrides) {
  Config config;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ":", e.mark.line + 1, ": invalid YAML: ", e.msg));
  }
  if (root.IsMap()) {
    std::set<std::string> seen;
    absl::Status status = ApplyMapping(root, "", file_name, &seen, &config);
    if (!status.ok()) return status;
  } else if (!root.IsNull()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ":", LineOf(root, root), ": expected a mapping of keys, got ",
                     NodeKind(root)));
  }
  for (const std::string& override_text : overrides) {
    absl::Status status = ApplyOverride(override_text, &config);
    if (!status.ok()) return status;
  }
  return config;
}

absl::StatusOr<Config> LoadConfig(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open config file"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path, overrides);
}

absl::StatusOr<std::vector<std::string>> WithEnvironmentOverrides(
    const std::vector<std::string>& overrides, const char* const* environment) {
  constexpr absl::string_view kPrefix = "KAPPA_CFG_";
  std::map<std::string, std::string> by_variable;  // sorted: a stable order
  for (const char* const* entry = environment; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view text = *entry;
    const size_t equals = text.find('=');
    if (!absl::StartsWith(text, kPrefix) || equals == absl::string_view::npos) continue;
    const std::string variable(text.substr(0, equals));
    std::string key = absl::AsciiStrToLower(variable.substr(kPrefix.size()));
    key = absl::StrReplaceAll(key, {{"__", "."}});
    const std::string override_text = absl::StrCat(key, "=", text.substr(equals + 1));
    // Checked alone against the defaults so the message names the variable.
    if (absl::StatusOr<Config> alone = ParseConfig("", "<environment>", {override_text});
        !alone.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", variable, ": ", alone.status().message()));
    }
    by_variable[variable] = override_text;
  }
  std::vector<std::string> all;
  for (const auto& [variable, override_text] : by_variable) all.push_back(override_text);
  all.insert(all.end(), overrides.begin(), overrides.end());
  return all;
}

std::vector<std::string> ConfigKeys() {
  std::vector<std::string> keys;
  for (const Field& field : Fields()) keys.push_back(field.key);
  return keys;
}

std::string ConfigToYaml(const Config& config) {
  // Fields() hands out mutable references; nothing below writes through them.
  Config& readable = const_cast<Config&>(config);
  YAML::Node root(YAML::NodeType::Map);
  for (const Field& field : Fields()) {
    const std::vector<std::string> parts = absl::StrSplit(field.key, '.');
    YAML::Node node = root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node child = node[parts[i]];
      node.reset(child);  // re-seat, not assign: assignment would overwrite
    }
    const FieldRef ref = field.get(readable);
    if (const auto* list = std::get_if<StringList*>(&ref)) {
      YAML::Node sequence(YAML::NodeType::Sequence);
      for (const std::string& item : **list) sequence.push_back(item);
      node[parts.back()] = sequence;
    } else {
      node[parts.back()] = std::visit(Format{}, ref);
    }
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace kappa::services
