// The benches' --threads: libtorch's intra-op threads and, where libtorch
// calls a pthread OpenBLAS (Debian), OpenBLAS's own pool, which
// torch::set_num_threads does not reach.
#pragma once

#include <dlfcn.h>
#include <torch/utils.h>

namespace kappa::bench {

// REQUIRES: threads > 0.
inline void SetBenchThreads(int threads) {
  torch::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set_blas =
          reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_blas(threads);
  }
}

}  // namespace kappa::bench
