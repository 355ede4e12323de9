#include "cli/child_run.h"

#include <signal.h>

#include <cstring>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cli/metrics_tail.h"
#include "cli/process_supervisor.h"
#include "cli/progress.h"
#include "cli/termination_signal.h"

namespace kappa::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(200);

}  // namespace

ChildRunOutcome RunChild(const ChildRunOptions& options) {
  ChildRunOutcome outcome;
  const Clock::time_point start = Clock::now();
  ProcessSupervisor supervisor;
  ProcessSpec spec;
  spec.name = "kappa run";
  spec.argv = options.argv;
  spec.log_file = options.log_file;
  absl::StatusOr<pid_t> pid = supervisor.Spawn(spec);
  if (!pid.ok()) {
    outcome.error = std::string(pid.status().message());
    return outcome;
  }

  MetricsTail metrics(options.metrics_path);
  RunProgress progress;
  progress.total_steps = options.total_steps;
  double last_progress = 0.0;
  while (true) {
    if (TerminationSignal() != 0) {
      // The child has its own process group, so a Ctrl-C on the terminal
      // reached only us; pass it on as SIGTERM and wait for its clean stop.
      supervisor.StopAll(options.stop_grace);
      outcome.interrupted = true;
      outcome.error = absl::StrCat("interrupted (", strsignal(TerminationSignal()), ")");
      break;
    }
    if (std::optional<ExitStatus> status = supervisor.WaitFor(*pid, kPollInterval)) {
      outcome.success = status->success();
      if (!outcome.success) outcome.error = absl::StrCat("kappa run ", status->ToString());
      break;
    }
    if (options.progress_interval_seconds <= 0) continue;
    for (const nlohmann::json& record : metrics.ReadNew()) progress.Update(record);
    const double elapsed = SecondsSince(start);
    if (progress.records > 0 && elapsed - last_progress >= options.progress_interval_seconds) {
      std::cerr << "  [" << options.label << "] " << FormatProgressLine(progress, elapsed, 0)
                << "\n"
                << std::flush;
      last_progress = elapsed;
    }
  }
  outcome.wall_seconds = SecondsSince(start);
  return outcome;
}

}  // namespace kappa::cli
