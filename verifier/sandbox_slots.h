// A counting semaphore over sandbox runs: however many Verify calls arrive
// at once, at most `capacity` sandboxed programs exist, so a flood of code
// items cannot fork an unbounded number of processes.
#pragma once

#include "absl/synchronization/mutex.h"

namespace kappa::verifier {

class SandboxSlots {
 public:
  explicit SandboxSlots(int capacity) : free_(capacity < 1 ? 1 : capacity) {}
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
    }
    ~Lease() {
      absl::MutexLock lock(&slots_.mu_);
      ++slots_.free_;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

   private:
    SandboxSlots& slots_;
  };

  int free() const {
    absl::MutexLock lock(&mu_);
    return free_;
  }

 private:
  mutable absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kappa::verifier
