#include "learner/algo/mixed_precision.h"

#include <torch/torch.h>

#include <stdexcept>

namespace kappa::learner {

Precision ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  throw std::invalid_argument("unknown precision '" + name + "' (fp32 | bf16)");
}

const char* PrecisionName(Precision precision) {
  return precision == Precision::kBFloat16 ? "bf16" : "fp32";
}

AutocastGuard::AutocastGuard(const torch::Device& device, Precision precision) {
  if (precision == Precision::kFloat32) return;
  if (!device.is_cuda() && !device.is_cpu()) {
    throw std::invalid_argument("bf16 autocast needs a CPU or CUDA device, got " + device.str());
  }
  scope_.emplace(device.type(), model::AutocastState{true, torch::kBFloat16});
}

}  // namespace kappa::learner
