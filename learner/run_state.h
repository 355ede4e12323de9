// Learner checkpoints for --resume: <run_dir>/checkpoints/step-<N>/ holds the
// student (model.safetensors + config.json), the optimizer state
// (optimizer.pt) and trainer_state.json; <run_dir>/checkpoints/latest names
// the newest complete one. Each piece is written to a temporary name and
// renamed, and `latest` moves last, so a kill mid-checkpoint leaves the
// previous checkpoint as latest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kappa::learner {

struct TrainerState {
  int64_t step = 0;            // optimizer steps completed
  int64_t policy_version = 0;  // == step: version k is the policy after step k
  int64_t data_position = 0;   // prompts drawn from the train split
  // Drawn but not yet trained on when the checkpoint was taken (dataset
  // indices, in the order they were due): handed out first on resume.
  std::vector<int64_t> pending_prompts;
  uint64_t seed = 0;
};

std::string CheckpointDir(const std::string& run_dir, int64_t step);

absl::Status WriteTrainerState(const std::string& checkpoint_dir, const TrainerState& state);
absl::StatusOr<TrainerState> ReadTrainerState(const std::string& checkpoint_dir);
// Points `latest` at checkpoint_dir (atomic rename).
absl::Status MarkLatest(const std::string& run_dir, const std::string& checkpoint_dir);
// The checkpoint `latest` names, or nullopt when there is none.
absl::StatusOr<std::optional<std::string>> FindLatest(const std::string& run_dir);

}  // namespace kappa::learner
