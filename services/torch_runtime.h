// libtorch process settings, so several processes on one machine do not
// oversubscribe the cores.
#pragma once

#include <cstdint>

namespace kappa::services {

// intra_op_threads > 0 sets at::set_num_threads; inter-op threads are set to 1
// (kappa runs no inter-op parallel graphs). 0 keeps libtorch's default.
void ConfigureTorchThreads(int64_t intra_op_threads);

}  // namespace kappa::services
