#include "cli/service_launch.h"

#include <unistd.h>

#include <algorithm>
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
  // Every process serves Prometheus /metrics on a free port of its own.
  auto add = [&](const std::string& job, const std::string& name, const char* binary,
                 std::vector<std::string> args,
                 std::vector<std::string> env) -> absl::StatusOr<ProcessSpec> {
    absl::StatusOr<int> port = PickFreePort(config.host);
    if (!port.ok()) return port.status();
    const std::string metrics_address = absl::StrCat(config.host, ":", *port);
    args.push_back("--metrics-address");
    args.push_back(metrics_address);
    absl::StatusOr<ProcessSpec> spec =
        MakeSpec(name, binary, std::move(args), std::move(env), config_yaml, run_dir);
    if (spec.ok()) plan.metrics.push_back({job, name, metrics_address});
    return spec;
  };

  absl::StatusOr<ProcessSpec> spec = add("kappa-teacher", "teacher", kTeacherBinary, {},
                                         ThreadEnv(config.teacher.threads, tpp));
  if (!spec.ok()) return spec.status();
  plan.teacher = *std::move(spec);

  // The verifier links no libtorch; the variables only keep a stray BLAS
  // from spreading over every core.
  spec = add("kappa-verifier", "verifier", kVerifierBinary, {}, ThreadEnv(0, tpp));
  if (!spec.ok()) return spec.status();
  plan.verifier = *std::move(spec);

  // Data parallel: ranks 1.. listen on ports of their own and meet rank 0
  // at the store; all share the run directory (only rank 0 writes to it).
  const int64_t ranks = std::max<int64_t>(1, config.learner.world_size);
  std::string store = config.learner.dist_store;
  if (ranks > 1 && store.empty()) {
    absl::StatusOr<int> port = PickFreePort(config.host);
    if (!port.ok()) return port.status();
    store = absl::StrCat("tcp://", ConnectAddress(absl::StrCat(config.host, ":", *port)));
  }
  std::vector<std::string> learner_addresses = {ConnectAddress(config.learner.address)};
  for (int64_t rank = 0; rank < ranks; ++rank) {
    std::vector<std::string> learner_args = {"--run-dir", run_dir};
    if (resume) learner_args.push_back("--resume");
    if (ranks > 1) {
      for (const std::string& arg : {std::string("--world-size"), absl::StrCat(ranks),
                                     std::string("--rank"), absl::StrCat(rank),
                                     std::string("--dist-store"), store}) {
        learner_args.push_back(arg);
      }
    }
    if (rank > 0) {
      absl::StatusOr<int> port = PickFreePort(config.host);
      if (!port.ok()) return port.status();
      const std::string address = absl::StrCat(config.host, ":", *port);
      learner_args.push_back("--address");
      learner_args.push_back(address);
      learner_addresses.push_back(ConnectAddress(address));
    }
    spec = add("kappa-learner", rank == 0 ? "learner" : absl::StrCat("learner-", rank),
               kLearnerBinary, std::move(learner_args), ThreadEnv(config.learner.threads, tpp));
    if (!spec.ok()) return spec.status();
    if (rank == 0) {
      plan.learner = *std::move(spec);
    } else {
      plan.learner_ranks.push_back(*std::move(spec));
      plan.learner_rank_addresses.push_back(learner_addresses.back());
    }
  }

  for (int64_t i = 0; i < config.workers; ++i) {
    // A stable id per slot: the worker derives its sampling seed from it.
    const std::string name = absl::StrCat("rollout-", i);
    std::vector<std::string> worker_args = {"--worker-id", name};
    if (ranks > 1) {
      worker_args.push_back("--learner");
      worker_args.push_back(learner_addresses[static_cast<size_t>(i % ranks)]);
    }
    spec = add("kappa-rollout", name, kRolloutWorkerBinary, std::move(worker_args),
               ThreadEnv(config.rollout.threads, tpp));
    if (!spec.ok()) return spec.status();
    plan.workers.push_back(*std::move(spec));
  }
  return plan;
}

std::string PrometheusScrapeConfig(const std::vector<MetricsEndpoint>& endpoints) {
  std::string out =
      "# Written by `kappa run`: scrapes this run's processes.\n"
      "#   prometheus --config.file=prometheus.yml\n"
      "global:\n"
      "  scrape_interval: 5s\n"
      "  evaluation_interval: 5s\n"
      "scrape_configs:\n";
  std::vector<std::string> jobs;
  for (const MetricsEndpoint& endpoint : endpoints) {
    if (std::find(jobs.begin(), jobs.end(), endpoint.job) == jobs.end()) {
      jobs.push_back(endpoint.job);
    }
  }
  for (const std::string& job : jobs) {
    absl::StrAppend(&out, "  - job_name: ", job, "\n    static_configs:\n");
    for (const MetricsEndpoint& endpoint : endpoints) {
      if (endpoint.job != job) continue;
      absl::StrAppend(&out, "      - targets: [\"", ConnectAddress(endpoint.address), "\"]\n",
                      "        labels: {process: \"", endpoint.process, "\"}\n");
    }
  }
  return out;
}

}  // namespace kappa::cli
