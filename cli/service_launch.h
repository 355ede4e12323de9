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
#include "services/ready_file.h"

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

// Teacher, verifier and learner listen on a port of the kernel's choosing on
// config.host unless the config fixes one: an address whose port is 0 or
// that is the built-in default becomes "<host>:0" (each service binds it
// itself and reports the port in its ready file); any other address is kept
// as written.
void ResolveListenAddresses(services::Config& config);

// rollout.weight_transport: c10d: the learner's weight group takes every
// worker kappa run starts (learner.weight_group_workers 0 becomes
// `workers`) and, when learner.weight_group_store is empty, meets at
// tcp://HOST:0: the learner binds a port itself and hands it out in
// JoinWeightGroup. Anything else is left as written.
absl::Status ResolveWeightGroup(services::Config& config);

// One process of a local run. Its command line asks it to bind its gRPC
// server (if it has one) and its /metrics endpoint on port 0 and to report
// both in `ready_file` (services/ready_file.h).
struct ServiceProcess {
  ProcessSpec spec;
  // The Prometheus scrape job, named as in deploy/prometheus/prometheus.yml
  // (kappa-learner, kappa-teacher, kappa-verifier, kappa-rollout), so the
  // rules and the dashboard work unchanged on a local run.
  std::string job;
  std::string ready_file;  // <run_dir>/ready/<name>.json
};

struct LaunchPlan {
  ServiceProcess teacher;
  ServiceProcess verifier;
  ServiceProcess learner;  // rank 0: evaluates, logs metrics.jsonl, checkpoints
  // learner.world_size > 1: ranks 1.. (learner-1, ...); rollout worker i
  // talks to rank i mod world_size.
  std::vector<ServiceProcess> learner_ranks;
  // rollout-0 .. rollout-(N-1), without the addresses of the services they
  // talk to: WorkerSpec adds them once those services have reported.
  std::vector<ServiceProcess> workers;
};

// `worker`'s command line with the addresses it connects to.
ProcessSpec WorkerSpec(const ServiceProcess& worker, const std::string& teacher,
                       const std::string& verifier, const std::string& learner);

// `spec` with --address and --metrics-address set to what its first run
// reported (either left out when `ready` has it empty), for a restart: the
// processes that talk to it, and Prometheus, keep finding it. The port was
// the dead process's own, so only a process that binds that exact port in
// the moment between can take it; the restart then fails and says so.
ProcessSpec PinnedSpec(const ProcessSpec& spec, const services::ReadyInfo& ready);

// One process's Prometheus endpoint, as reported in its ready file.
struct MetricsEndpoint {
  std::string job;
  std::string process;  // the ProcessSpec name: learner, rollout-0, ...
  std::string address;  // host:port; /metrics there
};

// A Prometheus configuration that scrapes `endpoints` (one job per
// MetricsEndpoint::job, a `process` label per target), written by `kappa run`
// to <run_dir>/prometheus.yml: `prometheus --config.file=<that>` watches a
// local run.
std::string PrometheusScrapeConfig(const std::vector<MetricsEndpoint>& endpoints);

// All processes read the resolved `config_yaml` (nothing else on their
// command line differs from what a user would type), log to
// <run_dir>/logs/<name>.log, report where they listen in
// <run_dir>/ready/<name>.json, and get OMP_NUM_THREADS/OPENBLAS_NUM_THREADS
// matching the libtorch thread count their config section asks for.
// REQUIRES: ResolveListenAddresses(config) has run.
absl::StatusOr<LaunchPlan> PlanLaunch(const services::Config& config,
                                      const std::string& config_yaml, const std::string& run_dir,
                                      bool resume);

}  // namespace kappa::cli
