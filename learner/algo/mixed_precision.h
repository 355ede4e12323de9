// Mixed precision for the learner's forward pass: under bf16 autocast the
// matrix multiplies run in bfloat16 while the parameters, their gradients,
// AdamW's moments and every loss reduction stay in float32 (the losses take
// log_softmax in float32 whatever the logits' dtype: StableLogSoftmax).
#pragma once

#include <torch/types.h>

#include <optional>
#include <string>

#include "model/autocast_state.h"

namespace kappa::learner {

enum class Precision { kFloat32, kBFloat16 };

// "fp32" | "bf16"; throws std::invalid_argument listing both.
Precision ParsePrecision(const std::string& name);
const char* PrecisionName(Precision precision);

// Enables autocast to `precision` for `device` for the guard's lifetime and
// restores the previous state after (nesting is fine). kFloat32 does
// nothing. Works with libtorch 1.13 (the CPU build here) and 2.x (the GPU
// machine), whose autocast API differ.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, Precision precision);
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<model::AutocastScope> scope_;  // empty for fp32
};

}  // namespace kappa::learner
