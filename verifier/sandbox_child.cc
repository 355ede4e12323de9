// The child side of the sandbox; see sandbox_child.h for the rule every line
// here follows (async-signal-safe only) and sandbox.h for the process layout.
// Each function below is one isolation step, named for what it guarantees;
// SupervisorMain and ProgramMain are their sequence.
#include "verifier/sandbox_child.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

namespace kappa::verifier::sandbox_internal {
namespace {

void WriteRecord(int fd, Record record) {
  // 12 bytes < PIPE_BUF: atomic, and the pipe has room for many.
  while (write(fd, &record, sizeof(record)) < 0 && errno == EINTR) {
  }
}

[[noreturn]] void Fail(int fd, Stage stage) {
  WriteRecord(fd, {kRecordError, stage, errno});
  _exit(127);
}

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void SetMountAttributes(const char* path, unsigned int flags, uint64_t set, uint64_t clear,
                        Stage stage) {
  mount_attr attr{};
  attr.attr_set = set;
  attr.attr_clr = clear;
  if (syscall(SYS_mount_setattr, AT_FDCWD, path, flags, &attr, sizeof(attr)) < 0) {
    Fail(kControlFd, stage);
  }
}

// ---------------------------------------------------------------------------
// The seccomp filter of DenyUnixSockets, classic BPF over seccomp_data.

#if defined(__x86_64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;
constexpr uint32_t kForeignAbiBit = 0x40000000;  // __X32_SYSCALL_BIT: x32 syscalls
#elif defined(__aarch64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
constexpr uint32_t kForeignAbiBit = 0;
#endif

#if defined(__x86_64__) || defined(__aarch64__)
constexpr uint32_t kDenied = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);
// Offsets into struct seccomp_data; args[0]'s low 32 bits (little-endian)
// hold socket()'s int domain.
constexpr uint32_t kArchOffset = offsetof(seccomp_data, arch);
constexpr uint32_t kNrOffset = offsetof(seccomp_data, nr);
constexpr uint32_t kArg0Offset = offsetof(seccomp_data, args[0]);

// 0  ld arch;  1  jeq native ? 2 : kill
// 2  ld nr;    3  jge foreign-ABI bit ? kill : 4  (x32 on x86-64; never on aarch64)
// 4  jeq io_uring_setup ? deny : 5
// 5  jeq socket ? 6 : allow
// 6  ld args[0]; 7  jeq AF_UNIX ? deny : allow
// 8  allow;  9  deny;  10 kill
constexpr sock_filter kUnixSocketFilter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kArchOffset),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 0, 8),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kNrOffset),
    BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, kForeignAbiBit == 0 ? 0xffffffffu : kForeignAbiBit, 6, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup, 4, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 2),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kArg0Offset),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_RET | BPF_K, kDenied),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
};
#endif

// ---------------------------------------------------------------------------
// The supervisor's steps.

// A process group of its own: the parent's timeout kills the whole group.
void BecomeAProcessGroupOfItsOwn(const ChildPlan& plan) {
  if (setsid() < 0) Fail(plan.control_w, kStageSetsid);
}

// The run's cgroups (memory.max, pids.max): the supervisor joins them before
// it forks the program, so the program and every descendant count against
// one per-run budget, whatever their uid.
void JoinTheRunsCgroups(const ChildPlan& plan) {
  for (const int procs : plan.cgroup_procs) {
    // "0": the writing process (cgroup v1 and v2).
    if (procs >= 0 && write(procs, "0", 1) != 1) Fail(plan.control_w, kStageCgroup);
  }
}

// Puts devnull/stdout/stderr/completion on 0..3, the control pipe on 4 and
// the kill pipe on 5 (both close-on-exec); closes every other fd, so nothing
// the verifier had open (listening sockets, other runs' pipes, files) reaches
// the program.
void KeepOnlyTheRunsFds(const ChildPlan& plan) {
  const int sources[] = {plan.devnull,      plan.stdout_w,  plan.stderr_w,
                         plan.completion_w, plan.control_w, plan.kill_r};
  int moved[6];
  for (int i = 0; i < 6; ++i) {
    // First above every target, so no dup2 below clobbers a source.
    moved[i] = fcntl(sources[i], F_DUPFD_CLOEXEC, 16);
    if (moved[i] < 0) Fail(plan.control_w, kStageFds);
  }
  for (int i = 0; i < 4; ++i) {
    if (dup2(moved[i], i) < 0) Fail(plan.control_w, kStageFds);  // dup2 clears close-on-exec
  }
  if (dup3(moved[4], kControlFd, O_CLOEXEC) < 0 || dup3(moved[5], kKillFd, O_CLOEXEC) < 0) {
    Fail(plan.control_w, kStageFds);
  }
  if (close_range(kKillFd + 1, ~0U, 0) < 0) {
    rlimit open_files{};
    getrlimit(RLIMIT_NOFILE, &open_files);
    const rlim_t last = std::min<rlim_t>(open_files.rlim_cur, 1 << 20);
    for (rlim_t fd = kKillFd + 1; fd < last; ++fd) close(static_cast<int>(fd));
  }
}

// An empty network namespace: no interface but a down loopback.
void CutOffTheNetwork() {
  if (unshare(CLONE_NEWNET) < 0) Fail(kControlFd, kStageUnshareNet);
}

// A mount namespace where every mount is read-only and nosuid, except the
// work dir: a fresh, size-capped tmpfs.
void MakeEverythingReadOnlyButTheWorkDir(const ChildPlan& plan) {
  if (unshare(CLONE_NEWNS) < 0) Fail(kControlFd, kStageUnshareMount);
  // Nothing done here may propagate back to the host's mounts.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) {
    Fail(kControlFd, kStageMountPrivate);
  }
  // A size-capped tmpfs as the work dir: the only writable place, and the
  // cap bounds what a run can put on disk (RLIMIT_FSIZE bounds one file).
  if (mount("tmpfs", plan.work_dir, "tmpfs", MS_NOSUID | MS_NODEV, plan.tmpfs_options) < 0) {
    Fail(kControlFd, kStageMountTmpfs);
  }
  SetMountAttributes("/", AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, kStageReadOnly);
  SetMountAttributes(plan.work_dir, 0, 0, MOUNT_ATTR_RDONLY, kStageWorkDirWritable);
}

// The program's files, written onto the tmpfs the host cannot see.
void PutTheProgramInTheWorkDir(const ChildPlan& plan) {
  if (!WriteFiles(plan.work_dir, plan.files, plan.file_count)) Fail(kControlFd, kStageWriteFiles);
}

// The next fork() is pid 1 of a new pid namespace: when it dies, the kernel
// kills everything left in the namespace (setsid() does not escape it).
void MakeTheRunsProcessesDieTogether() {
  if (unshare(CLONE_NEWPID) < 0) Fail(kControlFd, kStageUnsharePid);
}

[[noreturn]] void ProgramMain(const ChildPlan& plan);

pid_t StartTheProgram(const ChildPlan& plan) {
  const pid_t pid = fork();
  if (pid < 0) Fail(kControlFd, kStageForkInner);
  if (pid == 0) {
    close(kKillFd);
    ProgramMain(plan);
  }
  return pid;
}

// The supervisor keeps only the control and kill fds: the pipes must reach
// EOF when the program's side closes.
void LetThePipesCloseWithTheProgram() {
  for (int fd = 0; fd < kControlFd; ++fd) close(fd);
}

// Waits for the program to exit or for the parent to close the kill pipe,
// and then kills it. The supervisor has not reaped the program, so `pid`
// cannot name another process when it is killed here. Without pidfd
// (Linux < 5.3) the parent's process-group kill is all there is.
void KillTheProgramWhenTheParentLetsGo(pid_t pid) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return;
  pollfd waiting[2] = {{pidfd, POLLIN, 0}, {kKillFd, POLLIN, 0}};
  while (true) {
    if (poll(waiting, 2, -1) < 0) {
      if (errno == EINTR) continue;
      kill(pid, SIGKILL);
      break;
    }
    if (waiting[1].revents != 0) kill(pid, SIGKILL);
    if (waiting[0].revents != 0 || waiting[1].revents != 0) break;
  }
}

// Reaps the program and sends its wait status to the parent.
[[noreturn]] void ReportHowTheProgramEnded(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) _exit(126);
  }
  WriteRecord(kControlFd, {kRecordStatus, status, 0});
  _exit(0);
}

// ---------------------------------------------------------------------------
// The program's steps, in its own process (pid 1 of the new pid namespace
// when there is one), up to execve.

// A /proc of this pid namespace: the host's would list every process of the
// machine with its command line.
void SeeOnlyTheRunsProcesses() {
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0) {
    Fail(kControlFd, kStageMountProc);
  }
}

void StartInTheWorkDir(const ChildPlan& plan) {
  if (chdir(plan.work_dir) < 0) Fail(kControlFd, kStageChdir);
}

// CPU time, address space, file size, processes, open files; no core dumps.
void BoundEveryResource(const ChildPlan& plan) {
  for (const ChildPlan::Limit& limit : plan.limits) {
    const rlimit value{limit.soft, limit.hard};
    if (setrlimit(limit.resource, &value) < 0) Fail(kControlFd, kStageRlimit);
  }
}

// No supplementary groups; real, effective and saved ids all the run's.
void BecomeTheUnprivilegedUser(const ChildPlan& plan) {
  // Raw syscalls: glibc's wrappers would try to signal the parent's other
  // threads, which do not exist in this copy of the process.
  if (syscall(SYS_setgroups, 0, nullptr) < 0 ||
      syscall(SYS_setresgid, plan.gid, plan.gid, plan.gid) < 0 ||
      syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) < 0) {
    Fail(kControlFd, kStageDropPrivileges);
  }
}

// No setuid binary can give privileges back.
void NeverRegainPrivileges() {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) Fail(kControlFd, kStageNoNewPrivs);
}

// No Unix socket: the network namespace does not cover sockets bound to a
// path (a world-writable one under /tmp or /run would be reachable).
void NeverOpenAUnixSocket() {
  if (!DenyUnixSockets()) Fail(kControlFd, kStageSeccomp);
}

// The interpreter, with the argv and the clean environment the parent
// prepared: nothing of the verifier's (tokens, keys) is inherited.
[[noreturn]] void ExecWithACleanEnvironment(const ChildPlan& plan) {
  execve(plan.python, plan.argv, plan.envp);
  Fail(kControlFd, kStageExec);
}

[[noreturn]] void ProgramMain(const ChildPlan& plan) {
  const SandboxIsolation& isolation = plan.isolation;
  if (isolation.pid_namespace && isolation.mount_namespace) SeeOnlyTheRunsProcesses();
  StartInTheWorkDir(plan);
  BoundEveryResource(plan);
  if (isolation.drop_privileges) BecomeTheUnprivilegedUser(plan);
  NeverRegainPrivileges();
  if (isolation.unix_socket_filter) NeverOpenAUnixSocket();
  ExecWithACleanEnvironment(plan);
}

}  // namespace

const char* StageName(int32_t stage) {
  switch (stage) {
    case kStageFds:
      return "arranging fds";
    case kStageSetsid:
      return "setsid";
    case kStageUnshareNet:
      return "unshare(CLONE_NEWNET)";
    case kStageUnshareMount:
      return "unshare(CLONE_NEWNS)";
    case kStageMountPrivate:
      return "making mounts private";
    case kStageMountTmpfs:
      return "mounting the work dir tmpfs";
    case kStageReadOnly:
      return "making mounts read-only";
    case kStageWorkDirWritable:
      return "making the work dir writable";
    case kStageWriteFiles:
      return "writing the program files";
    case kStageUnsharePid:
      return "unshare(CLONE_NEWPID)";
    case kStageForkInner:
      return "fork";
    case kStageMountProc:
      return "mounting /proc";
    case kStageChdir:
      return "chdir to the work dir";
    case kStageRlimit:
      return "setrlimit";
    case kStageDropPrivileges:
      return "dropping privileges";
    case kStageNoNewPrivs:
      return "prctl(PR_SET_NO_NEW_PRIVS)";
    case kStageExec:
      return "execve";
    case kStageCgroup:
      return "joining the run's cgroup";
    case kStageSeccomp:
      return "installing the seccomp filter";
    default:
      return "unknown step";
  }
}

bool WriteFiles(const char* dir, const ChildFile* files, size_t count) {
  const int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return false;
  bool ok = true;
  for (size_t i = 0; i < count && ok; ++i) {
    const int fd =
        openat(dir_fd, files[i].name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    ok = fd >= 0 && WriteAll(fd, files[i].data, files[i].size);
    if (fd >= 0) close(fd);
  }
  close(dir_fd);
  return ok;
}

bool DenyUnixSockets() {
#if defined(__x86_64__) || defined(__aarch64__)
  const sock_fprog program = {sizeof(kUnixSocketFilter) / sizeof(kUnixSocketFilter[0]),
                              const_cast<sock_filter*>(kUnixSocketFilter)};
  return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) == 0;
#else
  errno = ENOSYS;
  return false;
#endif
}

[[noreturn]] void SupervisorMain(const ChildPlan& plan) {
  BecomeAProcessGroupOfItsOwn(plan);
  JoinTheRunsCgroups(plan);
  KeepOnlyTheRunsFds(plan);
  const SandboxIsolation& isolation = plan.isolation;
  if (isolation.network_namespace) CutOffTheNetwork();
  if (isolation.mount_namespace) MakeEverythingReadOnlyButTheWorkDir(plan);
  if (plan.write_files) PutTheProgramInTheWorkDir(plan);
  if (isolation.pid_namespace) MakeTheRunsProcessesDieTogether();
  const pid_t pid = StartTheProgram(plan);
  LetThePipesCloseWithTheProgram();
  KillTheProgramWhenTheParentLetsGo(pid);
  ReportHowTheProgramEnded(pid);
}

}  // namespace kappa::verifier::sandbox_internal
