#include "services/torch_runtime.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <malloc.h>
#include <torch/torch.h>

#include <mutex>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kappa::services {

void ConfigureTorchThreads(int64_t intra_op_threads) {
  if (intra_op_threads > 0) at::set_num_threads(static_cast<int>(intra_op_threads));
  // libtorch allows setting the inter-op pool once, before it is first used;
  // a later call (a second ConfigureTorchThreads, or after parallel work)
  // throws, and the pool is then whatever it already is.
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      at::set_num_interop_threads(1);
    } catch (const c10::Error&) {
    }
  });
}

void ReturnLargeBuffersToTheSystem(int64_t bytes) {
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes));
}

void ReleaseFreedHeap() { malloc_trim(0); }

absl::StatusOr<torch::Device> ResolveDevice(const std::string& name, const std::string& key) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name != "cuda" && name.rfind("cuda:", 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": '", name, "' is not cpu, cuda or cuda:N"));
  }
  int index = 0;
  if (name != "cuda" && (!absl::SimpleAtoi(name.substr(5), &index) || index < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": '", name, "' has no device index"));
  }
  const int64_t available = static_cast<int64_t>(torch::cuda::device_count());
  if (index >= available) {
    return absl::FailedPreconditionError(absl::StrCat(
        key, ": '", name, "' asked for, but this libtorch sees ", available,
        " CUDA device(s) (a CPU build of libtorch, or no GPU visible)"));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

torch::ScalarType ResolveModelDtype(ModelDtype dtype, const torch::Device& device) {
  switch (dtype) {
    case ModelDtype::kAuto:
      return device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
    case ModelDtype::kFloat32:
      return torch::kFloat32;
    case ModelDtype::kBFloat16:
      return torch::kBFloat16;
  }
  throw std::logic_error("unreachable");
}

}  // namespace kappa::services
