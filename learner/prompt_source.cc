#include "learner/prompt_source.h"

#include <random>
#include <stdexcept>

namespace kappa::learner {

PromptSource::PromptSource(size_t dataset_size, uint64_t seed, int64_t position, int shard,
                           int shards)
    : size_(dataset_size), seed_(seed), position_(position), shard_(shard), shards_(shards) {
  if (size_ == 0) throw std::invalid_argument("PromptSource: empty dataset");
  if (shards_ < 1 || shard_ < 0 || shard_ >= shards_) {
    throw std::invalid_argument("PromptSource: shard " + std::to_string(shard_) + " of " +
                                std::to_string(shards_));
  }
}

// Fisher-Yates with a hand-rolled bounded draw: std::uniform_int_distribution
// is implementation-defined, and a resumed run must see the same order.
void PromptSource::ShuffleEpoch(int64_t epoch) {
  order_.resize(size_);
  for (size_t i = 0; i < size_; ++i) order_[i] = i;
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
  for (size_t i = size_ - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(rng() % (i + 1));
    std::swap(order_[i], order_[j]);
  }
  epoch_ = epoch;
}

size_t PromptSource::Next() {
  const int64_t global = position_ * shards_ + shard_;
  const int64_t epoch = global / static_cast<int64_t>(size_);
  if (epoch != epoch_) ShuffleEpoch(epoch);
  const size_t index = order_[global % static_cast<int64_t>(size_)];
  ++position_;
  return index;
}

}  // namespace kappa::learner
