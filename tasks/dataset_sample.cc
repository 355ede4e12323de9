#include "tasks/dataset_sample.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace kappa::tasks {

VectorDataset EvenlySpacedSample(const Dataset& dataset, size_t count) {
  const size_t size = dataset.size();
  count = std::min(count, size);
  std::vector<Example> sample;
  sample.reserve(count);
  for (size_t i = 0; i < count; ++i) sample.push_back(dataset.at(i * size / count));
  return VectorDataset(std::move(sample));
}

}  // namespace kappa::tasks
