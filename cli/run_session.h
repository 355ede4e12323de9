// The supervised part of `kappa run`: start teacher, verifier and learner,
// wait until each has reported where it listens (services/ready_file.h) and
// answers health checks, start the rollout workers with those addresses,
// follow metrics.jsonl until the learner finishes, then stop everything.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "cli/progress.h"
#include "cli/service_launch.h"
#include "services/transport_security.h"

namespace kappa::cli {

struct SessionOptions {
  std::string run_dir;  // prometheus.yml is written there once every process reported
  services::TransportSecurity security;  // for the health checks
  int64_t total_steps = 0;
  bool show_progress = true;
  std::chrono::seconds health_timeout{300};  // for the ready files, then for health
  std::chrono::milliseconds stop_grace{5000};
};

struct SessionOutcome {
  // 0: the learner finished; 1: a process failed (reported on stderr);
  // 130: interrupted by a signal.
  int exit_code = 1;
  RunProgress progress;
  double wall_seconds = 0.0;
  int restarts = 0;  // teacher/verifier/worker processes restarted after dying
};

SessionOutcome RunSession(const LaunchPlan& plan, const SessionOptions& options);

// The last `max_lines` lines of a log file, each prefixed with "  | ".
std::string LogTail(const std::string& path, int max_lines = 20);

}  // namespace kappa::cli
