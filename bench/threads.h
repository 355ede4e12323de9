// The benches' --threads: libtorch's intra-op threads and, where libtorch
// calls a pthread OpenBLAS (Debian), OpenBLAS's own pool, which
// torch::set_num_threads does not reach.
#pragma once

#include <dlfcn.h>
#include <torch/utils.h>

namespace kappa::bench {

// OpenBLAS's pool alone (what OPENBLAS_NUM_THREADS sets at start-up); a
// no-op where libtorch has no OpenBLAS. REQUIRES: threads > 0.
inline void SetBlasThreads(int threads) {
  using SetThreads = void (*)(int);
  if (auto set_blas =
          reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_blas(threads);
  }
}

// REQUIRES: threads > 0.
inline void SetBenchThreads(int threads) {
  torch::set_num_threads(threads);
  SetBlasThreads(threads);
}

}  // namespace kappa::bench
