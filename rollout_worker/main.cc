// kappa-rollout-worker: samples groups for the learner.
//
//   kappa-rollout-worker --config FILE [--learner ADDR] [--teacher ADDR]
//                        [--verifier ADDR] [--worker-id ID] [--log-file PATH]
//                        [--metrics-address HOST:PORT]
//                        [key=value ...]
//   kappa-rollout-worker --health-check ADDR
//
// Flags are parsed by services/cli_flags.h, shared by every kappa binary.
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/stable_hash.h"
#include "base/status.h"
#include "model/text_tokenizer.h"
#include "rollout_worker/policy_watcher.h"
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
#include "services/torch_runtime.h"

namespace {

std::string DefaultWorkerId() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host[0] ? host : "localhost", ":", getpid());
}

}  // namespace

int main(int argc, char** argv) {
  kappa::services::InstallTerminationHandlers();
  const std::string extra_usage =
      "  --learner ADDR         learner address (default: learner.address; --address is an alias)\n"
      "  --teacher ADDR         teacher address (default: teacher.address)\n"
      "  --verifier ADDR        verifier address (default: verifier.address)\n"
      "  --worker-id ID         unique worker id (default: host:pid)\n";
  absl::StatusOr<kappa::services::CommonFlags> flags = kappa::services::ParseCommonFlags(
      argc, argv, {"learner", "teacher", "verifier", "worker-id"});
  if (!flags.ok()) {
    std::cerr << "kappa-rollout-worker: " << flags.status().message() << "\n"
              << kappa::services::Usage("kappa-rollout-worker", extra_usage);
    return 2;
  }
  if (flags->help) {
    std::cout << kappa::services::Usage("kappa-rollout-worker", extra_usage);
    return 0;
  }
  if (!flags->health_check_address.empty()) {
    return kappa::services::RunHealthCheck(*flags);
  }

  kappa::services::InitLogging("rollout-worker", flags->log_file);
  absl::StatusOr<kappa::services::Config> config = kappa::services::LoadConfigFromFlags(*flags);
  if (!config.ok()) {
    spdlog::error("configuration: {}", config.status().ToString());
    return 2;
  }
  kappa::services::ConfigureTorchThreads(config->rollout.threads);
  // rollout.device: refused here, before any connection, if it names no
  // usable device (the one parser learner.device and teacher.device use).
  absl::StatusOr<torch::Device> device =
      kappa::services::ResolveDevice(config->rollout.device, "rollout.device");
  if (!device.ok()) {
    spdlog::error("configuration: {}", device.status().ToString());
    return 2;
  }
  auto flag_or = [&](const std::string& name, const std::string& fallback) {
    auto it = flags->extra.find(name);
    return it != flags->extra.end() && !it->second.empty() ? it->second : fallback;
  };

  kappa::rollout::WorkerOptions options;
  options.worker_id = flag_or("worker-id", DefaultWorkerId());
  options.device = *device;
  options.dtype = kappa::services::ResolveModelDtype(config->student.dtype, *device);
  // rollout.weights_dtype / weight_delta / weight_transport: how policy
  // versions travel (rollout_worker/policy_watcher.h).
  options.weight_sync.weights_dtype = kappa::rollout::WeightsDtype(config->rollout.weights_dtype);
  options.weight_sync.weight_delta = config->rollout.weight_delta;
  kappa::rollout::SetWeightTransport(config->rollout.weight_transport, &options.weight_sync);
  using Shm = kappa::rollout::WeightSyncOptions::Shm;
  spdlog::info("policy weights travel as {}{}{}{}",
               c10::toString(kappa::rollout::WireDtype(options.weight_sync, options.dtype)),
               options.weight_sync.weight_delta ? ", as lossless deltas when possible" : "",
               options.weight_sync.c10d ? ", in the learner's weight group when it forms" : "",
               options.weight_sync.shm == Shm::kRequired ? ", through shared memory (same host)"
               : options.weight_sync.shm == Shm::kAuto
                   ? ", through shared memory when on the learner's host"
                   : "");
  options.max_outstanding = static_cast<int32_t>(config->rollout.max_outstanding);
  options.sampler.rpc_deadline = absl::Milliseconds(config->rollout.rpc_deadline_ms);
  options.sampler.default_max_new_tokens = config->rollout.max_new_tokens;
  options.sampler.default_temperature = config->rollout.temperature;
  options.sampler.default_top_p = config->rollout.top_p;
  options.sampler.default_top_k = config->rollout.top_k;
  options.sampler.default_min_p = config->rollout.min_p;
  if (absl::Status settings = kappa::services::ValidateRolloutKeys(*config); !settings.ok()) {
    spdlog::error("configuration: {}", std::string(settings.message()));
    return 2;
  }
  // Enough slots for every held item's group at once by default.
  options.engine.max_rows = config->rollout.max_batch_rows > 0
                                ? config->rollout.max_batch_rows
                                : std::max<int64_t>(1, config->rollout.max_outstanding) *
                                      std::max<int64_t>(1, config->trainer.group_size);
  options.engine.max_sequence_tokens = config->rollout.max_sequence_tokens;
  options.sampler.seed =
      kappa::services::RlSeed(*config) + kappa::base::StableHash(options.worker_id);
  // The responses' text (for the verifier, stop strings, logs) in the
  // student's tokenizer: the weights come over the wire, the tokenizer from
  // the student's model directory (so a worker needs read access to it; the
  // toy models have none and decode with the character tokenizer).
  const std::string student_dir = kappa::services::StudentModelDir(*config);
  absl::StatusOr<kappa::model::TextTokenizer> tokenizer = kappa::base::CaptureExceptions(
      absl::StrCat("student tokenizer (", student_dir, ")"),
      [&] { return kappa::model::TextTokenizer::ForModel(student_dir); });
  if (!tokenizer.ok()) {
    spdlog::error("{}", std::string(tokenizer.status().message()));
    return 2;
  }
  spdlog::info("responses decode with {}", tokenizer->source());
  options.sampler.decode = [decoder = *std::move(tokenizer)](const std::vector<int64_t>& ids) {
    return decoder.Decode(ids, /*skip_special_tokens=*/true);
  };

  const std::string learner =
      flag_or("learner", flags->address.empty() ? config->learner.address : flags->address);
  const std::string teacher = flag_or("teacher", config->teacher.address);
  const std::string verifier = flag_or("verifier", config->verifier.address);
  absl::StatusOr<kappa::services::ServerOptions> rpc =
      kappa::services::ServerOptionsFromConfig(*config);  // the same limits and credentials
  if (!rpc.ok()) {
    spdlog::error("configuration: {}", rpc.status().ToString());
    return 2;
  }
  auto channel_to = [&](const std::string& target) {
    return kappa::services::MakeChannel(target, rpc->security, rpc->max_message_bytes,
                                        rpc->keepalive);
  };
  spdlog::info(
      "worker {}: learner {}, teacher {}, verifier {} ({}), policy on {}, {} torch threads, "
      "seed {}",
      options.worker_id, learner, teacher, verifier,
      kappa::services::DescribeTransport(rpc->security), options.device.str(),
      config->rollout.threads, options.sampler.seed);

  kappa::services::metrics::Registry registry;
  kappa::rollout::WorkerMetrics metrics(registry);
  options.metrics = &metrics;
  kappa::rollout::RolloutWorker worker(channel_to(learner), channel_to(verifier),
                                       channel_to(teacher), options);
  // The policy version is read at scrape time; the metrics server (declared
  // after `worker`) stops first.
  registry.AddCollectHook(
      [&] { metrics.SetPolicyVersion(worker.policy_watcher().Current().version); });
  absl::StatusOr<std::unique_ptr<kappa::services::metrics::MetricsServer>> metrics_server =
      kappa::services::metrics::ServeMetricsIfRequested(flags->metrics_address, &registry);
  if (!metrics_server.ok()) {
    spdlog::error("{}", metrics_server.status().ToString());
    return 1;
  }
  if (absl::Status ready = kappa::services::WriteReadyFile(
          flags->ready_file,
          {getpid(), "", kappa::services::metrics::BoundAddress(metrics_server->get())});
      !ready.ok()) {
    spdlog::error("{}", ready.ToString());
    return 1;
  }
  // Polls for SIGTERM/SIGINT and flips the worker into its stop path; Run()
  // then cancels every stream and RPC and returns.
  std::atomic<bool> finished{false};
  std::atomic<bool> policy_failed{false};
  std::thread signal_watcher([&] {
    while (!finished.load()) {
      if (kappa::services::TerminationRequested()) {
        spdlog::info("termination signal received; stopping");
        worker.Stop();
        return;
      }
      // rollout.weight_transport: shm with a learner on another host: no
      // version can ever arrive.
      if (absl::Status fatal = worker.policy_watcher().fatal_status(); !fatal.ok()) {
        spdlog::error("policy weights: {}", std::string(fatal.message()));
        policy_failed.store(true);
        worker.Stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const absl::Status status = worker.Run();
  finished.store(true);
  signal_watcher.join();
  if (policy_failed.load()) return 2;
  if (!status.ok()) {
    spdlog::error("rollout worker failed: {}", status.ToString());
    return 1;
  }
  return 0;
}
