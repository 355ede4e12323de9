#include "cli/device_memory.h"

#include <fstream>
#include <sstream>
#include <string>

#ifdef KAPPA_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kappa::cli {
namespace {

// The first number of a one-line file ("max" and unreadable: nullopt).
std::optional<int64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  int64_t value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

std::optional<int64_t> CgroupHeadroom() {
  for (const auto& [limit_file, usage_file] :
       {std::pair<const char*, const char*>{"/sys/fs/cgroup/memory.max",
                                            "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const std::optional<int64_t> limit = ReadNumber(limit_file);
    const std::optional<int64_t> usage = ReadNumber(usage_file);
    // cgroup v1 writes "no limit" as a huge number.
    if (limit && usage && *limit < (int64_t{1} << 60)) return *limit - *usage;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::optional<int64_t> available;
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = 0;
    if (fields >> kib) available = kib * 1024;
  }
  if (!available) return std::nullopt;
  const std::optional<int64_t> cgroup = CgroupHeadroom();
  return cgroup && *cgroup < *available ? *cgroup : *available;
}

std::optional<int64_t> FreeDeviceMemory(int index) {
#ifdef KAPPA_CUDA
  size_t free = 0, total = 0;
  if (cudaSetDevice(index) != cudaSuccess) return std::nullopt;
  const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
  // The context the query created would otherwise hold device memory for as
  // long as `kappa run` supervises the run.
  cudaDeviceReset();
  if (!ok) return std::nullopt;
  return static_cast<int64_t>(free);
#else
  (void)index;
  return std::nullopt;
#endif
}

}  // namespace kappa::cli
