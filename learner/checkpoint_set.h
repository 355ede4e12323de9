// The data-parallel ranks' checkpoints of one step, taken as one set: what
// `--resume` starts every rank from, at the world size that wrote it or at
// another (docs/scaling.md "Resuming at another world size").
//
// Rank k of a run keeps its checkpoints under RankRunDir(base, k): the run
// directory itself for rank 0, base/rank-k/ above. A rank's checkpoint of a
// step is complete once its trainer_state.json reads back (it is written
// last, after the weights and the optimizer state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "learner/run_state.h"

namespace kappa::learner {

std::string RankRunDir(const std::string& base_run_dir, int64_t rank);

struct CheckpointSet {
  int64_t step = 0;
  int64_t world_size = 1;         // the ranks that wrote it, one checkpoint each
  std::vector<std::string> dirs;  // rank k's checkpoint directory, k < world_size
  std::vector<TrainerState> states;
};

// The newest step at which every rank of the run that wrote rank 0's
// checkpoints has a complete checkpoint; nullopt when rank 0 has none. The
// writing run's world size is the one rank 0's newest checkpoint records
// (`world_size_now` when it records none). Where rank 0's `latest` is not
// complete on every rank (a rank died while the set was being written),
// falls back to the newest complete step and logs a warning naming both.
// DATA_LOSS when no step is complete on every rank, naming rank 0's latest
// and the rank that lacks it; INVALID_ARGUMENT when the newest complete set
// is not of one run (CheckOneRun).
absl::StatusOr<std::optional<CheckpointSet>> FindCheckpointSet(const std::string& base_run_dir,
                                                               int64_t world_size_now);

// OK when every rank's state in `set` agrees with rank 0's on the step,
// policy version, seed and world size; else INVALID_ARGUMENT naming the
// first rank's checkpoint that does not (a checkpoint of another run
// copied in, or a rank directory left from an earlier run).
absl::Status CheckOneRun(const CheckpointSet& set);

// Rank `rank` of `world_size`'s trainer state from a set written by
// another number of ranks. The step, version, seed, m3_adapt's λ and the
// alarms are rank 0's (the same on every rank for all but the alarms,
// which only rank 0 reports). The prompts: no prompt of the writing ranks'
// shares is lost or drawn twice. Each old rank k drew the global indices
// k, k + R_old, … of one seeded sequence (prompt_source.h), up to its own
// position; the new ranks all start at the first position p with
// p · world_size at or past the highest index any old rank drew, and
// every index below that which no old rank drew becomes a pending prompt,
// after the old ranks' own pending ones; the pending prompts are dealt to
// the new ranks in turn. INVALID_ARGUMENT when the set is not of one run
// (CheckOneRun).
// `dataset_size` and `prompt_seed` are the PromptSource's (the train
// split's size and the run's seed).
absl::StatusOr<TrainerState> ReshardTrainerState(const CheckpointSet& set, size_t dataset_size,
                                                 uint64_t prompt_seed, int64_t rank,
                                                 int64_t world_size);

}  // namespace kappa::learner
