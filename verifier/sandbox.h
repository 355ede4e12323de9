// Runs untrusted Python (model-generated code plus the task's tests) in a
// child process, so that no solution can hang, exhaust, read or reach
// anything the verifier cares about. What is and is not enforced, and the
// fallback when not running as root, is in docs/security.md.
//
// Process layout per run (root, full isolation):
//   verifier ── fork ──► supervisor (setsid; new net, mount and pid namespaces;
//                         everything read-only but the work dir, a tmpfs)
//                            └─ fork ──► python (pid 1 of its namespace; fresh
//                                        /proc; rlimits; uid/gid 65534;
//                                        no_new_privs; execve with a clean env)
// When the python process dies, the kernel kills everything left in its pid
// namespace, so no descendant outlives the run (setsid() does not escape it).
// On timeout the verifier closes a pipe the supervisor watches; the
// supervisor, which has not reaped the program, kills it (no pid-reuse race).
// The verifier's side is in sandbox.cc, the children's (fork() to execve(),
// async-signal-safe only) in sandbox_child.{h,cc}: one function per step,
// each named for what it guarantees.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kappa::verifier {

struct SandboxOptions {
  std::string python = "/usr/bin/python3";
  // Where the per-run work directories are created; empty: $TMPDIR or /tmp.
  // Must be traversable by `uid` (the work dir itself is chowned to it).
  std::string work_root;
  absl::Duration wall_timeout = absl::Seconds(10);
  int cpu_seconds = 5;                             // RLIMIT_CPU (SIGKILL at the limit)
  int64_t address_space_bytes = int64_t{1} << 30;  // RLIMIT_AS
  // RLIMIT_FSIZE: the largest file it may write (a write past it fails with
  // EFBIG; SIGXFSZ kills only outside a pid namespace). With a mount
  // namespace the work dir is a tmpfs of 4x this size.
  int64_t file_size_bytes = int64_t{16} << 20;
  int max_processes = 32;   // RLIMIT_NPROC: counts every process of `uid` (see security.md)
  // With run cgroups (SandboxIsolation::cgroups): memory.max of the whole
  // run, all its processes together (no swap), and pids.max = max_processes.
  int64_t run_memory_bytes = int64_t{1} << 30;
  int max_open_files = 64;  // RLIMIT_NOFILE
  size_t output_limit_bytes = 64 * 1024;  // tail of stdout and of stderr kept for logs
  uid_t uid = 65534;                      // the unprivileged identity (nobody/nogroup)
  gid_t gid = 65534;
};

// Where per-run cgroups are made (verifier/sandbox_cgroup.h); version 0:
// nowhere, and `missing` says why.
struct SandboxCgroups {
  int version = 0;      // 1 or 2
  std::string memory;   // the parent directory of run cgroups, memory controller
  std::string pids;     // pids controller (v2: == memory); empty: no pids limit
  std::string missing;  // when version is 0
};

// What the kernel lets this process do for a run. Every flag but
// unix_socket_filter needs root (CAP_SYS_ADMIN, CAP_SETUID/SETGID);
// ProbeSandboxIsolation() decides.
struct SandboxIsolation {
  bool network_namespace = false;  // empty net namespace: no interface but a down loopback
  bool mount_namespace = false;    // every mount read-only (and nosuid) except the work dir
  bool pid_namespace = false;      // the run's processes die together; fresh /proc
  bool drop_privileges = false;    // setgroups({}), setgid, setuid to options.uid/gid
  // seccomp: socket(AF_UNIX) and io_uring_setup fail, so no socket bound to
  // a path (which no network namespace hides) is reachable.
  bool unix_socket_filter = false;
  SandboxCgroups cgroups;  // per-run memory.max and pids.max

  bool full() const {
    return network_namespace && mount_namespace && pid_namespace && drop_privileges &&
           unix_socket_filter && cgroups.version != 0;
  }
  std::string ToString() const;
};

// Tries each isolation feature in a throwaway child and returns those that
// work (none when not root). Never fails: a missing feature is a weaker
// sandbox, which the caller must log.
SandboxIsolation ProbeSandboxIsolation();

struct SandboxResult {
  enum class Outcome {
    kPass,     // exited 0 and the program reported completion (see `completion_fd`)
    kFail,     // exited non-zero, or 0 without reporting completion
    kTimeout,  // still running at the wall-clock timeout: killed
    kKilled,   // died from a signal (CPU or file-size limit, SIGSEGV, ...)
    kError,    // the sandbox itself could not run it (setup failure): not the code's fault
  };
  Outcome outcome = Outcome::kError;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal killed it
  bool timed_out = false;
  bool completed = false;  // wrote to the completion fd
  bool oom_killed = false;  // the run's cgroup memory limit killed a process of it
  double seconds = 0.0;    // wall time of the run
  std::string stdout_tail;
  std::string stderr_tail;
  std::string error;  // for kError: which setup step failed and why

  float reward() const { return outcome == Outcome::kPass ? 1.0f : 0.0f; }
  std::string Summary() const;  // one line for logs
};

const char* OutcomeName(SandboxResult::Outcome outcome);  // "pass", "fail", ...

// Writes `files` (name → contents; plain names, no '/') into a fresh empty
// work directory, runs `python -I -S -B <entry>` there with the limits of
// `options` and the features of `isolation`, and removes the directory.
// The program sees fd 0 = /dev/null, 1/2 = pipes, 3 = the completion fd (a
// pipe: writing anything to it marks the run completed), nothing else, and the
// environment {PATH=/usr/bin:/bin, LANG=C.UTF-8} only.
// Errors (a non-OK status) are for invalid arguments only; everything that
// happens to the run, setup failures included, is in the result.
absl::StatusOr<SandboxResult> RunSandboxed(
    const std::vector<std::pair<std::string, std::string>>& files, const std::string& entry,
    const SandboxOptions& options, const SandboxIsolation& isolation);

}  // namespace kappa::verifier
