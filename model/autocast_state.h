// The autocast state of one device type (on or off, and to which dtype),
// captured in a forward pass and re-entered for a recomputation in backward,
// as torch.utils.checkpoint does: a node that recomputes its forward outside
// the forward's autocast state differentiates a different function (the
// chunked vocabulary head and activation checkpointing, docs/algorithms.md
// "Precision"). Works with libtorch 1.13 (the CPU build here) and 2.x (the
// GPU machine), whose autocast APIs differ.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace kappa::model {

struct AutocastState {
  bool enabled = false;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;  // meaningful when enabled

  // The state autocast has for `device_type` now (CPU or CUDA; any other
  // device type reads as disabled).
  static AutocastState Current(c10::DeviceType device_type);

  // One integer for an autograd node's saved_data (which holds IValues):
  // the dtype's code when enabled, -1 when not. Decode(Encode()) is the
  // state again (a disabled state's dtype is not kept).
  int64_t Encode() const;
  static AutocastState Decode(int64_t code);
};

// Sets `state` for `device_type` for the scope's lifetime and restores the
// previous state after; while enabled it counts as one autocast nesting
// level, and leaving the outermost one frees autocast's cache of cast
// weights. Nesting is fine. A CPU or CUDA device type only (others are a
// no-op: autocast has no state for them).
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device_type, AutocastState state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  bool nested_ = false;  // incremented autocast's nesting level
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  AutocastState previous_;
};

}  // namespace kappa::model
