// A Dataset backed by an in-memory vector; what both dataset factories return.
#pragma once

#include <utility>
#include <vector>

#include "tasks/dataset.h"

namespace kappa::tasks {

class VectorDataset final : public Dataset {
 public:
  explicit VectorDataset(std::vector<Example> examples) : examples_(std::move(examples)) {}
  size_t size() const override { return examples_.size(); }
  const Example& at(size_t index) const override { return examples_.at(index); }

 private:
  std::vector<Example> examples_;
};

}  // namespace kappa::tasks
