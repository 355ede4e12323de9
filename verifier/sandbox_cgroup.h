// Per-run cgroups for the code sandbox: one memory limit (and pids limit)
// for all of a run's processes together, which RLIMIT_AS (per process)
// cannot give. Internal to the sandbox (verifier/sandbox.h).
//
// cgroup v2 when /sys/fs/cgroup is cgroup2: runs are children of the
// verifier's own cgroup, which must have the memory and pids controllers
// in its cgroup.subtree_control. v2 forbids processes in a cgroup that
// delegates controllers (except the root), so when the verifier's own
// cgroup holds only the verifier, ProbeRunCgroups moves it into a leaf
// child "kappa-verifier" first; when other processes share it, there are
// no run cgroups (reported by the probe). Otherwise cgroup v1 when its
// memory hierarchy is mounted at /sys/fs/cgroup/memory (and pids, when
// mounted, at /sys/fs/cgroup/pids): runs are children of the verifier's
// cgroup in each.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "verifier/sandbox.h"

namespace kappa::verifier::sandbox_internal {

// Finds (and for v2 prepares, see above) the parent cgroups, and checks
// that a child with a memory limit can be made there. Needs root. Idempotent.
SandboxCgroups ProbeRunCgroups();

// One run's cgroup(s): made with limits by Create, emptied (SIGKILL to what
// is left) and removed by the destructor.
class RunCgroup {
 public:
  RunCgroup() = default;
  RunCgroup(const RunCgroup&) = delete;
  RunCgroup& operator=(const RunCgroup&) = delete;
  ~RunCgroup();

  // memory.max (v1: memory.limit_in_bytes and memsw) = memory_bytes, no
  // swap, the whole run OOM-killed together (v2 memory.oom.group);
  // pids.max = max_processes. Opens each cgroup.procs for writing.
  absl::Status Create(const SandboxCgroups& parents, int64_t memory_bytes, int max_processes);

  // The cgroup.procs fds to join (-1: none), for ChildPlan::cgroup_procs.
  int memory_procs() const { return memory_procs_; }
  int pids_procs() const { return pids_procs_; }
  // Whether the kernel's OOM killer killed a process of the run.
  bool OomKilled() const;

 private:
  int version_ = 0;
  std::string memory_, pids_;
  int memory_procs_ = -1, pids_procs_ = -1;
};

}  // namespace kappa::verifier::sandbox_internal
