#include "learner/algo/sharded_adamw.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "learner/algo/adamw_in_slices.h"

namespace kappa::learner {
namespace {

constexpr int64_t kSliceElements = int64_t{1} << 20;
constexpr const char* kLayoutKey = "kappa_shard_layout";  // [rank, world size, begin, end, total]
constexpr const char* kExpAvgKey = "kappa_shard_exp_avg";
constexpr const char* kExpAvgSqKey = "kappa_shard_exp_avg_sq";
constexpr const char* kStepKey = "kappa_shard_adamw_step";

int64_t TotalElements(const std::vector<torch::Tensor>& params) {
  int64_t total = 0;
  for (const torch::Tensor& p : params) total += p.numel();
  return total;
}

std::string Describe(int64_t rank, int64_t world_size, int64_t begin, int64_t end, int64_t total) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (elements " +
         std::to_string(begin) + ".." + std::to_string(end) + " of " + std::to_string(total) + ")";
}

}  // namespace

int64_t PaddedLength(int64_t total, int world_size) {
  const int64_t segment = (total + world_size - 1) / world_size;
  return segment * world_size;
}

ShardRange ShardOf(int64_t total, int rank, int world_size) {
  const int64_t segment = PaddedLength(total, world_size) / world_size;
  ShardRange range;
  range.total = total;
  range.begin = std::min(total, rank * segment);
  range.end = std::min(total, (rank + 1) * segment);
  return range;
}

ShardedAdamW::ShardedAdamW(std::vector<torch::Tensor> params, int rank, int world_size)
    : params_(std::move(params)), rank_(rank), world_size_(world_size) {
  if (params_.empty() || world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("ShardedAdamW: want parameters and 0 <= rank < world size, got " +
                                std::to_string(params_.size()) + " parameters, rank " +
                                std::to_string(rank) + " of " + std::to_string(world_size));
  }
  for (const torch::Tensor& p : params_) {
    if (!p.is_contiguous() || p.scalar_type() != params_.front().scalar_type() ||
        p.device() != params_.front().device()) {
      throw std::invalid_argument(
          "ShardedAdamW: the parameters must be contiguous, of one dtype and on one device");
    }
  }
  range_ = ShardOf(TotalElements(params_), rank_, world_size_);
  exp_avg_ = torch::zeros({range_.size()}, params_.front().options());
  exp_avg_sq_ = torch::zeros({range_.size()}, params_.front().options());
}

template <typename Fn>
void ShardedAdamW::ForEachOwnedPart(Fn&& fn) const {
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t numel = params_[i].numel();
    const int64_t begin = std::max(offset, range_.begin);
    const int64_t end = std::min(offset + numel, range_.end);
    if (begin < end) fn(i, begin - offset, begin, end - begin);
    offset += numel;
  }
}

void ShardedAdamW::Step(const torch::Tensor& flat_gradient,
                        const torch::optim::AdamWOptions& options, double lr) {
  if (options.amsgrad()) throw std::invalid_argument("ShardedAdamW: amsgrad is not implemented");
  ++step_;
  ForEachOwnedPart([&](size_t i, int64_t in_param, int64_t first, int64_t n) {
    const int64_t local = first - range_.begin;
    AdamWUpdate(params_[i].view({-1}).narrow(0, in_param, n), flat_gradient.narrow(0, first, n),
                exp_avg_.narrow(0, local, n), exp_avg_sq_.narrow(0, local, n), options, lr, step_,
                kSliceElements, &denom_buffer_);
  });
}

void ShardedAdamW::GatherParameters(dist::Collectives& collectives, const torch::Tensor& scratch) {
  if (scratch.numel() != padded_length()) {
    throw std::invalid_argument("ShardedAdamW::GatherParameters: scratch of " +
                                std::to_string(scratch.numel()) + " elements, want " +
                                std::to_string(padded_length()));
  }
  ForEachOwnedPart([&](size_t i, int64_t in_param, int64_t first, int64_t n) {
    scratch.narrow(0, first, n).copy_(params_[i].view({-1}).narrow(0, in_param, n));
  });
  collectives.AllGatherInPlace(scratch);
  int64_t offset = 0;
  for (const torch::Tensor& p : params_) {
    p.view({-1}).copy_(scratch.narrow(0, offset, p.numel()));
    offset += p.numel();
  }
}

void ShardedAdamW::Write(torch::serialize::OutputArchive& archive) const {
  archive.write(kLayoutKey, torch::tensor({int64_t{rank_}, int64_t{world_size_}, range_.begin,
                                           range_.end, range_.total}));
  archive.write(kExpAvgKey, exp_avg_);
  archive.write(kExpAvgSqKey, exp_avg_sq_);
  archive.write(kStepKey, torch::tensor(step_));
}

bool ShardedAdamW::Holds(torch::serialize::InputArchive& archive) {
  torch::Tensor layout;
  return archive.try_read(kLayoutKey, layout);
}

void ShardedAdamW::Read(torch::serialize::InputArchive& archive) {
  torch::Tensor layout;
  if (!archive.try_read(kLayoutKey, layout) || layout.numel() != 5) {
    throw std::runtime_error(
        "the optimizer state holds no shard (learner.shard: optimizer wants "
        "one per rank)");
  }
  const auto l = layout.to(torch::kInt64);
  const int64_t rank = l[0].item<int64_t>(), world = l[1].item<int64_t>();
  const int64_t begin = l[2].item<int64_t>(), end = l[3].item<int64_t>();
  const int64_t total = l[4].item<int64_t>();
  if (rank != rank_ || world != world_size_ || begin != range_.begin || end != range_.end ||
      total != range_.total) {
    throw std::runtime_error(
        "the optimizer state is the shard of " + Describe(rank, world, begin, end, total) +
        ", this learner is " +
        Describe(rank_, world_size_, range_.begin, range_.end, range_.total) +
        " (resuming sharded optimizer state needs the same learner.world_size and model)");
  }
  torch::Tensor exp_avg, exp_avg_sq, step;
  archive.read(kExpAvgKey, exp_avg);
  archive.read(kExpAvgSqKey, exp_avg_sq);
  archive.read(kStepKey, step);
  exp_avg_.copy_(exp_avg);
  exp_avg_sq_.copy_(exp_avg_sq);
  step_ = step.item<int64_t>();
}

void ShardedAdamW::ReadUnsharded(const std::vector<torch::Tensor>& exp_avg,
                                 const std::vector<torch::Tensor>& exp_avg_sq, int64_t step) {
  if (exp_avg.size() != params_.size() || exp_avg_sq.size() != params_.size()) {
    throw std::runtime_error("the unsharded optimizer state has moments for " +
                             std::to_string(exp_avg.size()) + " parameters, this learner trains " +
                             std::to_string(params_.size()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = params_[i].numel();
    if (exp_avg[i].numel() != n || exp_avg_sq[i].numel() != n) {
      throw std::runtime_error("the unsharded optimizer state's moments of parameter " +
                               std::to_string(i) + " have " + std::to_string(exp_avg[i].numel()) +
                               " elements, the parameter " + std::to_string(n));
    }
  }
  ForEachOwnedPart([&](size_t i, int64_t in_param, int64_t first, int64_t n) {
    const int64_t local = first - range_.begin;
    exp_avg_.narrow(0, local, n).copy_(exp_avg[i].reshape({-1}).narrow(0, in_param, n));
    exp_avg_sq_.narrow(0, local, n).copy_(exp_avg_sq[i].reshape({-1}).narrow(0, in_param, n));
  });
  step_ = step;
}

}  // namespace kappa::learner
