#include "verifier/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace kappa::verifier {
namespace {

// ---------------------------------------------------------------------------
// Child side. Everything between fork() and execve() runs in a copy of a
// multi-threaded process, so it may only make async-signal-safe calls: raw
// syscalls and plain memory reads of data the parent prepared. No malloc, no
// locks, no logging; failures travel to the parent as fixed-size records.

// The fds the program runs with (0..3); kControlFd is close-on-exec, so it
// closes when execve succeeds and stays with the supervisor, which reports on
// it. kKillFd is the supervisor's only: when the parent closes its end (on
// timeout, or by dying), the supervisor kills the program.
constexpr int kControlFd = 4;
constexpr int kKillFd = 5;

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
};

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
    default:
      return "unknown step";
  }
}

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
};

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

// Async-signal-safe (openat/write/close only): used by the supervisor on the
// fresh tmpfs, and by the parent when there is no mount namespace.
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

// Puts devnull/stdout/stderr/completion on 0..3, the control pipe on 4 and
// the kill pipe on 5 (both close-on-exec); closes every other fd, so nothing
// the verifier had open (listening sockets, other runs' pipes, files) reaches
// the program.
void ArrangeFds(const ChildPlan& plan) {
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

// The program's own process: pid 1 of the new pid namespace when there is one.
[[noreturn]] void InnerMain(const ChildPlan& plan) {
  if (plan.isolation.pid_namespace && plan.isolation.mount_namespace) {
    // A /proc of this pid namespace: the host's would list every process of
    // the machine with its command line.
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0) {
      Fail(kControlFd, kStageMountProc);
    }
  }
  if (chdir(plan.work_dir) < 0) Fail(kControlFd, kStageChdir);
  for (const ChildPlan::Limit& limit : plan.limits) {
    const rlimit value{limit.soft, limit.hard};
    if (setrlimit(limit.resource, &value) < 0) Fail(kControlFd, kStageRlimit);
  }
  if (plan.isolation.drop_privileges) {
    // Raw syscalls: glibc's wrappers would try to signal the parent's other
    // threads, which do not exist in this copy of the process.
    if (syscall(SYS_setgroups, 0, nullptr) < 0 ||
        syscall(SYS_setresgid, plan.gid, plan.gid, plan.gid) < 0 ||
        syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) < 0) {
      Fail(kControlFd, kStageDropPrivileges);
    }
  }
  // No setuid binary can give privileges back.
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) Fail(kControlFd, kStageNoNewPrivs);
  execve(plan.python, plan.argv, plan.envp);
  Fail(kControlFd, kStageExec);
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

// The supervisor: sets up the namespaces (which need root), forks the program,
// reports its pid and wait status on the control fd, exits.
[[noreturn]] void SupervisorMain(const ChildPlan& plan) {
  // A process group of its own: the parent's timeout kills the whole group.
  if (setsid() < 0) Fail(plan.control_w, kStageSetsid);
  ArrangeFds(plan);
  const SandboxIsolation& isolation = plan.isolation;
  if (isolation.network_namespace && unshare(CLONE_NEWNET) < 0) {
    Fail(kControlFd, kStageUnshareNet);
  }
  if (isolation.mount_namespace) {
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
  if (plan.write_files && !WriteFiles(plan.work_dir, plan.files, plan.file_count)) {
    Fail(kControlFd, kStageWriteFiles);
  }
  if (isolation.pid_namespace && unshare(CLONE_NEWPID) < 0) Fail(kControlFd, kStageUnsharePid);
  const pid_t pid = fork();
  if (pid < 0) Fail(kControlFd, kStageForkInner);
  if (pid == 0) {
    close(kKillFd);
    InnerMain(plan);
  }
  // The supervisor keeps only the control and kill fds: the pipes must reach
  // EOF when the program's side closes.
  for (int fd = 0; fd < kControlFd; ++fd) close(fd);
  // Wait for the program to exit or for the parent to close the kill pipe.
  // The supervisor has not reaped the program, so `pid` cannot name another
  // process when it is killed here. Without pidfd (Linux < 5.3) the parent's
  // process-group kill is all there is.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
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
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) _exit(126);
  }
  WriteRecord(kControlFd, {kRecordStatus, status, 0});
  _exit(0);
}

// ---------------------------------------------------------------------------
// Parent side.

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

absl::Status MakePipe(UniqueFd* read_end, UniqueFd* write_end) {
  // Close-on-exec everywhere: another run forked by another thread must not
  // inherit (and hold open) this run's pipes.
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) return absl::ErrnoToStatus(errno, "pipe2");
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
  if (fcntl(fds[0], F_SETFL, O_NONBLOCK) < 0) return absl::ErrnoToStatus(errno, "fcntl");
  return absl::OkStatus();
}

// Keeps the last `limit` bytes of a stream.
void AppendTail(std::string* tail, const char* data, size_t size, size_t limit) {
  tail->append(data, size);
  if (tail->size() > 2 * limit + 4096) tail->erase(0, tail->size() - limit);
}

// Reads what is available; false at EOF (or a read error).
bool Drain(int fd, std::string* sink, size_t limit) {
  char buffer[8192];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      AppendTail(sink, buffer, static_cast<size_t>(n), limit);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    return false;
  }
}

std::string WorkRoot(const SandboxOptions& options) {
  if (!options.work_root.empty()) return options.work_root;
  const char* tmpdir = std::getenv("TMPDIR");
  return tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
}

void RemoveWorkDir(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

bool ValidFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

void Classify(SandboxResult* result) {
  using Outcome = SandboxResult::Outcome;
  if (!result->error.empty()) {
    result->outcome = Outcome::kError;
  } else if (result->timed_out) {
    result->outcome = Outcome::kTimeout;
  } else if (result->signal != 0) {
    result->outcome = Outcome::kKilled;
  } else if (result->exit_code == 0 && result->completed) {
    result->outcome = Outcome::kPass;
  } else {
    result->outcome = Outcome::kFail;
  }
}

// A throwaway child that tries `attempt` and exits 0 on success.
template <typename Attempt>
bool ChildSucceeds(Attempt attempt) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) _exit(attempt() ? 0 : 1);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

std::string SandboxIsolation::ToString() const {
  auto yes_no = [](bool value) { return value ? "yes" : "NO"; };
  return absl::StrCat("network namespace: ", yes_no(network_namespace),
                      ", read-only mounts: ", yes_no(mount_namespace),
                      ", pid namespace: ", yes_no(pid_namespace),
                      ", unprivileged uid: ", yes_no(drop_privileges));
}

SandboxIsolation ProbeSandboxIsolation() {
  SandboxIsolation isolation;
  if (geteuid() != 0) return isolation;
  isolation.network_namespace = ChildSucceeds([] { return unshare(CLONE_NEWNET) == 0; });
  isolation.mount_namespace = ChildSucceeds([] {
    if (unshare(CLONE_NEWNS) < 0) return false;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) return false;
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
    return syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &attr, sizeof(attr)) == 0;
  });
  isolation.pid_namespace = ChildSucceeds([] {
    if (unshare(CLONE_NEWPID) < 0) return false;
    const pid_t pid = fork();
    if (pid == 0) _exit(0);
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid;
  });
  isolation.drop_privileges = ChildSucceeds([] {
    return syscall(SYS_setgroups, 0, nullptr) == 0 &&
           syscall(SYS_setresgid, 65534, 65534, 65534) == 0 &&
           syscall(SYS_setresuid, 65534, 65534, 65534) == 0;
  });
  return isolation;
}

const char* OutcomeName(SandboxResult::Outcome outcome) {
  switch (outcome) {
    case SandboxResult::Outcome::kPass:
      return "pass";
    case SandboxResult::Outcome::kFail:
      return "fail";
    case SandboxResult::Outcome::kTimeout:
      return "timeout";
    case SandboxResult::Outcome::kKilled:
      return "killed";
    case SandboxResult::Outcome::kError:
      return "error";
  }
  return "error";
}

std::string SandboxResult::Summary() const {
  std::string line = absl::StrCat(OutcomeName(outcome), " after ", seconds, " s");
  if (!error.empty()) absl::StrAppend(&line, ": ", error);
  if (timed_out) absl::StrAppend(&line, " (wall-clock timeout)");
  if (signal != 0) absl::StrAppend(&line, " (signal ", signal, ", ", strsignal(signal), ")");
  if (exit_code >= 0)
    absl::StrAppend(&line, " (exit ", exit_code, completed ? "" : ", tests did not finish", ")");
  return line;
}

absl::StatusOr<SandboxResult> RunSandboxed(
    const std::vector<std::pair<std::string, std::string>>& files, const std::string& entry,
    const SandboxOptions& options, const SandboxIsolation& isolation) {
  for (const auto& [name, contents] : files) {
    if (!ValidFileName(name))
      return absl::InvalidArgumentError(absl::StrCat("bad file name '", name, "'"));
  }
  if (!ValidFileName(entry))
    return absl::InvalidArgumentError(absl::StrCat("bad entry '", entry, "'"));

  SandboxResult result;
  const absl::Time start = absl::Now();
  auto finish = [&]() {
    result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    Classify(&result);
    return result;
  };

  std::string work_dir = WorkRoot(options) + "/kappa-sandbox-XXXXXX";
  if (mkdtemp(work_dir.data()) == nullptr) {
    result.error = absl::StrCat("mkdtemp in ", WorkRoot(options), ": ", std::strerror(errno));
    return finish();
  }
  struct Cleanup {
    std::string path;
    ~Cleanup() { RemoveWorkDir(path); }
  } cleanup{work_dir};
  if (isolation.drop_privileges && chown(work_dir.c_str(), options.uid, options.gid) < 0) {
    result.error = absl::StrCat("chown ", work_dir, ": ", std::strerror(errno));
    return finish();
  }

  // Everything the children touch is built now: after fork() they cannot allocate.
  std::vector<ChildFile> child_files;
  for (const auto& [name, contents] : files) {
    child_files.push_back({name.c_str(), contents.data(), contents.size()});
  }
  if (!isolation.mount_namespace &&
      !WriteFiles(work_dir.c_str(), child_files.data(), child_files.size())) {
    result.error = absl::StrCat("writing the program into ", work_dir, ": ", std::strerror(errno));
    return finish();
  }
  const std::string tmpfs_options =
      absl::StrCat("size=", std::max<int64_t>(options.file_size_bytes, 1 << 20) * 4,
                   ",nr_inodes=4096,mode=0700,uid=", isolation.drop_privileges ? options.uid : 0,
                   ",gid=", isolation.drop_privileges ? options.gid : 0);
  std::vector<std::string> args = {"python3", "-I", "-S", "-B", entry};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // A clean environment: nothing of the verifier's (tokens, keys) is inherited.
  std::string env_path = "PATH=/usr/bin:/bin", env_lang = "LANG=C.UTF-8";
  char* envp[] = {env_path.data(), env_lang.data(), nullptr};

  UniqueFd devnull(open("/dev/null", O_RDONLY | O_CLOEXEC));
  UniqueFd stdout_r, stdout_w, stderr_r, stderr_w, completion_r, completion_w, control_r, control_w,
      kill_r, kill_w;
  for (auto [r, w] : {std::pair{&stdout_r, &stdout_w},
                      {&stderr_r, &stderr_w},
                      {&completion_r, &completion_w},
                      {&control_r, &control_w},
                      {&kill_r, &kill_w}}) {
    if (absl::Status status = MakePipe(r, w); !status.ok()) {
      result.error = std::string(status.message());
      return finish();
    }
  }
  if (devnull.get() < 0) {
    result.error = absl::StrCat("open /dev/null: ", std::strerror(errno));
    return finish();
  }

  ChildPlan plan;
  plan.devnull = devnull.get();
  plan.stdout_w = stdout_w.get();
  plan.stderr_w = stderr_w.get();
  plan.completion_w = completion_w.get();
  plan.control_w = control_w.get();
  plan.kill_r = kill_r.get();
  plan.work_dir = work_dir.c_str();
  plan.tmpfs_options = tmpfs_options.c_str();
  plan.python = options.python.c_str();
  plan.argv = argv.data();
  plan.envp = envp;
  plan.files = child_files.data();
  plan.file_count = child_files.size();
  plan.write_files = isolation.mount_namespace;
  const rlim_t cpu = static_cast<rlim_t>(std::max(1, options.cpu_seconds));
  // soft == hard: the kernel SIGKILLs at the limit. (A SIGXCPU at a lower
  // soft limit would be ignored anyway by pid 1 of a pid namespace.)
  plan.limits[0] = {RLIMIT_CPU, cpu, cpu};
  plan.limits[1] = {RLIMIT_AS, static_cast<rlim_t>(options.address_space_bytes),
                    static_cast<rlim_t>(options.address_space_bytes)};
  plan.limits[2] = {RLIMIT_FSIZE, static_cast<rlim_t>(options.file_size_bytes),
                    static_cast<rlim_t>(options.file_size_bytes)};
  plan.limits[3] = {RLIMIT_NPROC, static_cast<rlim_t>(options.max_processes),
                    static_cast<rlim_t>(options.max_processes)};
  plan.limits[4] = {RLIMIT_NOFILE, static_cast<rlim_t>(options.max_open_files),
                    static_cast<rlim_t>(options.max_open_files)};
  plan.limits[5] = {RLIMIT_CORE, 0, 0};
  plan.uid = options.uid;
  plan.gid = options.gid;
  plan.isolation = isolation;

  const pid_t supervisor = fork();
  if (supervisor < 0) {
    result.error = absl::StrCat("fork: ", std::strerror(errno));
    return finish();
  }
  if (supervisor == 0) SupervisorMain(plan);

  for (UniqueFd* fd : {&devnull, &stdout_w, &stderr_w, &completion_w, &control_w, &kill_r}) {
    fd->reset();
  }

  const absl::Time deadline = start + options.wall_timeout;
  std::string control_bytes, completion_bytes;
  bool stdout_open = true, stderr_open = true, completion_open = true, control_open = true;
  // After the control pipe closes (the program has exited and been reaped),
  // what is left in the pipes is read for a short grace period only: without
  // a pid namespace an escaped descendant could hold them open forever.
  absl::Time drain_until = absl::InfiniteFuture();
  while (stdout_open || stderr_open || completion_open || control_open) {
    const absl::Time now = absl::Now();
    if (control_open && now >= deadline && !result.timed_out) {
      // The supervisor kills the program and reports; if it does not within
      // the grace below, the process-group kill after the loop ends it.
      result.timed_out = true;
      kill_w.reset();
      drain_until = now + absl::Seconds(2);
    }
    if (now >= drain_until) break;
    std::vector<pollfd> polled;
    std::vector<int> which;
    auto add = [&](bool open, const UniqueFd& fd, int id) {
      if (open) {
        polled.push_back({fd.get(), POLLIN, 0});
        which.push_back(id);
      }
    };
    add(stdout_open, stdout_r, 0);
    add(stderr_open, stderr_r, 1);
    add(completion_open, completion_r, 2);
    add(control_open, control_r, 3);
    const absl::Duration wait =
        (result.timed_out || !control_open ? drain_until : std::min(deadline, drain_until)) - now;
    const int wait_ms =
        static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(wait) + 1, 1, 1000));
    const int ready = poll(polled.data(), polled.size(), wait_ms);
    if (ready < 0 && errno != EINTR) {
      result.error = absl::StrCat("poll: ", std::strerror(errno));
      break;
    }
    for (size_t i = 0; ready > 0 && i < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      switch (which[i]) {
        case 0:
          stdout_open = Drain(stdout_r.get(), &result.stdout_tail, options.output_limit_bytes);
          break;
        case 1:
          stderr_open = Drain(stderr_r.get(), &result.stderr_tail, options.output_limit_bytes);
          break;
        case 2:
          completion_open = Drain(completion_r.get(), &completion_bytes, 64);
          break;
        case 3:
          control_open = Drain(control_r.get(), &control_bytes, 1 << 16);
          if (!control_open) {
            drain_until = std::min(drain_until, absl::Now() + absl::Milliseconds(200));
          }
          break;
      }
    }
  }

  int wait_status = -1;
  for (size_t at = 0; at + sizeof(Record) <= control_bytes.size(); at += sizeof(Record)) {
    Record record;
    std::memcpy(&record, control_bytes.data() + at, sizeof(record));
    if (record.kind == kRecordError) {
      result.error = absl::StrCat(StageName(record.a), ": ", std::strerror(record.b));
    } else if (record.kind == kRecordStatus) {
      wait_status = record.a;
    }
  }
  // The program is dead (reported, or killed through the kill pipe); as pid 1
  // of its namespace it took every descendant with it. Without a pid
  // namespace, what is left of its process group goes now (the supervisor is
  // not reaped yet, so the group id is still ours).
  kill_w.reset();
  kill(-supervisor, SIGKILL);
  int supervisor_status = 0;
  while (waitpid(supervisor, &supervisor_status, 0) < 0 && errno == EINTR) {
  }

  result.completed = !completion_bytes.empty();
  if (!result.timed_out && result.error.empty()) {
    if (wait_status == -1) {
      result.error = "the supervisor exited without reporting the program's status";
    } else if (WIFEXITED(wait_status)) {
      result.exit_code = WEXITSTATUS(wait_status);
    } else if (WIFSIGNALED(wait_status)) {
      result.signal = WTERMSIG(wait_status);
    }
  }
  for (std::string* tail : {&result.stdout_tail, &result.stderr_tail}) {
    if (tail->size() > options.output_limit_bytes) {
      tail->erase(0, tail->size() - options.output_limit_bytes);
    }
  }
  return finish();
}

}  // namespace kappa::verifier
