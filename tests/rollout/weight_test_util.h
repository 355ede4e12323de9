// Test helpers for the weight-sync tests (weight_sync_test.cc,
// weight_group_test.cc): the learner's snapshots of a tiny decoder and
// bit-exact checks of what a worker's model holds.
#pragma once

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "learner/policy_publisher.h"
#include "model/checkpoint.h"
#include "tasks/dataset.h"
#include "tests/rollout/test_policy.h"

namespace kappa::rollout::testing {

using Weights = std::map<std::string, torch::Tensor>;

inline constexpr absl::Duration kWait = absl::Seconds(30);

// The one-example train set a LearnerService needs to exist.
class EmptyDataset final : public tasks::Dataset {
 public:
  size_t size() const override { return 1; }
  const tasks::Example& at(size_t) const override { return example_; }

 private:
  tasks::Example example_{"e", "1+1=", "2", "arithmetic", ""};
};

// Deep CPU float32 copies of a decoder's parameters.
inline Weights CopyWeights(model::Decoder& decoder) {
  Weights weights;
  for (const auto& [name, tensor] : model::NamedWeights(decoder)) {
    weights.emplace(name, tensor.detach().to(torch::kCPU, torch::kFloat32).clone());
  }
  return weights;
}

// What the learner publishes for `weights` (TinyConfig's shape).
inline std::shared_ptr<const learner::PolicySnapshot> Snapshot(int64_t version,
                                                               const Weights& weights) {
  auto snapshot = std::make_shared<learner::PolicySnapshot>();
  snapshot->version = version;
  snapshot->model_config_json = TinyConfig().ToJson();
  for (const auto& [name, tensor] : weights) snapshot->weights.emplace_back(name, tensor.clone());
  return snapshot;
}

// Bit for bit (torch::equal would take -0 for +0).
inline bool SameBytes(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.detach().to(torch::kCPU).contiguous();
  const torch::Tensor y = b.detach().to(torch::kCPU).contiguous();
  return x.scalar_type() == y.scalar_type() && x.sizes() == y.sizes() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

// Every parameter of `model` equals `expected` converted to the model's dtype
// through `wire` (the rounding the wire applies), bit for bit.
inline void ExpectModelHolds(model::Decoder& model, const Weights& expected,
                             torch::ScalarType wire) {
  const Weights loaded = model::NamedWeights(model);
  ASSERT_EQ(loaded.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    const torch::Tensor& got = loaded.at(name);
    const torch::Tensor want = tensor.to(wire).to(got.scalar_type());
    EXPECT_TRUE(SameBytes(got, want)) << name;
  }
}

// Polls `done` every 5 ms for up to kWait (counters the service updates
// after the worker has already published a version).
inline bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + kWait;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

}  // namespace kappa::rollout::testing
