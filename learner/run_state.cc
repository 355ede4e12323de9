#include "learner/run_state.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
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
    return state;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": ", e.what()));
  }
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
