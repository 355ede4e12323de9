// Which data-parallel rank this learner process is and where the ranks meet,
// from the config (learner.world_size, learner.dist_store) and the flags
// --world-size R, --rank N|auto, --dist-store URL (flags win).
//
// `--rank auto` reads the ordinal a StatefulSet puts at the end of the pod's
// host name (learner-2 → rank 2), so one pod template serves every rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dist/collectives.h"
#include "learner/algo/optimizer_step.h"
#include "services/config.h"

namespace kappa::learner {

struct DataParallelSetup {
  int rank = 0;
  int world_size = 1;
  std::string store;  // tcp://HOST:PORT or file:///PATH; empty when world_size is 1
  bool primary() const { return rank == 0; }
  // Groups each rank trains on per step (trainer.groups_per_step / world_size).
  int64_t local_groups_per_step = 0;
};

// INVALID_ARGUMENT naming the flag or key: a rank outside [0, world_size), a
// world size above 1 without a store, --rank auto on a host name without a
// trailing -N, or trainer.groups_per_step not divisible by the world size.
absl::StatusOr<DataParallelSetup> ResolveDataParallel(
    const services::Config& config, const std::map<std::string, std::string>& flags,
    const std::string& host_name);

// The CUDA device index a rank computes on. `learner.device: cuda` (no
// index) under data parallel means this rank's own GPU among the `visible`
// ones: rank mod visible, so R ranks on one R-GPU machine take one GPU each,
// and a pod that sees only its own GPU takes index 0. `cuda:N` is taken as
// asked (`resolved_index`), as is everything with one rank.
int RankCudaIndex(const std::string& device_name, int resolved_index,
                  const DataParallelSetup& setup, int visible);

// INVALID_ARGUMENT unless `world_size` >= 1 divides trainer.groups_per_step
// and learner.shard is none where `world_size` is 1: the check `kappa run` makes on
// learner.world_size before starting anything (it picks the store itself).
absl::Status CheckWorldSize(const services::Config& config, int64_t world_size);

// Data parallel: meets the other ranks at setup.store (blocks until all
// setup.world_size have joined, or the collectives' timeout), makes
// `optimizer` sum every rank's gradients and start from rank 0's weights,
// then checks that every rank starts at rank 0's `start_step` (a resumed
// rank must have loaded a checkpoint of the same step, or the ranks would
// run different numbers of collectives); every rank learns of a mismatch at
// once. FAILED_PRECONDITION naming both steps on a mismatch, UNAVAILABLE
// when the ranks cannot meet. One rank: nothing to join, returns null.
// The returned collectives must outlive the optimizer's use of them.
absl::StatusOr<std::unique_ptr<dist::Collectives>> JoinDataParallel(const DataParallelSetup& setup,
                                                                    int64_t start_step,
                                                                    PolicyOptimizer& optimizer);

}  // namespace kappa::learner
