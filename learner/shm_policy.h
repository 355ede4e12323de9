// The learner's shared-memory segments (dist/shm_segment.h): names them,
// keeps the latest two versions' and unlinks the rest, and all of its own at
// Shutdown() or destruction. One per PolicyPublisher.
//
// Rules (issue 38, item 3):
//  - a segment is linked only when whole, and never written again;
//  - writing version v unlinks every segment of a version <= v - 2 (a worker
//    still copying one keeps a valid mapping; a late open gets ENOENT and
//    the worker falls back to gRPC chunks);
//  - after each write, a background thread prepares the next segment's
//    unnamed file (PrepareShmFile: its pages written once), so the next
//    version is written into memory that is already backed: one more
//    segment's worth of shared memory, dropped on any error;
//  - at construction, segments of learners that are no longer alive are
//    unlinked (SweepDeadShmSegments), so a killed learner leaks nothing
//    past the next one's start.
//
// Thread-safe.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dist/shm_segment.h"

namespace kappa::learner {

class ShmPolicyStore {
 public:
  // Segments go to `dir` (tmpfs; /dev/shm by default). Sweeps the dead
  // learners' segments there. A `dir` whose host key cannot be read gives a
  // store with an empty host_key() that never writes.
  explicit ShmPolicyStore(std::string dir = dist::kDefaultShmDir);
  ~ShmPolicyStore();  // UnlinkAll()
  ShmPolicyStore(const ShmPolicyStore&) = delete;
  ShmPolicyStore& operator=(const ShmPolicyStore&) = delete;

  // This host's key (ShmHostKey(dir)); empty when unknown.
  const std::string& host_key() const { return host_key_; }
  const std::string& dir() const { return dir_; }

  // Writes `content` as kappa-<pid>-<nonce>-v<version>-<dtype> and then
  // unlinks the segments of versions <= content.version - 2. Errors:
  // WriteShmSegment's (RESOURCE_EXHAUSTED on ENOSPC), FAILED_PRECONDITION
  // after UnlinkAll() or without a host key, NOT_FOUND for a version that
  // is already two behind the newest written.
  absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> Write(const dist::ShmContent& content)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Unlinks every segment this store linked; later Write()s fail.
  void UnlinkAll() ABSL_LOCKS_EXCLUDED(mu_);

  // The paths linked now, oldest version first (for tests and logs).
  std::vector<std::string> linked() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t segments_written() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string dir_;
  const std::string host_key_;
  const uint64_t nonce_;
  mutable absl::Mutex mu_;
  // (version, dtype) -> path, of the segments linked and not yet unlinked.
  std::map<std::pair<int64_t, int>, std::string> linked_ ABSL_GUARDED_BY(mu_);
  int64_t newest_ ABSL_GUARDED_BY(mu_) = -1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // The prepared unnamed file (-1: none) and the thread preparing it.
  int spare_fd_ ABSL_GUARDED_BY(mu_) = -1;
  bool preparing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread preparer_ ABSL_GUARDED_BY(mu_);
  // Starts preparing a spare of `bytes` unless one exists or is under way.
  void PrepareSpare(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kappa::learner
