// kappa-rollout-worker: samples groups for the learner.
//
//   kappa-rollout-worker --config FILE [--learner ADDR] [--teacher ADDR]
//                        [--verifier ADDR] [--worker-id ID] [--log-file PATH]
//                        [--metrics-address HOST:PORT]
//                        [key=value ...]
//   kappa-rollout-worker --health-check ADDR
//
// Flags are parsed by services/cli_flags.h, shared by every kappa binary.
// Exit codes (services/service_main.h): 2 for a bad flag, key, device, TLS
// setting or student tokenizer, and when the policy weights can never
// arrive (rollout.weight_transport); 1 when the metrics endpoint or ready
// file fails, or the worker's run does.
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/stable_hash.h"
#include "base/status.h"
#include "model/text_tokenizer.h"
#include "rollout_worker/policy_watcher.h"
#include "rollout_worker/stop_strings.h"
#include "rollout_worker/worker.h"
#include "services/cli_flags.h"
#include "services/config.h"
#include "services/grpc_util.h"
#include "services/logging.h"
#include "services/metrics.h"
#include "services/metrics_server.h"
#include "services/ready_file.h"
#include "services/rollout_keys.h"
#include "services/server.h"
#include "services/service_main.h"
#include "services/torch_runtime.h"

namespace kappa::rollout {
namespace {

using services::CommonFlags;
using services::ConfigurationError;

constexpr char kExtraUsage[] =
    "  --learner ADDR         learner address (default: learner.address; --address is an alias)\n"
    "  --teacher ADDR         teacher address (default: teacher.address)\n"
    "  --verifier ADDR        verifier address (default: verifier.address)\n"
    "  --worker-id ID         unique worker id (default: host:pid)\n";

std::string DefaultWorkerId() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host[0] ? host : "localhost", ":", getpid());
}

// The value of --`name` when given and not empty, else `fallback`.
std::string FlagOr(const CommonFlags& flags, const std::string& name, const std::string& fallback) {
  auto it = flags.extra.find(name);
  return it != flags.extra.end() && !it->second.empty() ? it->second : fallback;
}

// The responses' text (for the verifier, stop strings, logs) in the
// student's tokenizer: the weights come over the wire, the tokenizer from
// the student's model directory (so a worker needs read access to it; the
// toy models have none and decode with the character tokenizer). A
// ConfigurationError when it does not load.
absl::StatusOr<TokenDecoder> ResponseDecoder(const services::Config& config) {
  const std::string student_dir = services::StudentModelDir(config);
  absl::StatusOr<model::TextTokenizer> tokenizer =
      base::CaptureExceptions(absl::StrCat("student tokenizer (", student_dir, ")"),
                              [&] { return model::TextTokenizer::ForModel(student_dir); });
  if (!tokenizer.ok()) return ConfigurationError(tokenizer.status());
  spdlog::info("responses decode with {}", tokenizer->source());
  return TokenDecoder([decoder = *std::move(tokenizer)](const std::vector<int64_t>& ids) {
    return decoder.Decode(ids, /*skip_special_tokens=*/true);
  });
}

// The worker's options from the rollout.* keys (and student.dtype, the
// trainer's group size and seed) and --worker-id; a bad key or device is a
// ConfigurationError naming it, refused before any connection.
absl::StatusOr<WorkerOptions> WorkerOptionsFromConfig(const services::Config& config,
                                                      const CommonFlags& flags) {
  WorkerOptions options;
  options.worker_id = FlagOr(flags, "worker-id", DefaultWorkerId());
  // The one parser learner.device and teacher.device use.
  absl::StatusOr<torch::Device> device =
      services::ResolveDevice(config.rollout.device, "rollout.device");
  if (!device.ok()) return ConfigurationError(device.status());
  options.device = *device;
  options.dtype = services::ResolveModelDtype(config.student.dtype, *device);
  KAPPA_RETURN_IF_ERROR(ConfigurationError(services::ValidateRolloutKeys(config)));
  // rollout.weights_dtype / weight_delta / weight_transport: how policy
  // versions travel (rollout_worker/policy_watcher.h).
  options.weight_sync.weights_dtype = WeightsDtype(config.rollout.weights_dtype);
  options.weight_sync.weight_delta = config.rollout.weight_delta;
  options.weight_sync.lora_adapters = config.student.lora.rank > 0;
  SetWeightTransport(config.rollout.weight_transport, &options.weight_sync);
  options.max_outstanding = static_cast<int32_t>(config.rollout.max_outstanding);
  options.sampler.rpc_deadline = absl::Milliseconds(config.rollout.rpc_deadline_ms);
  options.sampler.default_max_new_tokens = config.rollout.max_new_tokens;
  options.sampler.default_temperature = config.rollout.temperature;
  options.sampler.default_top_p = config.rollout.top_p;
  options.sampler.default_top_k = config.rollout.top_k;
  options.sampler.default_min_p = config.rollout.min_p;
  // Enough slots for every held item's group at once by default.
  options.engine.max_rows = config.rollout.max_batch_rows > 0
                                ? config.rollout.max_batch_rows
                                : std::max<int64_t>(1, config.rollout.max_outstanding) *
                                      std::max<int64_t>(1, config.trainer.group_size);
  options.engine.max_sequence_tokens = config.rollout.max_sequence_tokens;
  options.sampler.seed = services::RlSeed(config) + base::StableHash(options.worker_id);
  KAPPA_ASSIGN_OR_RETURN(options.sampler.decode, ResponseDecoder(config));
  return options;
}

// Whom the worker talks to, and how.
struct Peers {
  std::string learner;          // --learner, else --address, else learner.address
  std::string teacher;          // --teacher, else teacher.address
  std::string verifier;         // --verifier, else verifier.address
  services::ServerOptions rpc;  // the servers' limits and credentials

  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& target) const {
    return services::MakeChannel(target, rpc.security, rpc.max_message_bytes, rpc.keepalive);
  }
};

// The peers for `config` and the flags; a bad TLS or limit setting is a
// ConfigurationError naming the key.
absl::StatusOr<Peers> PeersFromConfig(const services::Config& config, const CommonFlags& flags) {
  Peers peers;
  peers.learner =
      FlagOr(flags, "learner", flags.address.empty() ? config.learner.address : flags.address);
  peers.teacher = FlagOr(flags, "teacher", config.teacher.address);
  peers.verifier = FlagOr(flags, "verifier", config.verifier.address);
  absl::StatusOr<services::ServerOptions> rpc = services::ServerOptionsFromConfig(config);
  if (!rpc.ok()) return ConfigurationError(rpc.status());
  peers.rpc = *std::move(rpc);
  return peers;
}

void LogStartUp(const WorkerOptions& options, const Peers& peers, int64_t threads) {
  using Shm = WeightSyncOptions::Shm;
  const WeightSyncOptions& sync = options.weight_sync;
  spdlog::info("policy weights travel as {}{}{}{}", c10::toString(WireDtype(sync, options.dtype)),
               sync.weight_delta ? ", as lossless deltas when possible" : "",
               sync.c10d ? ", in the learner's weight group when it forms" : "",
               sync.shm == Shm::kRequired ? ", through shared memory (same host)"
               : sync.shm == Shm::kAuto   ? ", through shared memory when on the learner's host"
                                          : "");
  spdlog::info(
      "worker {}: learner {}, teacher {}, verifier {} ({}), policy on {}, {} torch threads, "
      "seed {}",
      options.worker_id, peers.learner, peers.teacher, peers.verifier,
      services::DescribeTransport(peers.rpc.security), options.device.str(), threads,
      options.sampler.seed);
}

// Runs `worker` until SIGTERM/SIGINT, or until its policy watcher finds that
// no version can ever arrive (rollout.weight_transport shm with a learner on
// another host: a ConfigurationError). A thread polls for both and flips the
// worker into its stop path; Run() then cancels every stream and RPC and
// returns.
absl::Status RunUntilTerminated(RolloutWorker* worker) {
  std::atomic<bool> finished{false};
  absl::Status policy_failure;  // written by the watcher, read after its join
  std::thread signal_watcher([&] {
    while (!finished.load()) {
      if (services::TerminationRequested()) {
        spdlog::info("termination signal received; stopping");
        worker->Stop();
        return;
      }
      if (absl::Status fatal = worker->policy_watcher().fatal_status(); !fatal.ok()) {
        policy_failure = ConfigurationError(
            absl::Status(fatal.code(), absl::StrCat("policy weights: ", fatal.message())));
        worker->Stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const absl::Status status = worker->Run();
  finished.store(true);
  signal_watcher.join();
  KAPPA_RETURN_IF_ERROR(policy_failure);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("rollout worker failed: ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status Serve(const CommonFlags& flags) {
  services::InitLogging("rollout-worker", flags.log_file);
  absl::StatusOr<services::Config> config = services::LoadConfigFromFlags(flags);
  if (!config.ok()) return ConfigurationError(config.status());
  services::ConfigureTorchThreads(config->rollout.threads);
  KAPPA_ASSIGN_OR_RETURN(WorkerOptions options, WorkerOptionsFromConfig(*config, flags));
  KAPPA_ASSIGN_OR_RETURN(const Peers peers, PeersFromConfig(*config, flags));
  LogStartUp(options, peers, config->rollout.threads);

  services::metrics::Registry registry;
  WorkerMetrics metrics(registry);
  options.metrics = &metrics;
  RolloutWorker worker(peers.ChannelTo(peers.learner), peers.ChannelTo(peers.verifier),
                       peers.ChannelTo(peers.teacher), std::move(options));
  // The policy version is read at scrape time; the metrics server (declared
  // after `worker`) stops first.
  registry.AddCollectHook(
      [&] { metrics.SetPolicyVersion(worker.policy_watcher().Current().version); });
  KAPPA_ASSIGN_OR_RETURN(
      std::unique_ptr<services::metrics::MetricsServer> metrics_server,
      services::metrics::ServeMetricsIfRequested(flags.metrics_address, &registry));
  KAPPA_RETURN_IF_ERROR(services::WriteReadyFile(
      flags.ready_file, {getpid(), "", services::metrics::BoundAddress(metrics_server.get())}));
  return RunUntilTerminated(&worker);
}

}  // namespace
}  // namespace kappa::rollout

int main(int argc, char** argv) {
  return kappa::services::ServiceMain(argc, argv,
                                      {"kappa-rollout-worker",
                                       kappa::rollout::kExtraUsage,
                                       {"learner", "teacher", "verifier", "worker-id"},
                                       kappa::rollout::Serve});
}
