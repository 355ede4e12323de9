// Starts and stops a set of child processes for `kappa run`: each child gets
// its own process group (so a signal reaches everything it started) and its
// stdout+stderr redirected to a log file. Children are polled, never waited
// on blindly, so the caller's loop stays responsive to its own signals.
//
// Not thread-safe; use from one thread (the one that forks, since children
// are tied to it with PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kappa::cli {

struct ProcessSpec {
  std::string name;               // for messages: "learner", "rollout-0"
  std::vector<std::string> argv;  // argv[0] is the executable's path
  // "KEY=VALUE" entries set on top of the parent's environment.
  std::vector<std::string> env;
  // stdout and stderr go here (created, appended to); empty: inherited.
  std::string log_file;
  // If the supervisor's process dies (even by SIGKILL), the kernel sends the
  // child SIGTERM, so a crashed `kappa run` leaves no orphaned services.
  bool terminate_with_parent = true;
};

struct ExitStatus {
  int exit_code = -1;  // valid when signal == 0
  int signal = 0;      // the signal that killed it, 0 if it exited
  bool success() const { return signal == 0 && exit_code == 0; }
  std::string ToString() const;  // "exited with status 3" / "killed by signal 9 (Killed)"
};

struct ExitEvent {
  std::string name;
  pid_t pid = 0;
  ExitStatus status;
};

class ProcessSupervisor {
 public:
  ProcessSupervisor() = default;
  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;
  // Whatever is still running is killed (SIGKILL) and reaped.
  ~ProcessSupervisor();

  // Forks and executes spec.argv[0]. Fails (and leaves nothing running) when
  // the log file cannot be opened or the executable cannot be executed; the
  // message names the process and the cause.
  absl::StatusOr<pid_t> Spawn(const ProcessSpec& spec);

  // Reaps every child that has exited since the last call; never blocks.
  std::vector<ExitEvent> Poll();

  // Sends `sig` to the process group of every child still running.
  void SignalAll(int sig);
  void Signal(pid_t pid, int sig);

  // SIGTERM to every running child, up to `grace` for them to exit, then
  // SIGKILL to the rest; returns once all are reaped, with their exits (in
  // the order they were reaped).
  std::vector<ExitEvent> StopAll(std::chrono::milliseconds grace);

  // Waits up to `timeout` for `pid` to exit (reaping any others that exit
  // meanwhile; they are returned by the next Poll()). nullopt on timeout.
  std::optional<ExitStatus> WaitFor(pid_t pid, std::chrono::milliseconds timeout);

  bool IsRunning(pid_t pid) const;
  size_t running_count() const { return children_.size(); }
  std::vector<std::string> RunningNames() const;

 private:
  struct Child {
    std::string name;
    pid_t pid;
  };
  // Non-blocking reap of every exited child into pending_.
  void ReapExited();

  std::vector<Child> children_;     // running, in spawn order
  std::vector<ExitEvent> pending_;  // reaped, not yet returned by Poll()
};

}  // namespace kappa::cli
