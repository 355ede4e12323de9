#include "services/torch_runtime.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <mutex>

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

}  // namespace kappa::services
