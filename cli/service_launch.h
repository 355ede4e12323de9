// How `kappa run` starts the services: where their binaries are, which
// addresses they get, and the command line, environment and log file of
// each process.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/process_supervisor.h"
#include "services/config.h"

namespace kappa::cli {

inline constexpr const char* kTeacherBinary = "kappa-teacher";
inline constexpr const char* kVerifierBinary = "kappa-verifier";
inline constexpr const char* kLearnerBinary = "kappa-learner";
inline constexpr const char* kRolloutWorkerBinary = "kappa-rollout-worker";

// Directory of the running executable (/proc/self/exe).
std::string ExecutableDir();

// Finds `binary`: next to `kappa` first (an install puts them together), then
// in $KAPPA_BIN_DIR, then in the build tree (<exe dir>/../<component>/, since
// each component's binary lands in its own build directory). NOT_FOUND lists
// the places tried.
absl::StatusOr<std::string> FindServiceBinary(const std::string& binary);

// Gives teacher, verifier and learner a free port on config.host unless the
// config fixes one: an address whose port is 0 or that is the built-in
// default is treated as "pick one"; any other address is kept as written.
absl::Status AssignServiceAddresses(services::Config& config);

// One process's Prometheus endpoint. `job` is the scrape job the process
// belongs to, named as in deploy/prometheus/prometheus.yml (kappa-learner,
// kappa-teacher, kappa-verifier, kappa-rollout), so the rules and the
// dashboard work unchanged on a local run.
struct MetricsEndpoint {
  std::string job;
  std::string process;  // the ProcessSpec name: learner, rollout-0, ...
  std::string address;  // host:port; /metrics there
};

struct LaunchPlan {
  ProcessSpec teacher;
  ProcessSpec verifier;
  ProcessSpec learner;  // rank 0: evaluates, logs metrics.jsonl, checkpoints
  // learner.world_size > 1: ranks 1.. (learner-1, ...) with their gRPC
  // addresses; rollout worker i talks to rank i mod world_size.
  std::vector<ProcessSpec> learner_ranks;
  std::vector<std::string> learner_rank_addresses;
  std::vector<ProcessSpec> workers;  // rollout-0 .. rollout-(N-1)
  std::vector<MetricsEndpoint> metrics;  // every process above, each on a free port
};

// A Prometheus configuration that scrapes `endpoints` (one job per
// MetricsEndpoint::job, a `process` label per target), written by `kappa run`
// to <run_dir>/prometheus.yml: `prometheus --config.file=<that>` watches a
// local run.
std::string PrometheusScrapeConfig(const std::vector<MetricsEndpoint>& endpoints);

// All processes read the resolved `config_yaml` (nothing else on their
// command line differs from what a user would type), log to
// <run_dir>/logs/<name>.log, and get OMP_NUM_THREADS/OPENBLAS_NUM_THREADS
// matching the libtorch thread count their config section asks for.
absl::StatusOr<LaunchPlan> PlanLaunch(const services::Config& config,
                                      const std::string& config_yaml, const std::string& run_dir,
                                      bool resume);

}  // namespace kappa::cli
