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
#include "learner/algo/alarms.h"
#include "learner/algo/balance.h"

namespace kappa::learner {

struct TrainerState {
  int64_t step = 0;            // optimizer steps completed
  int64_t policy_version = 0;  // == step: version k is the policy after step k
  int64_t data_position = 0;   // prompts drawn from the train split
  // Drawn but not yet trained on when the checkpoint was taken (dataset
  // indices, in the order they were due): handed out first on resume.
  std::vector<int64_t> pending_prompts;
  uint64_t seed = 0;
  // The data-parallel ranks of the run that wrote the checkpoint (each
  // wrote one: checkpoint_set.h); 0 in a checkpoint written before it was
  // recorded, read as the resuming run's.
  int64_t world_size = 0;
  // m3_adapt's λ controller; absent when the run has no m3_adapt, or in a
  // checkpoint written before it was recorded.
  std::optional<LambdaControllerState> lambda_controller;
  // The alarm monitor's averages, windows and alarm states; absent in a
  // checkpoint written before they were recorded.
  std::optional<AlarmMonitorState> alarms;
};

std::string CheckpointDir(const std::string& run_dir, int64_t step);

absl::Status WriteTrainerState(const std::string& checkpoint_dir, const TrainerState& state);
// DATA_LOSS naming the file on a malformed one.
absl::StatusOr<TrainerState> ReadTrainerState(const std::string& checkpoint_dir);

// A resumed run (state.step > 0) continues the m3_adapt controller (`lambda`,
// null when the run has none) and the alarm monitor from the checkpoint's
// `state`. A checkpoint written before they were recorded lacks them: each
// missing one starts afresh, with a warning in the log naming it. A fresh
// run (step 0) changes nothing. INVALID_ARGUMENT for a state they refuse.
absl::Status RestoreMonitors(const TrainerState& state, LambdaController* lambda,
                             AlarmMonitor* alarms);
// Points `latest` at checkpoint_dir (atomic rename).
absl::Status MarkLatest(const std::string& run_dir, const std::string& checkpoint_dir);
// The checkpoint `latest` names, or nullopt when there is none.
absl::StatusOr<std::optional<std::string>> FindLatest(const std::string& run_dir);

}  // namespace kappa::learner
