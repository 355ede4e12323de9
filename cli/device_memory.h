// How much memory this machine has for a run's processes: the host's
// available memory and, in CUDA builds, a GPU's free memory.
#pragma once

#include <cstdint>
#include <optional>

namespace kappa::cli {

// MemAvailable of /proc/meminfo, or the cgroup's memory limit less its
// current usage when that is lower (cgroup v2 memory.max/memory.current,
// else v1 memory.limit_in_bytes/usage_in_bytes). nullopt when
// /proc/meminfo cannot be read.
std::optional<int64_t> AvailableHostMemory();

// Free memory of CUDA device `index` (cudaMemGetInfo), releasing the context
// the query made. nullopt in builds without CUDA, or when the query fails.
std::optional<int64_t> FreeDeviceMemory(int index);

}  // namespace kappa::cli
