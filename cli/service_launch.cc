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

void ResolveListenAddresses(services::Config& config) {
  const services::Config defaults;
  for (auto [address, default_address] :
       {std::pair{&config.teacher.address, defaults.teacher.address},
        std::pair{&config.verifier.address, defaults.verifier.address},
        std::pair{&config.learner.address, defaults.learner.address}}) {
    if (PortOf(*address) != 0 && *address != default_address) continue;
    *address = absl::StrCat(config.host, ":0");
  }
}

absl::Status ResolveWeightGroup(services::Config& config) {
  if (config.rollout.weight_transport != services::WeightTransport::kC10d) return absl::OkStatus();
  if (config.learner.weight_group_workers == 0) {
    config.learner.weight_group_workers = config.workers;
  }
  // Port 0: the learner binds the store itself and tells each worker the
  // port in its JoinWeightGroup answer.
  if (config.learner.weight_group_store.empty()) {
    config.learner.weight_group_store =
        absl::StrCat("tcp://", ConnectAddress(absl::StrCat(config.host, ":0")));
  }
  return absl::OkStatus();
}

ProcessSpec WorkerSpec(const ServiceProcess& worker, const std::string& teacher,
                       const std::string& verifier, const std::string& learner) {
  ProcessSpec spec = worker.spec;
  for (const std::string& arg :
       {std::string("--teacher"), ConnectAddress(teacher), std::string("--verifier"),
        ConnectAddress(verifier), std::string("--learner"), ConnectAddress(learner)}) {
    spec.argv.push_back(arg);
  }
  return spec;
}

ProcessSpec PinnedSpec(const ProcessSpec& spec, const services::ReadyInfo& ready) {
  ProcessSpec pinned = spec;
  pinned.argv.clear();
  // Drops every earlier --address/--metrics-address (both spellings).
  for (size_t i = 0; i < spec.argv.size(); ++i) {
    const std::string& arg = spec.argv[i];
    if (arg == "--address" || arg == "--metrics-address") {
      ++i;
      continue;
    }
    if (arg.rfind("--address=", 0) == 0 || arg.rfind("--metrics-address=", 0) == 0) continue;
    pinned.argv.push_back(arg);
  }
  if (!ready.address.empty()) {
    pinned.argv.push_back("--address");
    pinned.argv.push_back(ready.address);
  }
  if (!ready.metrics_address.empty()) {
    pinned.argv.push_back("--metrics-address");
    pinned.argv.push_back(ready.metrics_address);
  }
  return pinned;
}

absl::StatusOr<LaunchPlan> PlanLaunch(const services::Config& config,
                                      const std::string& config_yaml, const std::string& run_dir,
                                      bool resume) {
  LaunchPlan plan;
  const int64_t tpp = config.threads_per_process;
  const std::string any_port = absl::StrCat(config.host, ":0");
  // Every process serves Prometheus /metrics on a port it binds itself.
  auto make = [&](const std::string& job, const std::string& name, const char* binary,
                  std::vector<std::string> args,
                  std::vector<std::string> env) -> absl::StatusOr<ServiceProcess> {
    ServiceProcess service;
    service.job = job;
    service.ready_file = (fs::path(run_dir) / "ready" / (name + ".json")).string();
    for (const std::string& arg : {std::string("--metrics-address"), any_port,
                                   std::string("--ready-file"), service.ready_file}) {
      args.push_back(arg);
    }
    absl::StatusOr<ProcessSpec> spec =
        MakeSpec(name, binary, std::move(args), std::move(env), config_yaml, run_dir);
    if (!spec.ok()) return spec.status();
    service.spec = *std::move(spec);
    return service;
  };

  absl::StatusOr<ServiceProcess> service =
      make("kappa-teacher", "teacher", kTeacherBinary, {}, ThreadEnv(config.teacher.threads, tpp));
  if (!service.ok()) return service.status();
  plan.teacher = *std::move(service);

  // The verifier links no libtorch; the variables only keep a stray BLAS
  // from spreading over every core.
  service = make("kappa-verifier", "verifier", kVerifierBinary, {}, ThreadEnv(0, tpp));
  if (!service.ok()) return service.status();
  plan.verifier = *std::move(service);

  // Data parallel: ranks 1.. listen on ports of their own and meet rank 0
  // at the store; all share the run directory (only rank 0 writes to it).
  // The store's port is still picked here (PickFreePort's race): every rank
  // must know it before any of them starts.
  const int64_t ranks = std::max<int64_t>(1, config.learner.world_size);
  std::string store = config.learner.dist_store;
  if (ranks > 1 && store.empty()) {
    absl::StatusOr<int> port = PickFreePort(config.host);
    if (!port.ok()) return port.status();
    store = absl::StrCat("tcp://", ConnectAddress(absl::StrCat(config.host, ":", *port)));
  }
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
      learner_args.push_back("--address");
      learner_args.push_back(any_port);
    }
    service = make("kappa-learner", rank == 0 ? "learner" : absl::StrCat("learner-", rank),
                   kLearnerBinary, std::move(learner_args), ThreadEnv(config.learner.threads, tpp));
    if (!service.ok()) return service.status();
    if (rank == 0) {
      plan.learner = *std::move(service);
    } else {
      plan.learner_ranks.push_back(*std::move(service));
    }
  }

  for (int64_t i = 0; i < config.workers; ++i) {
    // A stable id per slot: the worker derives its sampling seed from it.
    const std::string name = absl::StrCat("rollout-", i);
    service = make("kappa-rollout", name, kRolloutWorkerBinary, {"--worker-id", name},
                   ThreadEnv(config.rollout.threads, tpp));
    if (!service.ok()) return service.status();
    plan.workers.push_back(*std::move(service));
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
