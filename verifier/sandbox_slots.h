// A counting semaphore over sandbox runs: however many Verify calls arrive
// at once, at most `capacity` sandboxed programs exist, so a flood of code
// items cannot fork an unbounded number of processes. Each held slot has an
// index in [0, capacity), so concurrent runs can be told apart (each runs
// under its own uid: RLIMIT_NPROC counts per uid, and a fork bomb in one run
// must not use up a neighbour's process budget).
#pragma once

#include <vector>

#include "absl/synchronization/mutex.h"

namespace kappa::verifier {

class SandboxSlots {
 public:
  explicit SandboxSlots(int capacity)
      : free_(capacity < 1 ? 1 : capacity), in_use_(static_cast<size_t>(free_), false) {}
  SandboxSlots(const SandboxSlots&) = delete;
  SandboxSlots& operator=(const SandboxSlots&) = delete;

  // Holds one slot for its lifetime; blocks until one is free.
  class Lease {
   public:
    explicit Lease(SandboxSlots& slots) : slots_(slots) {
      absl::MutexLock lock(&slots_.mu_);
      slots_.mu_.Await(absl::Condition(
          +[](int* free) { return *free > 0; }, &slots_.free_));
      --slots_.free_;
      while (slots_.in_use_[static_cast<size_t>(index_)]) ++index_;
      slots_.in_use_[static_cast<size_t>(index_)] = true;
    }
    ~Lease() {
      absl::MutexLock lock(&slots_.mu_);
      ++slots_.free_;
      slots_.in_use_[static_cast<size_t>(index_)] = false;
    }
    // Which slot: no other live Lease has the same index.
    int index() const { return index_; }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

   private:
    SandboxSlots& slots_;
    int index_ = 0;
  };

  int free() const {
    absl::MutexLock lock(&mu_);
    return free_;
  }

 private:
  mutable absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> in_use_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kappa::verifier
