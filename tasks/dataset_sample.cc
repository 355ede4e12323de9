#include "tasks/dataset_sample.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace kappa::tasks {

VectorDataset EvenlySpacedSample(const Dataset& dataset, size_t population, size_t count) {
  const size_t n = std::min(population, dataset.size());
  count = std::min(count, n);
  std::vector<Example> sample;
  sample.reserve(count);
  for (size_t i = 0; i < count; ++i) sample.push_back(dataset.at(i * n / count));
  return VectorDataset(std::move(sample));
}

}  // namespace kappa::tasks
