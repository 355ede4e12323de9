// AdamW with its state split over the data-parallel ranks (learner.shard:
// optimizer, ZeRO stage 1; docs/scaling.md "Sharding the learner's state").
//
// The trainable parameters, flattened and concatenated in their order, are
// one vector of N elements, padded to R·S with S = ⌈N / R⌉. Rank r owns
// elements [r·S, min((r + 1)·S, N)): it holds AdamW's two moments for them
// only (8·N / R bytes in float32 where an unsharded rank holds 8·N) and
// updates only them. Every rank still has the whole summed and clipped
// gradient, so every global quantity of the step (κ, the cosine, m3_*, the
// clip factor) is computed as before; after the update the ranks
// all-gather the updated elements, and every rank again holds the same
// parameters, bitwise.
//
// The arithmetic is AdamWUpdate's (adamw_in_slices.h), element for
// element what an unsharded AdamWStepInSlices applies.
#pragma once

#include <torch/optim/adamw.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "dist/collectives.h"

namespace kappa::learner {

// What learner.shard splits over the ranks beyond the parameters' copies:
// AdamW's moments (ZeRO stage 1), or the moments and the summed gradients
// (stage 2: each rank keeps its segment of each signal's gradient, reduced
// after every backward pass; optimizer_step.h).
enum class ShardStage { kOptimizer, kGradients };

// Elements [begin, end) of a flat vector of `total` elements.
struct ShardRange {
  int64_t begin = 0, end = 0, total = 0;
  int64_t size() const { return end - begin; }
};

// Rank `rank`'s range of a vector of `total` elements over `world_size`
// ranks, and the padded length R·S every rank's flat buffers take.
// REQUIRES: 0 <= rank < world_size.
ShardRange ShardOf(int64_t total, int rank, int world_size);
int64_t PaddedLength(int64_t total, int world_size);

class ShardedAdamW {
 public:
  // `params`: the trainable parameters in the optimizer's order (one dtype
  // and device, contiguous; std::invalid_argument otherwise). The moments
  // start at zero, as libtorch's do at the first step.
  ShardedAdamW(std::vector<torch::Tensor> params, int rank, int world_size);

  const ShardRange& range() const { return range_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // PaddedLength(range().total, world_size()): the flat buffers' length.
  int64_t padded_length() const { return PaddedLength(range_.total, world_size_); }
  int64_t step() const { return step_; }

  // One AdamW step of this rank's elements at rate `lr`, the other
  // hyperparameters from `options`. `gradient` holds the flat vector's
  // (parameter order) elements from `gradient_begin` on: the whole padded
  // vector from 0 (learner.shard: optimizer), or this rank's segment from
  // range().begin (learner.shard: gradients). Mutates this rank's elements
  // of the parameters and the moments. REQUIRES: no grad mode; `gradient`
  // covers range().
  void Step(const torch::Tensor& gradient, int64_t gradient_begin,
            const torch::optim::AdamWOptions& options, double lr);

  // After every rank's Step: writes this rank's elements into `scratch`
  // (the padded length, e.g. the gradient buffer once it is spent),
  // all-gathers it and copies every parameter from it. Collective.
  void GatherParameters(dist::Collectives& collectives, const torch::Tensor& scratch);

  // The moments, the step count and the shard's place (rank, world size,
  // range). Read refuses a shard of another layout
  // (std::runtime_error naming both), or an archive without one.
  void Write(torch::serialize::OutputArchive& archive) const;
  void Read(torch::serialize::InputArchive& archive);
  // Takes this rank's range out of unsharded moments (libtorch AdamW state,
  // one exp_avg / exp_avg_sq per parameter, in order) and their step count:
  // resuming an unsharded run's optimizer state with learner.shard on.
  void ReadUnsharded(const std::vector<torch::Tensor>& exp_avg,
                     const std::vector<torch::Tensor>& exp_avg_sq, int64_t step);
  // Whether an archive holds a shard (Write's), not unsharded state.
  static bool Holds(torch::serialize::InputArchive& archive);

  // One rank's shard as Write saved it: its place in its layout, its
  // moments and its step count.
  struct Saved {
    int64_t rank = 0, world_size = 0;
    ShardRange range;
    torch::Tensor exp_avg, exp_avg_sq;  // [range.size()]
    int64_t step = 0;
  };
  // Throws std::runtime_error when the archive holds no shard.
  static Saved ReadSaved(torch::serialize::InputArchive& archive);
  // Resharding: this rank's range taken out of `set`, every rank's shard of
  // one earlier layout (another world size), in any order. Throws
  // std::runtime_error naming what is wrong: shards of different layouts,
  // sizes or step counts, a rank missing or twice, or another vector
  // length than this learner's.
  void ReadResharded(const std::vector<Saved>& set);
  // The whole flat moments [total] and the step count of such a set: what
  // an unsharded learner resumes from a sharded run (throws as
  // ReadResharded). Holds 8·N bytes: the unsharded state's size.
  static void Assemble(const std::vector<Saved>& set, int64_t total, torch::Tensor* exp_avg,
                       torch::Tensor* exp_avg_sq, int64_t* step);

 private:
  // fn(i, offset in parameter i, flat offset, n) for each parameter's part
  // inside this rank's range: parameter i's elements [offset, offset + n)
  // are the flat vector's [flat offset, flat offset + n).
  template <typename Fn>
  void ForEachOwnedPart(Fn&& fn) const;

  std::vector<torch::Tensor> params_;
  int rank_, world_size_;
  ShardRange range_;
  torch::Tensor exp_avg_, exp_avg_sq_;  // [range_.size()]
  int64_t step_ = 0;
  torch::Tensor denom_buffer_;  // AdamWUpdate's scratch
};

}  // namespace kappa::learner
