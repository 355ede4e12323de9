#include "learner/algo/mixed_precision.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <stdexcept>

namespace kappa::learner {
namespace {

// libtorch 2.4 replaced the per-device setters with ones taking the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool AutocastEnabled(torch::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
void SetAutocastEnabled(torch::DeviceType type, bool on) {
  at::autocast::set_autocast_enabled(type, on);
}
torch::ScalarType AutocastDtype(torch::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
void SetAutocastDtype(torch::DeviceType type, torch::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
bool AutocastEnabled(torch::DeviceType type) {
  return type == torch::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void SetAutocastEnabled(torch::DeviceType type, bool on) {
  if (type == torch::kCUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
torch::ScalarType AutocastDtype(torch::DeviceType type) {
  return type == torch::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                              : at::autocast::get_autocast_cpu_dtype();
}
void SetAutocastDtype(torch::DeviceType type, torch::ScalarType dtype) {
  if (type == torch::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

}  // namespace

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
  active_ = true;
  device_type_ = device.type();
  previous_enabled_ = AutocastEnabled(device_type_);
  previous_dtype_ = AutocastDtype(device_type_);
  SetAutocastEnabled(device_type_, true);
  SetAutocastDtype(device_type_, torch::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Leaving the outermost autocast region frees its cache of bf16 weight copies.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocastEnabled(device_type_, previous_enabled_);
  SetAutocastDtype(device_type_, previous_dtype_);
}

}  // namespace kappa::learner
