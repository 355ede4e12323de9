#include "model/autocast_state.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace kappa::model {
namespace {

bool HasAutocast(c10::DeviceType type) {
  return type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA;
}

// libtorch 2.4 replaced the per-device setters with ones taking the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool Enabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
void SetEnabled(c10::DeviceType type, bool on) { at::autocast::set_autocast_enabled(type, on); }
c10::ScalarType Dtype(c10::DeviceType type) { return at::autocast::get_autocast_dtype(type); }
void SetDtype(c10::DeviceType type, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
bool Enabled(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                       : at::autocast::is_cpu_enabled();
}
void SetEnabled(c10::DeviceType type, bool on) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
c10::ScalarType Dtype(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                       : at::autocast::get_autocast_cpu_dtype();
}
void SetDtype(c10::DeviceType type, c10::ScalarType dtype) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

}  // namespace

AutocastState AutocastState::Current(c10::DeviceType device_type) {
  if (!HasAutocast(device_type)) return AutocastState{};
  return AutocastState{Enabled(device_type), Dtype(device_type)};
}

int64_t AutocastState::Encode() const { return enabled ? static_cast<int64_t>(dtype) : -1; }

AutocastState AutocastState::Decode(int64_t code) {
  if (code < 0) return AutocastState{};
  return AutocastState{true, static_cast<c10::ScalarType>(code)};
}

AutocastScope::AutocastScope(c10::DeviceType device_type, AutocastState state) {
  if (!HasAutocast(device_type)) return;
  active_ = true;
  device_type_ = device_type;
  previous_ = AutocastState::Current(device_type);
  SetEnabled(device_type, state.enabled);
  SetDtype(device_type, state.dtype);
  if (state.enabled) at::autocast::increment_nesting();
  nested_ = state.enabled;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // Leaving the outermost autocast region frees its cache of cast weights.
  if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetEnabled(device_type_, previous_.enabled);
  SetDtype(device_type_, previous_.dtype);
}

}  // namespace kappa::model
