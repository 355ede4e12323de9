#include "cli/service_launch.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/free_port.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;

bool IsExecutable(const fs::path& path) {
  return fs::is_regular_file(path) && access(path.c_str(), X_OK) == 0;
}

// The build-tree directory each binary is built in.
std::string ComponentDir(const std::string& binary) {
  if (binary == kTeacherBinary) return "teacher_server";
  if (binary == kVerifierBinary) return "verifier";
  if (binary == kLearnerBinary) return "learner";
  if (binary == kRolloutWorkerBinary) return "rollout_worker";
  return "";
}

// The libtorch thread count a process asks for: its own section's setting,
// else threads_per_process; 0 means "libtorch's default" (no variable set).
std::vector<std::string> ThreadEnv(int64_t section_threads, int64_t threads_per_process) {
  const int64_t threads = section_threads > 0 ? section_threads : threads_per_process;
  if (threads <= 0) return {};
  return {absl::StrCat("OMP_NUM_THREADS=", threads),
          absl::StrCat("OPENBLAS_NUM_THREADS=", threads)};
}

absl::StatusOr<ProcessSpec> MakeSpec(const std::string& name, const std::string& binary,
                                     std::vector<std::string> extra_args,
                                     std::vector<std::string> env,
                                     const std::string& config_yaml, const std::string& run_dir) {
  absl::StatusOr<std::string> path = FindServiceBinary(binary);
  if (!path.ok()) return path.status();
  ProcessSpec spec;
  spec.name = name;
  spec.argv = {*path, "--config", config_yaml};
  for (std::string& arg : extra_args) spec.argv.push_back(std::move(arg));
  spec.env = std::move(env);
  spec.log_file = (fs::path(run_dir) / "logs" / (name + ".log")).string();
  return spec;
}

}  // namespace

std::string ExecutableDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

absl::StatusOr<std::string> FindServiceBinary(const std::string& binary) {
  std::vector<fs::path> candidates;
  const fs::path exe_dir = ExecutableDir();
  candidates.push_back(exe_dir / binary);
  if (const char* env = std::getenv("KAPPA_BIN_DIR"); env != nullptr && *env != '\0') {
    candidates.push_back(fs::path(env) / binary);
  }
  if (const std::string component = ComponentDir(binary); !component.empty()) {
    candidates.push_back(exe_dir.parent_path() / component / binary);
  }
  std::vector<std::string> tried;
  for (const fs::path& candidate : candidates) {
    if (IsExecutable(candidate)) return fs::absolute(candidate).lexically_normal().string();
    tried.push_back(candidate.string());
  }
  return absl::NotFoundError(absl::StrCat("cannot find the ", binary, " executable (tried ",
                                          absl::StrJoin(tried, ", "), "); build it (ninja ",
                                          binary, ") or set KAPPA_BIN_DIR"));
}

absl::Status AssignServiceAddresses(services::Config& config) {
  const services::Config defaults;
  struct Slot {
    std::string* address;
    std::string default_address;
  };
  for (Slot slot : {Slot{&config.teacher.address, defaults.teacher.address},
                    Slot{&config.verifier.address, defaults.verifier.address},
                    Slot{&config.learner.address, defaults.learner.address}}) {
    if (PortOf(*slot.address) != 0 && *slot.address != slot.default_address) continue;
    absl::StatusOr<int> port = PickFreePort(config.host);
    if (!port.ok()) return port.status();
    *slot.address = absl::StrCat(config.host, ":", *port);
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchPlan> PlanLaunch(const services::Config& config,
                                      const std::string& config_yaml, const std::string& run_dir,
                                      bool resume) {
  LaunchPlan plan;
  const int64_t tpp = config.threads_per_process;
  absl::StatusOr<ProcessSpec> spec =
      MakeSpec("teacher", kTeacherBinary, {}, ThreadEnv(config.teacher.threads, tpp),
               config_yaml, run_dir);
  if (!spec.ok()) return spec.status();
  plan.teacher = *std::move(spec);

  // The verifier links no libtorch; the variables only keep a stray BLAS
  // from spreading over every core.
  spec = MakeSpec("verifier", kVerifierBinary, {}, ThreadEnv(0, tpp), config_yaml, run_dir);
  if (!spec.ok()) return spec.status();
  plan.verifier = *std::move(spec);

  // The learner serves Prometheus /metrics on a port of its own.
  absl::StatusOr<int> metrics_port = PickFreePort(config.host);
  if (!metrics_port.ok()) return metrics_port.status();
  plan.learner_metrics_address = absl::StrCat(config.host, ":", *metrics_port);
  std::vector<std::string> learner_args = {"--run-dir", run_dir, "--metrics-address",
                                           plan.learner_metrics_address};
  if (resume) learner_args.push_back("--resume");
  spec = MakeSpec("learner", kLearnerBinary, std::move(learner_args),
                  ThreadEnv(config.learner.threads, tpp), config_yaml, run_dir);
  if (!spec.ok()) return spec.status();
  plan.learner = *std::move(spec);

  for (int64_t i = 0; i < config.workers; ++i) {
    // A stable id per slot: the worker derives its sampling seed from it.
    const std::string name = absl::StrCat("rollout-", i);
    spec = MakeSpec(name, kRolloutWorkerBinary, {"--worker-id", name},
                    ThreadEnv(config.rollout.threads, tpp), config_yaml, run_dir);
    if (!spec.ok()) return spec.status();
    plan.workers.push_back(*std::move(spec));
  }
  return plan;
}

}  // namespace kappa::cli
