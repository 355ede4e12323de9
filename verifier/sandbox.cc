#include "verifier/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "verifier/sandbox_cgroup.h"
#include "verifier/sandbox_child.h"

// The parent side: what the verifier's own process does for a run. The
// children's side (setup between fork() and execve(), async-signal-safe only)
// is in sandbox_child.cc.
namespace kappa::verifier {
namespace {

using sandbox_internal::ChildFile;
using sandbox_internal::ChildPlan;
using sandbox_internal::Record;
using sandbox_internal::RunCgroup;

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

// ---------------------------------------------------------------------------
// The steps of RunSandboxed, each named for what it guarantees. A setup step
// returns an error status whose message becomes SandboxResult::error.

// Every file lands inside the work dir: plain names only (no '/', '.', '..').
absl::Status RequirePlainFileNames(const std::vector<std::pair<std::string, std::string>>& files,
                                   const std::string& entry) {
  for (const auto& [name, contents] : files) {
    if (!ValidFileName(name))
      return absl::InvalidArgumentError(absl::StrCat("bad file name '", name, "'"));
  }
  if (!ValidFileName(entry))
    return absl::InvalidArgumentError(absl::StrCat("bad entry '", entry, "'"));
  return absl::OkStatus();
}

// The run's work directory: fresh and empty, owned by the run's uid when it
// drops privileges, and removed with everything the run left in it when this
// goes out of scope.
class WorkDir {
 public:
  WorkDir() = default;
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  ~WorkDir() {
    if (!path_.empty()) RemoveWorkDir(path_);
  }

  absl::Status Create(const SandboxOptions& options, const SandboxIsolation& isolation) {
    std::string path = WorkRoot(options) + "/kappa-sandbox-XXXXXX";
    if (mkdtemp(path.data()) == nullptr) {
      const int error = errno;
      return absl::InternalError(
          absl::StrCat("mkdtemp in ", WorkRoot(options), ": ", std::strerror(error)));
    }
    path_ = std::move(path);
    if (isolation.drop_privileges && chown(path_.c_str(), options.uid, options.gid) < 0) {
      return absl::InternalError(absl::StrCat("chown ", path_, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Everything the children read, built now: after fork() they cannot
// allocate. Pinned in place (no copy, no move): the ChildPlan points into it.
struct ProgramInputs {
  ProgramInputs(const std::vector<std::pair<std::string, std::string>>& program_files,
                const std::string& entry, const SandboxOptions& options,
                const SandboxIsolation& isolation)
      : args{"python3", "-I", "-S", "-B", entry} {
    for (const auto& [name, contents] : program_files) {
      files.push_back({name.c_str(), contents.data(), contents.size()});
    }
    tmpfs_options =
        absl::StrCat("size=", std::max<int64_t>(options.file_size_bytes, 1 << 20) * 4,
                     ",nr_inodes=4096,mode=0700,uid=", isolation.drop_privileges ? options.uid : 0,
                     ",gid=", isolation.drop_privileges ? options.gid : 0);
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
  }
  ProgramInputs(const ProgramInputs&) = delete;
  ProgramInputs& operator=(const ProgramInputs&) = delete;

  std::vector<ChildFile> files;
  std::string tmpfs_options;
  std::vector<std::string> args;
  std::vector<char*> argv;
  // A clean environment: nothing of the verifier's (tokens, keys) is inherited.
  std::string env_path = "PATH=/usr/bin:/bin", env_lang = "LANG=C.UTF-8";
  char* envp[3] = {env_path.data(), env_lang.data(), nullptr};
};

// Without a mount namespace the parent writes the program into the work dir
// (with one, the supervisor writes it onto the tmpfs it mounts there).
absl::Status WriteTheProgram(const std::string& work_dir, const ProgramInputs& inputs) {
  if (!sandbox_internal::WriteFiles(work_dir.c_str(), inputs.files.data(), inputs.files.size())) {
    return absl::InternalError(
        absl::StrCat("writing the program into ", work_dir, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The program's stdin (/dev/null) and its pipes: stdout, stderr, completion
// and the supervisor's control pipe (children write, the parent reads), and
// the kill pipe (the parent holds the write end). Every fd is close-on-exec.
struct RunPipes {
  absl::Status Open() {
    devnull.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
    const int devnull_errno = errno;
    for (auto [r, w] : {std::pair{&stdout_r, &stdout_w},
                        {&stderr_r, &stderr_w},
                        {&completion_r, &completion_w},
                        {&control_r, &control_w},
                        {&kill_r, &kill_w}}) {
      if (absl::Status status = MakePipe(r, w); !status.ok()) return status;
    }
    if (devnull.get() < 0) {
      return absl::InternalError(absl::StrCat("open /dev/null: ", std::strerror(devnull_errno)));
    }
    return absl::OkStatus();
  }

  // After fork(), the children's ends are theirs alone: each pipe reaches EOF
  // when the children's side closes.
  void CloseTheChildrensEnds() {
    for (UniqueFd* fd : {&devnull, &stdout_w, &stderr_w, &completion_w, &control_w, &kill_r}) {
      fd->reset();
    }
  }

  UniqueFd devnull;
  UniqueFd stdout_r, stdout_w, stderr_r, stderr_w, completion_r, completion_w, control_r, control_w,
      kill_r, kill_w;
};

// The program's rlimits. CPU: soft == hard, so the kernel SIGKILLs at the
// limit (a SIGXCPU at a lower soft limit would be ignored anyway by pid 1 of a
// pid namespace). No core dumps.
void BoundTheProgramsResources(const SandboxOptions& options, ChildPlan* plan) {
  const rlim_t cpu = static_cast<rlim_t>(std::max(1, options.cpu_seconds));
  plan->limits[0] = {RLIMIT_CPU, cpu, cpu};
  plan->limits[1] = {RLIMIT_AS, static_cast<rlim_t>(options.address_space_bytes),
                     static_cast<rlim_t>(options.address_space_bytes)};
  plan->limits[2] = {RLIMIT_FSIZE, static_cast<rlim_t>(options.file_size_bytes),
                     static_cast<rlim_t>(options.file_size_bytes)};
  plan->limits[3] = {RLIMIT_NPROC, static_cast<rlim_t>(options.max_processes),
                     static_cast<rlim_t>(options.max_processes)};
  plan->limits[4] = {RLIMIT_NOFILE, static_cast<rlim_t>(options.max_open_files),
                     static_cast<rlim_t>(options.max_open_files)};
  plan->limits[5] = {RLIMIT_CORE, 0, 0};
}

ChildPlan MakeChildPlan(const RunPipes& pipes, const std::string& work_dir,
                        const ProgramInputs& inputs, const SandboxOptions& options,
                        const SandboxIsolation& isolation) {
  ChildPlan plan;
  plan.devnull = pipes.devnull.get();
  plan.stdout_w = pipes.stdout_w.get();
  plan.stderr_w = pipes.stderr_w.get();
  plan.completion_w = pipes.completion_w.get();
  plan.control_w = pipes.control_w.get();
  plan.kill_r = pipes.kill_r.get();
  plan.work_dir = work_dir.c_str();
  plan.tmpfs_options = inputs.tmpfs_options.c_str();
  plan.python = options.python.c_str();
  plan.argv = inputs.argv.data();
  plan.envp = inputs.envp;
  plan.files = inputs.files.data();
  plan.file_count = inputs.files.size();
  plan.write_files = isolation.mount_namespace;
  BoundTheProgramsResources(options, &plan);
  plan.uid = options.uid;
  plan.gid = options.gid;
  plan.isolation = isolation;
  return plan;
}

// The supervisor isolates the program and reports on it (sandbox_child.h).
absl::Status ForkTheSupervisor(const ChildPlan& plan, pid_t* supervisor) {
  *supervisor = fork();
  if (*supervisor < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (*supervisor == 0) sandbox_internal::SupervisorMain(plan);
  return absl::OkStatus();
}

// What came back from a run besides its output tails.
struct RunReports {
  std::string control;     // the supervisor's Records
  std::string completion;  // non-empty: the program reported completion
};

// Reads the program's output and the supervisor's reports until every pipe
// is closed, with no run outliving its wall-clock deadline: at the deadline
// the kill pipe closes (the supervisor kills the program) and what is left is
// read for 2 s at most. After the control pipe closes (the program has exited
// and been reaped), what is left in the pipes is read for a short grace
// period only: without a pid namespace an escaped descendant could hold them
// open forever.
RunReports CollectUntilExitOrDeadline(RunPipes* pipes, absl::Time deadline, size_t output_limit,
                                      SandboxResult* result) {
  RunReports reports;
  bool stdout_open = true, stderr_open = true, completion_open = true, control_open = true;
  absl::Time drain_until = absl::InfiniteFuture();
  while (stdout_open || stderr_open || completion_open || control_open) {
    const absl::Time now = absl::Now();
    if (control_open && now >= deadline && !result->timed_out) {
      // The supervisor kills the program and reports; if it does not within
      // the grace below, the process-group kill after the loop ends it.
      result->timed_out = true;
      pipes->kill_w.reset();
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
    add(stdout_open, pipes->stdout_r, 0);
    add(stderr_open, pipes->stderr_r, 1);
    add(completion_open, pipes->completion_r, 2);
    add(control_open, pipes->control_r, 3);
    const absl::Duration wait =
        (result->timed_out || !control_open ? drain_until : std::min(deadline, drain_until)) - now;
    const int wait_ms =
        static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(wait) + 1, 1, 1000));
    const int ready = poll(polled.data(), polled.size(), wait_ms);
    if (ready < 0 && errno != EINTR) {
      result->error = absl::StrCat("poll: ", std::strerror(errno));
      break;
    }
    for (size_t i = 0; ready > 0 && i < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      switch (which[i]) {
        case 0:
          stdout_open = Drain(pipes->stdout_r.get(), &result->stdout_tail, output_limit);
          break;
        case 1:
          stderr_open = Drain(pipes->stderr_r.get(), &result->stderr_tail, output_limit);
          break;
        case 2:
          completion_open = Drain(pipes->completion_r.get(), &reports.completion, 64);
          break;
        case 3:
          control_open = Drain(pipes->control_r.get(), &reports.control, 1 << 16);
          if (!control_open) {
            drain_until = std::min(drain_until, absl::Now() + absl::Milliseconds(200));
          }
          break;
      }
    }
  }
  return reports;
}

// A failed setup step in the children becomes result->error. Returns the
// program's wait status, or -1 when none was reported.
int ReadSupervisorRecords(const std::string& control, SandboxResult* result) {
  int wait_status = -1;
  for (size_t at = 0; at + sizeof(Record) <= control.size(); at += sizeof(Record)) {
    Record record;
    std::memcpy(&record, control.data() + at, sizeof(record));
    if (record.kind == sandbox_internal::kRecordError) {
      result->error =
          absl::StrCat(sandbox_internal::StageName(record.a), ": ", std::strerror(record.b));
    } else if (record.kind == sandbox_internal::kRecordStatus) {
      wait_status = record.a;
    }
  }
  return wait_status;
}

// Nothing of the run outlives it. The program is dead (reported, or killed
// through the kill pipe); as pid 1 of its namespace it took every descendant
// with it. Without a pid namespace, what is left of its process group goes
// now (the supervisor is not reaped yet, so the group id is still ours).
void KillWhatIsLeftAndReap(pid_t supervisor, UniqueFd* kill_w) {
  kill_w->reset();
  kill(-supervisor, SIGKILL);
  int supervisor_status = 0;
  while (waitpid(supervisor, &supervisor_status, 0) < 0 && errno == EINTR) {
  }
}

// The program's exit code or signal, whether it completed, and its output
// kept to the last output_limit bytes of each stream.
void RecordHowTheProgramEnded(int wait_status, const RunReports& reports, size_t output_limit,
                              SandboxResult* result) {
  result->completed = !reports.completion.empty();
  if (!result->timed_out && result->error.empty()) {
    if (wait_status == -1) {
      result->error = "the supervisor exited without reporting the program's status";
    } else if (WIFEXITED(wait_status)) {
      result->exit_code = WEXITSTATUS(wait_status);
    } else if (WIFSIGNALED(wait_status)) {
      result->signal = WTERMSIG(wait_status);
    }
  }
  for (std::string* tail : {&result->stdout_tail, &result->stderr_tail}) {
    if (tail->size() > output_limit) tail->erase(0, tail->size() - output_limit);
  }
}

SandboxResult Finished(absl::Time start, SandboxResult result) {
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Classify(&result);
  return result;
}

}  // namespace

std::string SandboxIsolation::ToString() const {
  auto yes_no = [](bool value) { return value ? "yes" : "NO"; };
  return absl::StrCat(
      "network namespace: ", yes_no(network_namespace),
      ", read-only mounts: ", yes_no(mount_namespace), ", pid namespace: ", yes_no(pid_namespace),
      ", unprivileged uid: ", yes_no(drop_privileges),
      ", no Unix sockets (seccomp): ", yes_no(unix_socket_filter), ", run cgroup: ",
      cgroups.version == 0
          ? absl::StrCat("NO (", cgroups.missing, ")")
          : absl::StrCat("v", cgroups.version, cgroups.pids.empty() ? ", memory only" : ""));
}

SandboxIsolation ProbeSandboxIsolation() {
  SandboxIsolation isolation;
  // The filter needs no privilege (PR_SET_NO_NEW_PRIVS suffices).
  isolation.unix_socket_filter = ChildSucceeds([] {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || !sandbox_internal::DenyUnixSockets()) {
      return false;
    }
    return socket(AF_UNIX, SOCK_STREAM, 0) < 0 && errno == EPERM;
  });
  isolation.cgroups = sandbox_internal::ProbeRunCgroups();
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
  if (oom_killed) absl::StrAppend(&line, " (the run's memory limit killed a process)");
  if (exit_code >= 0)
    absl::StrAppend(&line, " (exit ", exit_code, completed ? "" : ", tests did not finish", ")");
  return line;
}

absl::StatusOr<SandboxResult> RunSandboxed(
    const std::vector<std::pair<std::string, std::string>>& files, const std::string& entry,
    const SandboxOptions& options, const SandboxIsolation& isolation) {
  if (absl::Status names = RequirePlainFileNames(files, entry); !names.ok()) return names;
  const absl::Time start = absl::Now();
  SandboxResult result;
  WorkDir work_dir;  // removed on return, with whatever the run wrote
  RunCgroup cgroup;  // emptied and removed on return, after the supervisor is reaped
  const ProgramInputs inputs(files, entry, options, isolation);
  RunPipes pipes;
  pid_t supervisor = -1;
  // Setup. A failure is the sandbox's, not the code's (kError). The children
  // add the isolation (SupervisorMain in sandbox_child.cc): namespaces,
  // mounts, fds, limits, identity, exec.
  absl::Status setup = work_dir.Create(options, isolation);
  if (setup.ok() && isolation.cgroups.version != 0) {
    setup = cgroup.Create(isolation.cgroups, options.run_memory_bytes, options.max_processes);
  }
  if (setup.ok() && !isolation.mount_namespace) setup = WriteTheProgram(work_dir.path(), inputs);
  if (setup.ok()) setup = pipes.Open();
  if (setup.ok()) {
    ChildPlan plan = MakeChildPlan(pipes, work_dir.path(), inputs, options, isolation);
    plan.cgroup_procs[0] = cgroup.memory_procs();
    plan.cgroup_procs[1] = cgroup.pids_procs();
    setup = ForkTheSupervisor(plan, &supervisor);
  }
  if (!setup.ok()) {
    result.error = std::string(setup.message());
    return Finished(start, std::move(result));
  }
  // Supervision: output until exit or the deadline, then nothing left behind.
  pipes.CloseTheChildrensEnds();
  const RunReports reports = CollectUntilExitOrDeadline(&pipes, start + options.wall_timeout,
                                                        options.output_limit_bytes, &result);
  const int wait_status = ReadSupervisorRecords(reports.control, &result);
  KillWhatIsLeftAndReap(supervisor, &pipes.kill_w);
  RecordHowTheProgramEnded(wait_status, reports, options.output_limit_bytes, &result);
  result.oom_killed = cgroup.OomKilled();
  return Finished(start, std::move(result));
}

}  // namespace kappa::verifier
