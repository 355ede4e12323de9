#include "cli/process_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace kappa::cli {
namespace {

// The parent's environment with `overrides` applied, as "KEY=VALUE" strings.
std::vector<std::string> MergedEnvironment(const std::vector<std::string>& overrides) {
  std::map<std::string, std::string> entries;
  std::vector<std::string> order;
  auto put = [&](const std::string& entry) {
    const std::string key = entry.substr(0, entry.find('='));
    if (entries.find(key) == entries.end()) order.push_back(key);
    entries[key] = entry;
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) put(*e);
  for (const std::string& entry : overrides) put(entry);
  std::vector<std::string> merged;
  merged.reserve(order.size());
  for (const std::string& key : order) merged.push_back(entries[key]);
  return merged;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Everything after fork() in the child must be async-signal-safe (the parent
// may have other threads holding malloc's locks), hence raw syscalls only.
[[noreturn]] void ExecChild(const char* path, char* const* argv, char* const* envp, int log_fd,
                            int error_fd, bool terminate_with_parent, pid_t parent) {
  if (terminate_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    // The parent may have died between fork() and prctl().
    if (getppid() != parent) _exit(127);
  }
  setpgid(0, 0);
  // The supervisor may block or ignore signals; the child starts clean.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  if (log_fd >= 0) {
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
  }
  execve(path, argv, envp);
  int err = errno;
  ssize_t ignored = write(error_fd, &err, sizeof(err));
  (void)ignored;
  _exit(127);
}

ExitStatus FromWaitStatus(int wstatus) {
  ExitStatus status;
  if (WIFEXITED(wstatus)) {
    status.exit_code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    status.signal = WTERMSIG(wstatus);
  }
  return status;
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (signal != 0) {
    return absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")");
  }
  return absl::StrCat("exited with status ", exit_code);
}

ProcessSupervisor::~ProcessSupervisor() {
  SignalAll(SIGKILL);
  while (!children_.empty()) {
    ReapExited();
    if (!children_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

absl::StatusOr<pid_t> ProcessSupervisor::Spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("process '", spec.name, "': empty argv"));
  }
  int log_fd = -1;
  if (!spec.log_file.empty()) {
    log_fd = open(spec.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat("process '", spec.name,
                                                        "': cannot open log file ", spec.log_file,
                                                        ": ", strerror(errno)));
    }
  }
  // The write end closes on a successful exec, so EOF on the read end means
  // the child is running the new program; an errno arriving means it is not.
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    if (log_fd >= 0) close(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // Prepared before fork(): the child may not allocate.
  std::vector<std::string> argv_strings = spec.argv;
  std::vector<std::string> env_strings = MergedEnvironment(spec.env);
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<char*> envp = CStrings(env_strings);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(error_pipe[0]);
    close(error_pipe[1]);
    if (log_fd >= 0) close(log_fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("process '", spec.name, "': fork: ", strerror(err)));
  }
  if (pid == 0) {
    ExecChild(argv[0], argv.data(), envp.data(), log_fd, error_pipe[1],
              spec.terminate_with_parent, parent);
  }
  // Also set the group from the parent, so a signal sent right after Spawn()
  // returns reaches the group whichever of the two setpgid calls ran first.
  setpgid(pid, pid);
  close(error_pipe[1]);
  if (log_fd >= 0) close(log_fd);

  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(error_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (n > 0) {
    int wstatus;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    return absl::FailedPreconditionError(absl::StrCat("process '", spec.name,
                                                      "': cannot execute ", spec.argv[0], ": ",
                                                      strerror(exec_errno)));
  }
  children_.push_back({spec.name, pid});
  return pid;
}

void ProcessSupervisor::ReapExited() {
  for (auto it = children_.begin(); it != children_.end();) {
    int wstatus = 0;
    const pid_t r = waitpid(it->pid, &wstatus, WNOHANG);
    if (r == it->pid) {
      pending_.push_back({it->name, it->pid, FromWaitStatus(wstatus)});
      it = children_.erase(it);
    } else if (r < 0 && errno == ECHILD) {
      // Reaped behind our back (someone else called wait()); nothing to report
      // beyond "gone".
      pending_.push_back({it->name, it->pid, ExitStatus{}});
      it = children_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<ExitEvent> ProcessSupervisor::Poll() {
  ReapExited();
  std::vector<ExitEvent> out;
  out.swap(pending_);
  return out;
}

void ProcessSupervisor::Signal(pid_t pid, int sig) {
  for (const Child& child : children_) {
    if (child.pid == pid) {
      // The group is only addressed while its leader is unreaped, so the
      // group id cannot have been recycled.
      if (kill(-pid, sig) != 0) kill(pid, sig);
      return;
    }
  }
}

void ProcessSupervisor::SignalAll(int sig) {
  for (const Child& child : children_) Signal(child.pid, sig);
}

std::vector<ExitEvent> ProcessSupervisor::StopAll(std::chrono::milliseconds grace) {
  SignalAll(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (true) {
    ReapExited();
    if (children_.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  SignalAll(SIGKILL);
  while (!children_.empty()) {
    ReapExited();
    if (!children_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Poll();
}

std::optional<ExitStatus> ProcessSupervisor::WaitFor(pid_t pid,
                                                     std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    ReapExited();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->pid == pid) {
        ExitStatus status = it->status;
        pending_.erase(it);
        return status;
      }
    }
    if (!IsRunning(pid) || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool ProcessSupervisor::IsRunning(pid_t pid) const {
  for (const Child& child : children_) {
    if (child.pid == pid) return true;
  }
  return false;
}

std::vector<std::string> ProcessSupervisor::RunningNames() const {
  std::vector<std::string> names;
  for (const Child& child : children_) names.push_back(child.name);
  return names;
}

}  // namespace kappa::cli
