// The child side of RunSandboxed (verifier/sandbox.h): the supervisor and
// the program's process, from fork() to execve(). Internal to the sandbox.
//
// Everything here runs in a copy of a multi-threaded process, so it may only
// make async-signal-safe calls: raw syscalls and plain memory reads of data
// the parent prepared (a ChildPlan). No malloc, no locks, no logging; a
// failure travels to the parent as a fixed-size Record on the control pipe.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "verifier/sandbox.h"

namespace kappa::verifier::sandbox_internal {

// The fds the program runs with are 0..3 (/dev/null, stdout, stderr, the
// completion pipe). kControlFd is close-on-exec, so it closes when execve
// succeeds and stays with the supervisor, which reports on it. kKillFd is the
// supervisor's only: when the parent closes its end (on timeout, or by
// dying), the supervisor kills the program.
constexpr int kControlFd = 4;
constexpr int kKillFd = 5;

// The setup step that failed, as reported in an error Record.
enum Stage : int32_t {
  kStageFds = 1,
  kStageSetsid,
  kStageUnshareNet,
  kStageUnshareMount,
  kStageMountPrivate,
  kStageMountTmpfs,
  kStageReadOnly,
  kStageWorkDirWritable,
  kStageWriteFiles,
  kStageUnsharePid,
  kStageForkInner,
  kStageMountProc,
  kStageChdir,
  kStageRlimit,
  kStageDropPrivileges,
  kStageNoNewPrivs,
  kStageExec,
  kStageCgroup,
  kStageSeccomp,
};
const char* StageName(int32_t stage);  // "setsid", "execve", ...

// What the supervisor (or the program's process before execve) reports.
enum RecordKind : int32_t { kRecordError = 1, kRecordStatus = 2 };
struct Record {
  int32_t kind;
  int32_t a;  // error: stage; status: wait status
  int32_t b;  // error: errno
};

struct ChildFile {
  const char* name;
  const char* data;
  size_t size;
};

// Everything the children need, prepared (and allocated) before fork().
struct ChildPlan {
  int devnull = -1, stdout_w = -1, stderr_w = -1, completion_w = -1, control_w = -1, kill_r = -1;
  const char* work_dir = nullptr;
  const char* tmpfs_options = nullptr;
  const char* python = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const ChildFile* files = nullptr;
  size_t file_count = 0;
  bool write_files = false;  // the supervisor writes them (onto the fresh tmpfs)
  struct Limit {
    int resource;
    rlim_t soft, hard;
  } limits[6];
  uid_t uid = 0;
  gid_t gid = 0;
  SandboxIsolation isolation;
  // The run's cgroup.procs files (memory, pids), open for writing; -1: none.
  // The supervisor joins them first, so every process of the run is in them.
  int cgroup_procs[2] = {-1, -1};
};

// Installs, in the calling thread, a seccomp filter that makes
// socket(AF_UNIX, ...) and io_uring_setup fail with EPERM and kills the
// process on a system call of another ABI (x32, 32-bit compat). Needs
// PR_SET_NO_NEW_PRIVS (or CAP_SYS_ADMIN). Async-signal-safe. False, with
// errno, when the kernel refuses it; false with errno ENOSYS on an
// architecture the filter is not written for (only x86-64 and aarch64).
bool DenyUnixSockets();

// Writes `files` into the existing directory `dir` (each created, never
// overwritten or followed through a link). Async-signal-safe: used by the
// supervisor on the fresh tmpfs, and by the parent when there is no mount
// namespace.
bool WriteFiles(const char* dir, const ChildFile* files, size_t count);

// The supervisor, run in the child of the parent's fork(): sets up the
// namespaces (which need root), forks the program, reports its wait status
// on kControlFd, exits.
[[noreturn]] void SupervisorMain(const ChildPlan& plan);

}  // namespace kappa::verifier::sandbox_internal
