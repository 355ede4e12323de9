// One `kappa run` of `kappa experiment`, as a child process: started through
// the ProcessSupervisor (own process group, output to a log file, SIGTERM if
// the experiment dies), followed through its metrics.jsonl for an occasional
// progress line, and stopped cleanly on Ctrl-C / SIGTERM.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kappa::cli {

struct ChildRunOptions {
  std::vector<std::string> argv;  // argv[0]: the kappa binary
  std::string log_file;           // the child's stdout and stderr
  std::string metrics_path;       // <runs_dir>/<name>/metrics.jsonl, for progress
  std::string label;              // progress prefix, e.g. "3/30 naive s2"
  int64_t total_steps = 0;
  double progress_interval_seconds = 30.0;  // <= 0: no progress lines
  // `kappa run` itself gives its services 5 s after SIGTERM; allow for that.
  std::chrono::milliseconds stop_grace{15000};
};

struct ChildRunOutcome {
  bool success = false;
  bool interrupted = false;  // a termination signal arrived; the child was stopped
  std::string error;         // why it did not succeed
  double wall_seconds = 0.0;
};

// Blocks until the child exits or a termination signal (see
// termination_signal.h; install the handlers first) arrives.
ChildRunOutcome RunChild(const ChildRunOptions& options);

}  // namespace kappa::cli
