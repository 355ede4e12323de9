#include "learner/data_parallel_setup.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kappa::learner {
namespace {

std::string FlagOr(const std::map<std::string, std::string>& flags, const std::string& name,
                   const std::string& fallback) {
  const auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

}  // namespace

absl::StatusOr<DataParallelSetup> ResolveDataParallel(
    const services::Config& config, const std::map<std::string, std::string>& flags,
    const std::string& host_name) {
  DataParallelSetup setup;
  const std::string world_size =
      FlagOr(flags, "world-size", absl::StrCat(config.learner.world_size));
  if (!absl::SimpleAtoi(world_size, &setup.world_size) || setup.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world-size / learner.world_size: want an integer >= 1, got '",
                     world_size, "'"));
  }
  const std::string rank = FlagOr(flags, "rank", "0");
  if (rank == "auto") {
    const size_t dash = host_name.rfind('-');
    if (dash == std::string::npos ||
        !absl::SimpleAtoi(host_name.substr(dash + 1), &setup.rank)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rank auto: host name '", host_name, "' does not end in -N (a StatefulSet ordinal)"));
    }
  } else if (!absl::SimpleAtoi(rank, &setup.rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank: want an integer or 'auto', got '", rank, "'"));
  }
  if (setup.rank < 0 || setup.rank >= setup.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--rank: ", setup.rank, " is outside [0, ",
                                                   setup.world_size, ") (the world size)"));
  }
  if (setup.world_size > 1) {
    setup.store = FlagOr(flags, "dist-store", config.learner.dist_store);
    if (setup.store.empty()) {
      return absl::InvalidArgumentError(
          "--dist-store / learner.dist_store: needed when the world size is above 1 "
          "(tcp://HOST:PORT of rank 0, or file:///PATH)");
    }
  }
  if (absl::Status status = CheckWorldSize(config, setup.world_size); !status.ok()) {
    return status;
  }
  setup.local_groups_per_step = config.trainer.groups_per_step / setup.world_size;
  return setup;
}

absl::Status CheckWorldSize(const services::Config& config, int64_t world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("learner.world_size: want an integer >= 1, got ", world_size));
  }
  if (config.trainer.groups_per_step % world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer.groups_per_step (", config.trainer.groups_per_step,
                     ") must be a multiple of the world size (", world_size, ")"));
  }
  if (config.learner.shard != services::LearnerShard::kNone && world_size == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner.shard: ", std::string(services::ChoiceName(config.learner.shard)),
        " splits state over the data-parallel ranks, and learner.world_size is 1 (set it above "
        "1, or learner.shard: none)"));
  }
  return absl::OkStatus();
}

int RankCudaIndex(const std::string& device_name, int resolved_index,
                  const DataParallelSetup& setup, int visible) {
  if (device_name != "cuda" || setup.world_size <= 1 || visible <= 0) return resolved_index;
  return setup.rank % visible;
}

absl::StatusOr<std::unique_ptr<dist::Collectives>> JoinDataParallel(const DataParallelSetup& setup,
                                                                    int64_t start_step,
                                                                    PolicyOptimizer& optimizer) {
  if (setup.world_size <= 1) return nullptr;
  spdlog::info("data parallel: rank {} of {}, meeting at {}", setup.rank, setup.world_size,
               setup.store);
  dist::CollectivesOptions options;
  options.store = setup.store;
  options.rank = setup.rank;
  options.world_size = setup.world_size;
  options.device = optimizer.parameters().front().device();
  // A collective waits for the slowest rank's batch, so this bounds how
  // long any rank may go without groups before the run fails.
  options.timeout = std::chrono::minutes(30);
  KAPPA_ASSIGN_OR_RETURN(std::unique_ptr<dist::Collectives> collectives,
                         base::CaptureExceptions(
                             "data parallel", [&] { return dist::ConnectCollectives(options); },
                             absl::StatusCode::kUnavailable));
  KAPPA_RETURN_IF_ERROR(base::CaptureExceptions(
      "data parallel", [&] { optimizer.set_collectives(collectives.get()); },
      absl::StatusCode::kUnavailable));
  spdlog::info("data parallel: all {} ranks joined", setup.world_size);
  const torch::Tensor step = torch::tensor({start_step}, torch::kLong).to(options.device);
  const torch::Tensor rank0_step = step.clone();
  collectives->Broadcast({rank0_step}, 0);
  const torch::Tensor mismatches = (step != rank0_step).to(torch::kLong);
  collectives->SumInPlace({mismatches});
  if (mismatches.item<int64_t>() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data parallel: the ranks start from different steps (this rank ", start_step, ", rank 0 ",
        rank0_step.item<int64_t>(), "); resume every rank from the same checkpoint step"));
  }
  return collectives;
}

}  // namespace kappa::learner
