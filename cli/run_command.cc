#include "cli/run_command.h"

#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "cli/args.h"
#include "cli/bootstrap.h"
#include "cli/plan_command.h"
#include "cli/progress.h"
#include "cli/report_run.h"
#include "cli/run_dir.h"
#include "cli/run_session.h"
#include "cli/service_launch.h"
#include "cli/termination_signal.h"
#include "dist/shm_segment.h"
#include "learner/data_parallel_setup.h"
#include "learner/step_config.h"
#include "services/config.h"
#include "services/server.h"
#include "services/torch_runtime.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: kappa run CONFIG [key=value ...] [--resume] [--no-progress] [--ignore-plan]\n";

// Everything that can be checked before minutes of bootstrap SFT are spent.
// Last, the memory plan (cli/memory_plan.h), unless `check_plan` is false.
absl::Status Preflight(const services::Config& config, bool check_plan) {
  if (config.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("workers must be >= 1 (got %d)", config.workers));
  }
  // The learner would refuse these too, but only after the bootstrap and
  // every process had started.
  if (absl::Status status = learner::ValidateStepConfig(config); !status.ok()) return status;
  if (absl::Status status = learner::CheckWorldSize(config, config.learner.world_size);
      !status.ok()) {
    return status;
  }
  for (const char* binary :
       {kTeacherBinary, kVerifierBinary, kLearnerBinary, kRolloutWorkerBinary}) {
    absl::StatusOr<std::string> path = FindServiceBinary(binary);
    if (!path.ok()) return path.status();
  }
  if (check_plan) {
    if (absl::Status status = CheckRunPlan(config); !status.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the memory plan does not fit: ", status.message(),
          " (`kappa plan` with the same arguments shows every term; --ignore-plan starts the "
          "run anyway)"));
    }
  }
  return absl::OkStatus();
}

std::string AccuracyAt(const std::optional<double>& accuracy, const std::optional<int64_t>& step) {
  if (!accuracy) return "-";
  return absl::StrFormat("%.3f (step %d)", *accuracy, step.value_or(0));
}

void PrintSummary(const services::Config& config, const std::string& run_dir,
                  const SessionOutcome& outcome) {
  const RunProgress& p = outcome.progress;
  std::cout << absl::StrFormat("\nrun '%s' %s: %d/%d steps in %s\n", config.name,
                               outcome.exit_code == 0 ? "finished" : "stopped", p.step,
                               p.total_steps, FormatDuration(outcome.wall_seconds))
            << "  held-out accuracy: " << AccuracyAt(p.first_eval_accuracy, p.first_eval_step)
            << " -> " << AccuracyAt(p.last_eval_accuracy, p.last_eval_step) << "\n";
  for (learner::Role role : {learner::Role::kTeacher, learner::Role::kStudent}) {
    const std::string& dir =
        role == learner::Role::kTeacher ? config.teacher.checkpoint : config.student.checkpoint;
    if (absl::StatusOr<learner::SftResult> sft = learner::ReadSftSummary(dir); sft.ok()) {
      std::cout << absl::StrFormat("  %s after SFT bootstrap: %.3f\n", learner::RoleName(role),
                                   sft->accuracy);
    }
  }
  if (outcome.restarts > 0) {
    std::cout << absl::StrFormat("  processes restarted after dying: %d (see kappa run's messages)\n",
                                 outcome.restarts);
  }
  if (p.alarms_fired.empty()) {
    std::cout << "  alarms: none fired\n";
  }
  for (const auto& [kind, count] : p.alarms_fired) {
    std::cout << absl::StrFormat("  alarm %s fired %d time%s (first at step %d)\n", kind, count,
                                 count == 1 ? "" : "s", p.first_alarm_step.at(kind));
  }
  std::cout << "  run dir: " << run_dir << " (config.yaml, metrics.jsonl, checkpoints/, logs/)\n"
            << std::flush;

  nlohmann::json summary = {{"name", config.name},
                            {"exit_code", outcome.exit_code},
                            {"steps", p.step},
                            {"total_steps", p.total_steps},
                            {"wall_seconds", outcome.wall_seconds}};
  if (p.first_eval_accuracy) summary["accuracy_before"] = *p.first_eval_accuracy;
  if (p.last_eval_accuracy) summary["accuracy_after"] = *p.last_eval_accuracy;
  summary["alarms_fired"] = p.alarms_fired;
  summary["restarts"] = outcome.restarts;
  std::ofstream(fs::path(run_dir) / "run_summary.json") << summary.dump(2) << "\n";
}

}  // namespace

namespace {

// Children may run from anywhere: the bootstrapped checkpoints (made now if
// missing), the directories and the TLS files as absolute paths.
absl::Status MakePathsAbsolute(services::Config& config) {
  for (learner::Role role : {learner::Role::kTeacher, learner::Role::kStudent}) {
    KAPPA_ASSIGN_OR_RETURN(std::string checkpoint,
                           EnsureBootstrapCheckpoint(config, role, std::cout));
    const std::string absolute = fs::absolute(checkpoint).string();
    (role == learner::Role::kTeacher ? config.teacher.checkpoint : config.student.checkpoint) =
        absolute;
  }
  config.data_dir = fs::absolute(config.data_dir).string();
  config.runs_dir = fs::absolute(config.runs_dir).string();
  for (std::string* path :
       {&config.security.cert_file, &config.security.key_file, &config.security.ca_file,
        &config.security.token_file, &config.security.tokens_dir}) {
    if (!path->empty()) *path = fs::absolute(*path).string();
  }
  return absl::OkStatus();
}

// What each server would refuse at start-up (GrpcServer::Start), said once
// before any process starts: a listen address off loopback without client
// authentication, unless security.allow_insecure.
absl::Status CheckListenSecurity(const services::Config& config) {
  KAPPA_ASSIGN_OR_RETURN(const services::TransportSecurity security,
                         services::LoadTransportSecurity(config.security));
  if (security.AuthenticatesClients() || config.security.allow_insecure) return absl::OkStatus();
  services::Config resolved = config;
  ResolveListenAddresses(resolved);
  for (const auto& [key, address] : {std::pair{"teacher.address", resolved.teacher.address},
                                     std::pair{"verifier.address", resolved.verifier.address},
                                     std::pair{"learner.address", resolved.learner.address}}) {
    if (!services::IsLoopbackAddress(address)) {
      return absl::FailedPreconditionError(absl::StrCat(
          key, ": ", address,
          " is not a loopback address and no client authentication is set: set security.tls "
          "with security.mutual_tls or tokens (security.tokens_dir, security.token_file), or "
          "security.allow_insecure: true (docs/security.md)"));
    }
  }
  return absl::OkStatus();
}

// A run ready to start: everything checked and written before any process.
struct PreparedRun {
  services::Config config;
  std::string run_dir;
  LaunchPlan plan;
  services::TransportSecurity security;
};

// Loads and checks the configuration (the memory plan unless
// --ignore-plan), prepares the run directory, bootstraps the checkpoints,
// loads the TLS material (so a bad certificate path is one clear message
// rather than three services failing), resolves the addresses and the
// weight group, writes the resolved config.yaml and plans the launch.
absl::StatusOr<PreparedRun> PrepareRun(const CommandLine& line,
                                       const std::vector<std::string>& overrides) {
  PreparedRun run;
  KAPPA_ASSIGN_OR_RETURN(run.config, services::LoadConfig(line.config_path, overrides));
  services::Config& config = run.config;
  KAPPA_RETURN_IF_ERROR(Preflight(config, !line.Has("--ignore-plan")));
  KAPPA_RETURN_IF_ERROR(CheckListenSecurity(config));
  const bool resume = line.Has("--resume");
  KAPPA_ASSIGN_OR_RETURN(run.run_dir, PrepareRunDir(config, resume, std::cout));
  std::cout << "kappa run: '" << config.name << "' in " << run.run_dir << "\n" << std::flush;
  KAPPA_RETURN_IF_ERROR(MakePathsAbsolute(config));
  KAPPA_ASSIGN_OR_RETURN(run.security, services::LoadTransportSecurity(config.security));
  ResolveListenAddresses(config);
  KAPPA_RETURN_IF_ERROR(ResolveWeightGroup(config));
  const std::string config_yaml = (fs::path(run.run_dir) / "config.yaml").string();
  KAPPA_RETURN_IF_ERROR(WriteResolvedConfig(config, config_yaml));
  KAPPA_ASSIGN_OR_RETURN(run.plan, PlanLaunch(config, config_yaml, run.run_dir, resume));
  return run;
}

}  // namespace

int RunCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CommandLine> line =
      ParseCommandLine(args, {}, {"--resume", "--no-progress", "--ignore-plan"});
  if (!line.ok()) {
    std::cerr << "kappa run: " << line.status().message() << "\n" << kUsage;
    return 2;
  }
  absl::StatusOr<std::vector<std::string>> overrides =
      services::WithEnvironmentOverrides(line->overrides, environ);
  if (!overrides.ok()) {
    std::cerr << "kappa run: " << overrides.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<PreparedRun> run = PrepareRun(*line, *overrides);
  if (!run.ok()) {
    std::cerr << "kappa run: " << run.status().message() << "\n";
    return 1;
  }
  InstallTerminationHandlers();
  SessionOptions options;
  options.run_dir = run->run_dir;
  options.security = std::move(run->security);
  options.total_steps = run->config.trainer.steps;
  options.show_progress = !line->Has("--no-progress");
  const SessionOutcome outcome = RunSession(run->plan, options);
  // A learner killed mid-run leaves its /dev/shm versions behind until a
  // learner on this host starts again; the run is over, so none will.
  if (const int swept = dist::SweepDeadShmSegments(); swept > 0) {
    std::cout << "  removed " << swept << " shared-memory segment(s) of a stopped learner\n";
  }
  PrintSummary(run->config, run->run_dir, outcome);
  // The page of the run's curves, also for a stopped run (what it got to).
  if (absl::StatusOr<RunReportOutcome> report = WriteRunReport(run->run_dir, ""); report.ok()) {
    std::cout << "  report: " << report->path << "\n";
  } else {
    std::cerr << "kappa run: no report: " << report.status().message() << "\n";
  }
  return outcome.exit_code;
}

}  // namespace kappa::cli
