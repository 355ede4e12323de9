// libtorch process settings: threads, so several processes on one machine do
// not oversubscribe the cores, and the device a process computes on.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kappa::services {

// intra_op_threads > 0 sets at::set_num_threads; inter-op threads are set to 1
// (kappa runs no inter-op parallel graphs). 0 keeps libtorch's default.
void ConfigureTorchThreads(int64_t intra_op_threads);

// The device a config key names: "cpu", "cuda" or "cuda:N". INVALID_ARGUMENT
// naming `key` for anything else, FAILED_PRECONDITION when CUDA is asked for
// and this libtorch has no CUDA device (a CPU build, or no GPU visible).
absl::StatusOr<torch::Device> ResolveDevice(const std::string& name, const std::string& key);

// The parameter dtype a config key names for a model that runs on `device`:
// "bfloat16", "float32", or "auto" (bfloat16 on CUDA, float32 on the CPU,
// where bf16 matmuls are slow). INVALID_ARGUMENT naming `key` otherwise.
absl::StatusOr<torch::ScalarType> ResolveModelDtype(const std::string& name, const std::string& key,
                                                    const torch::Device& device);

}  // namespace kappa::services
