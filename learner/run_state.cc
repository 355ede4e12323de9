#include "learner/run_state.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "services/atomic_file.h"

namespace kappa::learner {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// JSON has no NaN or infinity: those travel as the strings "nan", "inf",
// "-inf", so a diverged average does not make the checkpoint unreadable.
nlohmann::json DoubleToJson(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

double DoubleFromJson(const nlohmann::json& json) {
  if (!json.is_string()) return json.get<double>();
  const std::string text = json.get<std::string>();
  if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (text == "inf") return std::numeric_limits<double>::infinity();
  if (text == "-inf") return -std::numeric_limits<double>::infinity();
  throw std::invalid_argument("'" + text + "' is not a number");
}

// An absent value is null.
nlohmann::json OptionalToJson(const std::optional<double>& x) {
  return x ? DoubleToJson(*x) : nlohmann::json(nullptr);
}

std::optional<double> OptionalFromJson(const nlohmann::json& json, const char* key) {
  if (!json.contains(key) || json.at(key).is_null()) return std::nullopt;
  return DoubleFromJson(json.at(key));
}

nlohmann::json LambdaToJson(const LambdaControllerState& state) {
  return {{"lambda", DoubleToJson(state.lambda)}, {"kappa_ema", OptionalToJson(state.kappa_ema)}};
}

LambdaControllerState LambdaFromJson(const nlohmann::json& json) {
  return {DoubleFromJson(json.at("lambda")), OptionalFromJson(json, "kappa_ema")};
}

nlohmann::json AlarmsToJson(const AlarmMonitorState& s) {
  nlohmann::json history = nlohmann::json::array();
  for (double x : s.distill_history) history.push_back(DoubleToJson(x));
  nlohmann::json kinds = nlohmann::json::object();
  for (int k = 0; k < kNumAlarmKinds; ++k) {
    kinds[AlarmName(kAllAlarmKinds[k])] = {
        {"active", s.active[k]}, {"clear_run", s.clear_run[k]}, {"fired", s.fired[k]}};
  }
  return {{"observations", s.observations},
          {"kappa_ema", OptionalToJson(s.kappa_ema)},
          {"distill_ema", OptionalToJson(s.distill_ema)},
          {"reward_ema", OptionalToJson(s.reward_ema)},
          {"entropy_ema", OptionalToJson(s.entropy_ema)},
          {"distill_history", history},
          {"best_reward_ema", OptionalToJson(s.best_reward_ema)},
          {"min_distill_ema", OptionalToJson(s.min_distill_ema)},
          {"conflict_run", s.conflict_run},
          {"reward_run", s.reward_run},
          {"distill_run", s.distill_run},
          {"entropy_run", s.entropy_run},
          {"mismatch_run", s.mismatch_run},
          {"kinds", kinds}};
}

// A kind the file does not name (written before it existed) starts inactive.
AlarmMonitorState AlarmsFromJson(const nlohmann::json& json) {
  AlarmMonitorState s;
  s.observations = json.at("observations").get<int64_t>();
  s.kappa_ema = OptionalFromJson(json, "kappa_ema");
  s.distill_ema = OptionalFromJson(json, "distill_ema");
  s.reward_ema = OptionalFromJson(json, "reward_ema");
  s.entropy_ema = OptionalFromJson(json, "entropy_ema");
  for (const nlohmann::json& x : json.at("distill_history")) {
    s.distill_history.push_back(DoubleFromJson(x));
  }
  s.best_reward_ema = OptionalFromJson(json, "best_reward_ema");
  s.min_distill_ema = OptionalFromJson(json, "min_distill_ema");
  s.conflict_run = json.at("conflict_run").get<int64_t>();
  s.reward_run = json.at("reward_run").get<int64_t>();
  s.distill_run = json.at("distill_run").get<int64_t>();
  s.entropy_run = json.at("entropy_run").get<int64_t>();
  s.mismatch_run = json.at("mismatch_run").get<int64_t>();
  const nlohmann::json& kinds = json.at("kinds");
  for (int k = 0; k < kNumAlarmKinds; ++k) {
    const char* name = AlarmName(kAllAlarmKinds[k]);
    if (!kinds.contains(name)) continue;
    s.active[k] = kinds.at(name).at("active").get<bool>();
    s.clear_run[k] = kinds.at(name).at("clear_run").get<int64_t>();
    s.fired[k] = kinds.at(name).at("fired").get<int64_t>();
  }
  return s;
}

}  // namespace

std::string CheckpointDir(const std::string& run_dir, int64_t step) {
  return absl::StrCat(run_dir, "/checkpoints/step-", step);
}

absl::Status WriteTrainerState(const std::string& checkpoint_dir, const TrainerState& state) {
  nlohmann::json json = {{"step", state.step},
                         {"policy_version", state.policy_version},
                         {"data_position", state.data_position},
                         {"seed", state.seed},
                         {"pending_prompts", state.pending_prompts}};
  if (state.world_size > 0) json["world_size"] = state.world_size;
  if (state.lambda_controller) json["lambda_controller"] = LambdaToJson(*state.lambda_controller);
  if (state.alarms) json["alarms"] = AlarmsToJson(*state.alarms);
  return services::WriteFileAtomically(checkpoint_dir + "/trainer_state.json", json.dump(2));
}

absl::StatusOr<TrainerState> ReadTrainerState(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/trainer_state.json";
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  try {
    const nlohmann::json json = nlohmann::json::parse(*text);
    TrainerState state;
    state.step = json.at("step").get<int64_t>();
    state.policy_version = json.at("policy_version").get<int64_t>();
    state.data_position = json.at("data_position").get<int64_t>();
    state.seed = json.at("seed").get<uint64_t>();
    // Absent in checkpoints written before it was recorded.
    state.pending_prompts = json.value("pending_prompts", std::vector<int64_t>());
    state.world_size = json.value("world_size", int64_t{0});
    // Absent in checkpoints written before they were recorded (and
    // lambda_controller in runs without m3_adapt): RestoreMonitors says so.
    if (json.contains("lambda_controller")) {
      state.lambda_controller = LambdaFromJson(json.at("lambda_controller"));
    }
    if (json.contains("alarms")) state.alarms = AlarmsFromJson(json.at("alarms"));
    return state;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": ", e.what()));
  } catch (const std::invalid_argument& e) {
    return absl::DataLossError(absl::StrCat(path, ": ", e.what()));
  }
}

absl::Status RestoreMonitors(const TrainerState& state, LambdaController* lambda,
                             AlarmMonitor* alarms) {
  if (state.step == 0) return absl::OkStatus();
  const std::string at = absl::StrCat("the checkpoint of step ", state.step);
  if (lambda != nullptr && state.lambda_controller) {
    KAPPA_RETURN_IF_ERROR(
        base::CaptureExceptions(at, [&] { lambda->Restore(*state.lambda_controller); }));
    spdlog::info("resume: m3_adapt continues at lambda {}", lambda->lambda());
  } else if (lambda != nullptr) {
    spdlog::warn(
        "resume: {} has no m3_adapt state (written before it was recorded); lambda "
        "restarts from trainer.lambda ({})",
        at, lambda->lambda());
  }
  if (alarms != nullptr && state.alarms) {
    KAPPA_RETURN_IF_ERROR(base::CaptureExceptions(at, [&] { alarms->Restore(*state.alarms); }));
  } else if (alarms != nullptr) {
    spdlog::warn(
        "resume: {} has no alarm monitor state (written before it was recorded); the "
        "alarms' averages and windows start afresh",
        at);
  }
  return absl::OkStatus();
}

absl::Status MarkLatest(const std::string& run_dir, const std::string& checkpoint_dir) {
  return services::WriteFileAtomically(run_dir + "/checkpoints/latest",
                             fs::path(checkpoint_dir).filename().string() + "\n");
}

absl::StatusOr<std::optional<std::string>> FindLatest(const std::string& run_dir) {
  const std::string pointer = run_dir + "/checkpoints/latest";
  if (!fs::exists(pointer)) return std::optional<std::string>();
  absl::StatusOr<std::string> name = ReadFile(pointer);
  if (!name.ok()) return name.status();
  std::string dir = absl::StrCat(run_dir, "/checkpoints/", absl::StripAsciiWhitespace(*name));
  if (!fs::is_directory(dir)) {
    return absl::DataLossError(absl::StrCat(pointer, " names missing checkpoint ", dir));
  }
  return std::optional<std::string>(dir);
}

}  // namespace kappa::learner
