// One policy version in one dtype as a file in shared memory (/dev/shm), for
// rollout workers on the learner's host (rollout.weight_transport: shm/auto,
// issue 38). The learner writes it once; every worker copies it straight
// into its model. Shared by the learner (WriteShmSegment) and the worker
// (MapShmSegment), so both sides read one layout.
//
// Layout (host byte order; both sides are on one host):
//   [0, 64)            ShmHeader: magic "KAPPASHM", format, token, version,
//                      policy_id, manifest and data offsets, total size
//   [64, 64 + m)       a WeightGroupManifest (learner.proto): version,
//                      policy_id, config.json, dtype, each parameter's name
//                      and shape, in order
//   [data_offset, ..)  the tensors in that order, contiguous, in the
//                      manifest's dtype, each starting 64-byte aligned
//                      (data_offset is 4096-aligned); ShmOffsets() computes
//                      where from the manifest alone
//
// Both sides move the bytes with pwrite/pread through the kernel, in
// pieces over the intra-op threads, not through a mapping: on a VM with
// costly page faults (this 2-core machine) writing 1 GB through a fresh
// shared mapping took 1.2-3.4 s and pwrite 0.27 s.
//
// Atomicity: a segment is written into an unnamed O_TMPFILE file and only
// linked under its name when complete, so a named segment is always whole,
// and is never written again (a new version is a new file). A process that
// dies before the link leaks nothing. Names: kappa-<pid>-<nonce>-v<version>-
// <dtype> in the shared-memory directory; <pid> lets a later learner sweep
// the segments of dead ones (SweepDeadShmSegments).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kappa/v1/learner.pb.h"

namespace kappa::dist {

inline constexpr char kDefaultShmDir[] = "/dev/shm";
inline constexpr char kShmPrefix[] = "kappa-";

// What tells two processes they can share segments: the machine's boot id
// (/proc/sys/kernel/random/boot_id) and the device and inode of `dir`, so
// two containers with their own /dev/shm on one host do not match.
absl::StatusOr<std::string> ShmHostKey(const std::string& dir = kDefaultShmDir);

// Byte offset of each tensor of `manifest` from the segment's start, and the
// segment's total size (the last element).
std::vector<int64_t> ShmOffsets(const kappa::v1::WeightGroupManifest& manifest,
                                int64_t data_offset);

// A linked segment the learner wrote, mapped read-only in this process
// until the last reference goes (the file may be unlinked long before: the
// mapping stays valid). The views fault pages in only when read (by gRPC
// streams sending the same version as chunks).
class ShmSegment {
 public:
  ShmSegment(std::string path, uint64_t token, int64_t bytes, void* base,
             std::vector<std::pair<std::string, torch::Tensor>> views);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& path() const { return path_; }
  uint64_t token() const { return token_; }
  int64_t bytes() const { return bytes_; }
  // The tensors, as views of the mapping (valid while this object lives;
  // never written).
  const std::vector<std::pair<std::string, torch::Tensor>>& views() const { return views_; }

 private:
  const std::string path_;
  const uint64_t token_;
  const int64_t bytes_;
  void* const base_;
  const std::vector<std::pair<std::string, torch::Tensor>> views_;
};

struct ShmContent {
  int64_t version = 0;
  uint64_t policy_id = 0;
  std::string model_config_json;
  torch::ScalarType dtype = torch::kBFloat16;  // float32 or bfloat16
  // CPU tensors of any floating dtype, converted to `dtype` on the way.
  const std::vector<std::pair<std::string, torch::Tensor>>* weights = nullptr;
};

// Writes `content` into an unnamed file in `dir` and links it as
// `dir`/`name` once complete. Converts and writes with every intra-op
// thread (1 M elements per piece through a per-piece buffer; pieces already
// in `dtype` are written straight from the tensor). RESOURCE_EXHAUSTED when
// `dir` has no room (ENOSPC: Docker's default /dev/shm is 64 MiB,
// deploy/), another error naming the call otherwise; nothing is left
// behind on any error.
// `prepared`: an unnamed file from PrepareShmFile (taken over: closed
// here), written instead of a new one when it has exactly the segment's
// size; -1: none.
absl::StatusOr<std::shared_ptr<const ShmSegment>> WriteShmSegment(const std::string& dir,
                                                                  const std::string& name,
                                                                  const ShmContent& content,
                                                                  int prepared = -1);

// An unnamed (O_TMPFILE) file of `bytes` in `dir` whose pages are all
// written once (zeros), so a later WriteShmSegment into it does not pay
// for fresh memory: on a VM first touches of memory cost up to ~4 s/GB.
// RESOURCE_EXHAUSTED when `dir` has no room.
absl::StatusOr<int> PrepareShmFile(const std::string& dir, int64_t bytes);

// The size of the segment WriteShmSegment would write for `content`.
int64_t ShmSegmentBytes(const ShmContent& content);

// A segment opened read-only in the worker: its manifest, and the reads of
// its tensors into the worker's model. Keeps the file open (valid after an
// unlink); closed when destroyed.
class OpenShmSegment {
 public:
  OpenShmSegment(int fd, std::string path, kappa::v1::WeightGroupManifest manifest,
                 torch::ScalarType dtype, std::vector<int64_t> offsets);
  ~OpenShmSegment();
  OpenShmSegment(const OpenShmSegment&) = delete;
  OpenShmSegment& operator=(const OpenShmSegment&) = delete;

  const kappa::v1::WeightGroupManifest& manifest() const { return manifest_; }
  torch::ScalarType dtype() const { return dtype_; }

  // Reads each (destination, manifest parameter index) pair: straight into
  // the destination's memory when it is a contiguous CPU tensor of the
  // segment's dtype, else through a buffer and converted (any dtype,
  // device). In pieces over the intra-op threads. REQUIRES: each
  // destination has the parameter's shape. An error names the segment.
  absl::Status ReadInto(const std::vector<std::pair<torch::Tensor, int>>& reads) const;

 private:
  const int fd_;
  const std::string path_;
  const kappa::v1::WeightGroupManifest manifest_;
  const torch::ScalarType dtype_;
  const std::vector<int64_t> offsets_;
};

// Opens the segment a SHARED_MEMORY chunk names, checking that it is one (a
// kappa- file directly in a directory), that its size is `bytes`, and that
// its header has the magic, `token`, `version` and `policy_id`, and a
// manifest (float32 or bfloat16) that fits. NOT_FOUND when it is gone (the
// learner moved on two versions, or restarted), INVALID_ARGUMENT or
// DATA_LOSS naming what differs otherwise.
absl::StatusOr<std::unique_ptr<OpenShmSegment>> OpenShmSegmentFor(const std::string& path,
                                                                  int64_t bytes, uint64_t token,
                                                                  int64_t version,
                                                                  uint64_t policy_id);

// Unlinks every kappa-<pid>-* file in `dir` whose <pid> is not a live
// process (kill(pid, 0) fails with ESRCH), or is a process that started
// after the file was last written (the dead learner's pid, reused);
// returns how many. Files of live learners and other names are left alone.
int SweepDeadShmSegments(const std::string& dir = kDefaultShmDir);

// When process `pid` started, in seconds since the epoch (/proc/PID/stat's
// start time after /proc/stat's boot time); nullopt when unreadable.
std::optional<double> ProcessStartSeconds(int pid);

}  // namespace kappa::dist
