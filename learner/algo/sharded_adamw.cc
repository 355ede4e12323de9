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

void ShardedAdamW::Step(const torch::Tensor& gradient, int64_t gradient_begin,
                        const torch::optim::AdamWOptions& options, double lr) {
  if (options.amsgrad()) throw std::invalid_argument("ShardedAdamW: amsgrad is not implemented");
  if (range_.size() > 0 &&
      (gradient_begin > range_.begin || gradient_begin + gradient.numel() < range_.end)) {
    throw std::invalid_argument(
        "ShardedAdamW::Step: the gradient's elements " + std::to_string(gradient_begin) + ".." +
        std::to_string(gradient_begin + gradient.numel()) + " do not cover this rank's " +
        std::to_string(range_.begin) + ".." + std::to_string(range_.end));
  }
  ++step_;
  ForEachOwnedPart([&](size_t i, int64_t in_param, int64_t first, int64_t n) {
    const int64_t local = first - range_.begin;
    AdamWUpdate(params_[i].view({-1}).narrow(0, in_param, n),
                gradient.narrow(0, first - gradient_begin, n), exp_avg_.narrow(0, local, n),
                exp_avg_sq_.narrow(0, local, n), options, lr, step_, kSliceElements,
                &denom_buffer_);
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

ShardedAdamW::Saved ShardedAdamW::ReadSaved(torch::serialize::InputArchive& archive) {
  torch::Tensor layout;
  if (!archive.try_read(kLayoutKey, layout) || layout.numel() != 5) {
    throw std::runtime_error(
        "the optimizer state holds no shard (learner.shard wants one per rank)");
  }
  const auto l = layout.to(torch::kInt64);
  Saved saved;
  saved.rank = l[0].item<int64_t>();
  saved.world_size = l[1].item<int64_t>();
  saved.range.begin = l[2].item<int64_t>();
  saved.range.end = l[3].item<int64_t>();
  saved.range.total = l[4].item<int64_t>();
  torch::Tensor step;
  archive.read(kExpAvgKey, saved.exp_avg);
  archive.read(kExpAvgSqKey, saved.exp_avg_sq);
  archive.read(kStepKey, step);
  saved.step = step.item<int64_t>();
  if (saved.exp_avg.numel() != saved.range.size() ||
      saved.exp_avg_sq.numel() != saved.range.size()) {
    throw std::runtime_error("the shard of " +
                             Describe(saved.rank, saved.world_size, saved.range.begin,
                                      saved.range.end, saved.range.total) +
                             " holds " + std::to_string(saved.exp_avg.numel()) + " moments");
  }
  return saved;
}

void ShardedAdamW::Read(torch::serialize::InputArchive& archive) {
  const Saved saved = ReadSaved(archive);
  const ShardRange& r = saved.range;
  if (saved.rank != rank_ || saved.world_size != world_size_ || r.begin != range_.begin ||
      r.end != range_.end || r.total != range_.total) {
    throw std::runtime_error(
        "the optimizer state is the shard of " +
        Describe(saved.rank, saved.world_size, r.begin, r.end, r.total) + ", this learner is " +
        Describe(rank_, world_size_, range_.begin, range_.end, range_.total) +
        " (resuming sharded optimizer state needs the same learner.world_size and model, or "
        "the whole set of the run's shards to reshard)");
  }
  exp_avg_.copy_(saved.exp_avg);
  exp_avg_sq_.copy_(saved.exp_avg_sq);
  step_ = saved.step;
}

namespace {

// Throws unless `set` is every rank's shard of one layout of `total`
// elements, each exactly once, at one step count.
void CheckCompleteSet(const std::vector<ShardedAdamW::Saved>& set, int64_t total) {
  if (set.empty()) throw std::runtime_error("no shards to reshard from");
  const int64_t world = set.front().world_size;
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(world, 0)), false);
  for (const ShardedAdamW::Saved& saved : set) {
    const std::string which = Describe(saved.rank, saved.world_size, saved.range.begin,
                                       saved.range.end, saved.range.total);
    if (saved.world_size != world || saved.rank < 0 || saved.rank >= world ||
        seen[static_cast<size_t>(saved.rank)]) {
      throw std::runtime_error("the shards are not one set: " + which + " among shards of " +
                               std::to_string(world) + " ranks");
    }
    seen[static_cast<size_t>(saved.rank)] = true;
    const ShardRange expected =
        ShardOf(total, static_cast<int>(saved.rank), static_cast<int>(world));
    if (saved.range.total != total || saved.range.begin != expected.begin ||
        saved.range.end != expected.end) {
      throw std::runtime_error("the shard of " + which + " is not a shard of this learner's " +
                               std::to_string(total) + " trainable elements over " +
                               std::to_string(world) + " ranks (another model or LoRA?)");
    }
    if (saved.step != set.front().step) {
      throw std::runtime_error("the shards' step counts differ: " + std::to_string(saved.step) +
                               " and " + std::to_string(set.front().step));
    }
  }
  if (static_cast<int64_t>(set.size()) != world) {
    throw std::runtime_error("the set of shards is incomplete: " + std::to_string(set.size()) +
                             " of " + std::to_string(world) + " ranks' shards");
  }
}

}  // namespace

void ShardedAdamW::ReadResharded(const std::vector<Saved>& set) {
  CheckCompleteSet(set, range_.total);
  // Each saved shard's overlap with this rank's range, copied in place.
  for (const Saved& saved : set) {
    const int64_t begin = std::max(saved.range.begin, range_.begin);
    const int64_t end = std::min(saved.range.end, range_.end);
    if (begin >= end) continue;
    exp_avg_.narrow(0, begin - range_.begin, end - begin)
        .copy_(saved.exp_avg.narrow(0, begin - saved.range.begin, end - begin));
    exp_avg_sq_.narrow(0, begin - range_.begin, end - begin)
        .copy_(saved.exp_avg_sq.narrow(0, begin - saved.range.begin, end - begin));
  }
  step_ = set.front().step;
}

void ShardedAdamW::Assemble(const std::vector<Saved>& set, int64_t total, torch::Tensor* exp_avg,
                            torch::Tensor* exp_avg_sq, int64_t* step) {
  CheckCompleteSet(set, total);
  *exp_avg = torch::zeros({total}, set.front().exp_avg.options());
  *exp_avg_sq = torch::zeros({total}, set.front().exp_avg_sq.options());
  for (const Saved& saved : set) {
    exp_avg->narrow(0, saved.range.begin, saved.range.size()).copy_(saved.exp_avg);
    exp_avg_sq->narrow(0, saved.range.begin, saved.range.size()).copy_(saved.exp_avg_sq);
  }
  *step = set.front().step;
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
