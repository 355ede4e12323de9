#include "learner/checkpoint_set.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "learner/prompt_source.h"

namespace kappa::learner {
namespace {

namespace fs = std::filesystem;

// The steps rank 0 has a checkpoint directory of, newest first, none newer
// than `latest`.
std::vector<int64_t> StepsUpTo(const std::string& base_run_dir, int64_t latest) {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(base_run_dir + "/checkpoints", error)) {
    const std::string file_name = entry.path().filename().native();
    absl::string_view name = file_name;
    int64_t step = 0;
    if (entry.is_directory() && absl::ConsumePrefix(&name, "step-") &&
        absl::SimpleAtoi(name, &step) && step <= latest) {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Every rank's complete checkpoint of `step`, the ranks being those rank
// 0's checkpoint of it records; else the first rank whose checkpoint is
// missing or incomplete, in *missing.
std::optional<CheckpointSet> CompleteSetAt(const std::string& base_run_dir, int64_t step,
                                           int64_t world_size_now, std::string* missing) {
  CheckpointSet set;
  set.step = step;
  for (int64_t rank = 0; rank < set.world_size; ++rank) {  // world_size: rank 0's
    const std::string dir = CheckpointDir(RankRunDir(base_run_dir, rank), step);
    absl::StatusOr<TrainerState> state = ReadTrainerState(dir);
    if (!state.ok() || state->step != step) {
      *missing = absl::StrCat("rank ", rank, " has no complete checkpoint of step ", step, " (",
                              state.ok() ? absl::StrCat(dir, " is of step ", state->step)
                                         : std::string(state.status().message()),
                              ")");
      return std::nullopt;
    }
    if (rank == 0) set.world_size = state->world_size > 0 ? state->world_size : world_size_now;
    set.dirs.push_back(dir);
    set.states.push_back(*std::move(state));
  }
  return set;
}

}  // namespace

absl::Status CheckOneRun(const CheckpointSet& set) {
  const TrainerState& first = set.states.front();
  for (size_t rank = 1; rank < set.states.size(); ++rank) {
    const TrainerState& state = set.states[rank];
    if (state.step != first.step || state.policy_version != first.policy_version ||
        state.seed != first.seed || state.world_size != first.world_size) {
      const std::string where =
          rank < set.dirs.size() ? set.dirs[rank] : absl::StrCat("rank ", rank);
      return absl::InvalidArgumentError(absl::StrCat(
          "--resume: the ranks' checkpoints of step ", set.step, " are not of one run: ", where,
          " has step, policy_version, seed, world_size ", state.step, ", ", state.policy_version,
          ", ", state.seed, ", ", state.world_size, " against rank 0's ", first.step, ", ",
          first.policy_version, ", ", first.seed, ", ", first.world_size));
    }
  }
  return absl::OkStatus();
}

std::string RankRunDir(const std::string& base_run_dir, int64_t rank) {
  return rank == 0 ? base_run_dir : absl::StrCat(base_run_dir, "/rank-", rank);
}

absl::StatusOr<std::optional<CheckpointSet>> FindCheckpointSet(const std::string& base_run_dir,
                                                               int64_t world_size_now) {
  KAPPA_ASSIGN_OR_RETURN(const std::optional<std::string> latest, FindLatest(base_run_dir));
  if (!latest.has_value()) return std::optional<CheckpointSet>();
  KAPPA_ASSIGN_OR_RETURN(const TrainerState newest, ReadTrainerState(*latest));
  std::string first_missing;
  for (int64_t step : StepsUpTo(base_run_dir, newest.step)) {
    std::string missing;
    std::optional<CheckpointSet> set = CompleteSetAt(base_run_dir, step, world_size_now, &missing);
    if (set.has_value()) {
      KAPPA_RETURN_IF_ERROR(CheckOneRun(*set));
      if (step != newest.step) {
        spdlog::warn(
            "resume: the checkpoint of step {} is not complete on every rank ({}); resuming "
            "from step {}, the newest step every rank completed",
            newest.step, first_missing, step);
      }
      return set;
    }
    if (first_missing.empty()) first_missing = missing;
  }
  return absl::DataLossError(absl::StrCat("--resume: ", *latest,
                                          " is the latest checkpoint but no step is complete on "
                                          "every rank: ",
                                          first_missing));
}

absl::StatusOr<TrainerState> ReshardTrainerState(const CheckpointSet& set, size_t dataset_size,
                                                 uint64_t prompt_seed, int64_t rank,
                                                 int64_t world_size) {
  KAPPA_RETURN_IF_ERROR(CheckOneRun(set));
  const int64_t old_world = set.world_size;
  const TrainerState& first = set.states.front();
  // Old rank k drew global indices k + j·R_old for j < its position.
  auto drawn = [&](int64_t index) {
    return index / old_world < set.states[index % old_world].data_position;
  };
  int64_t end = 0,
          lowest =
              std::numeric_limits<int64_t>::max();  // past the highest drawn; below which all are
  for (int64_t k = 0; k < old_world; ++k) {
    const int64_t position = set.states[k].data_position;
    if (position > 0) end = std::max(end, (position - 1) * old_world + k + 1);
    lowest = std::min(lowest, position * old_world);
  }
  const int64_t position = (end + world_size - 1) / world_size;

  std::vector<int64_t> pending;
  for (const TrainerState& state : set.states) {
    pending.insert(pending.end(), state.pending_prompts.begin(), state.pending_prompts.end());
  }
  PromptSource sequence(dataset_size, prompt_seed, lowest);
  for (int64_t index = lowest; index < position * world_size; ++index) {
    const int64_t prompt = static_cast<int64_t>(sequence.Next());
    if (!drawn(index)) pending.push_back(prompt);
  }

  TrainerState state = first;
  state.world_size = world_size;
  state.data_position = position;
  state.pending_prompts.clear();
  for (size_t i = static_cast<size_t>(rank); i < pending.size();
       i += static_cast<size_t>(world_size)) {
    state.pending_prompts.push_back(pending[i]);
  }
  return state;
}

}  // namespace kappa::learner
