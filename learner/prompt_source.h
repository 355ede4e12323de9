// Endless, seeded stream of training prompts: a fresh permutation of the
// dataset each epoch. `position` counts prompts drawn so far, which is all a
// resumed run needs to continue the same sequence.
//
// Data parallel: rank `shard` of `shards` draws every shards-th prompt of
// that one sequence (positions shard, shard + shards, ...), so the ranks
// split each epoch between them instead of each sampling all of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kappa::learner {

class PromptSource {
 public:
  PromptSource(size_t dataset_size, uint64_t seed, int64_t position = 0, int shard = 0,
               int shards = 1);

  size_t Next();  // index into the dataset
  int64_t position() const { return position_; }

 private:
  void ShuffleEpoch(int64_t epoch);

  size_t size_;
  uint64_t seed_;
  int64_t position_;  // this shard's draws
  int shard_;
  int shards_;
  int64_t epoch_ = -1;
  std::vector<size_t> order_;
};

}  // namespace kappa::learner
