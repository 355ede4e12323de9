// kappa-teacher: serves kappa.v1.Teacher for one checkpoint.
//
//   kappa-teacher --config FILE [key=value ...] [--checkpoint DIR] [--address HOST:PORT]
//                 [--metrics-address HOST:PORT] [--log-file FILE]
//   kappa-teacher --health-check HOST:PORT
//
// Serves until SIGTERM/SIGINT, then drains in-flight calls and exits within 2 s.
// Exit codes (services/service_main.h): 2 for a bad flag, key, device or TLS
// setting; 1 when the checkpoint does not load or a port cannot be served.
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "model/checkpoint.h"
#include "model/generation_config.h"
#include "model/hf_tokenizer/hf_tokenizer.h"
#include "services/cli_flags.h"
#include "services/config.h"
#include "services/logging.h"
#include "services/metrics.h"
#include "services/metrics_server.h"
#include "services/ready_file.h"
#include "services/server.h"
#include "services/service_main.h"
#include "services/torch_runtime.h"
#include "teacher_server/teacher_service.h"

namespace kappa::teacher {
namespace {

using services::CommonFlags;
using services::ConfigurationError;

// Everything the binary serves with, read from the configuration and flags.
struct TeacherServerOptions {
  std::string checkpoint;  // --checkpoint, else teacher.checkpoint's model dir
  std::string address;     // --address, else teacher.address
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat;
  TeacherOptions service;  // model_name and vocab_limit are set once it loads
  services::ServerOptions server;
};

// The options for `config` and `flags`; a bad teacher.device or TLS setting
// is a ConfigurationError naming the key.
absl::StatusOr<TeacherServerOptions> TeacherServerOptionsFromConfig(const services::Config& config,
                                                                    const CommonFlags& flags) {
  TeacherServerOptions options;
  auto flag = flags.extra.find("checkpoint");
  options.checkpoint = flag != flags.extra.end() ? flag->second : "";
  if (options.checkpoint.empty()) options.checkpoint = services::TeacherModelDir(config);
  options.address = flags.address.empty() ? config.teacher.address : flags.address;

  absl::StatusOr<torch::Device> device =
      services::ResolveDevice(config.teacher.device, "teacher.device");
  if (!device.ok()) return ConfigurationError(device.status());
  options.device = *device;
  options.dtype = services::ResolveModelDtype(config.teacher.dtype, options.device);

  options.service.batching.max_batch_sequences = config.teacher.max_batch_sequences;
  options.service.batching.max_wait = absl::Milliseconds(config.teacher.max_wait_ms);
  options.service.batching.max_queued_sequences = 64 * config.teacher.max_batch_sequences;
  options.service.max_request_positions = config.teacher.max_request_positions;

  absl::StatusOr<services::ServerOptions> server = services::ServerOptionsFromConfig(config);
  if (!server.ok()) return ConfigurationError(server.status());
  options.server = *std::move(server);
  return options;
}

// The checkpoint's model on the configured device and dtype; sets
// options->service's model_name and vocab_limit from it.
absl::StatusOr<model::Decoder> LoadTeacherModel(TeacherServerOptions* options) {
  const std::string& checkpoint = options->checkpoint;
  KAPPA_ASSIGN_OR_RETURN(
      model::Decoder decoder,
      base::CaptureExceptions(absl::StrCat("cannot load checkpoint ", checkpoint), [&] {
        model::Decoder loaded =
            model::LoadCheckpoint(checkpoint, {options->device, options->dtype});
        // Distributions over the tokenizer.json's ids only: padded embedding
        // rows get no mass in Score and are never generated
        // (docs/algorithms.md). kappa's toy checkpoints carry no tokenizer
        // files: every row, as before.
        if (model::HfTokenizer::Exists(checkpoint)) {
          options->service.vocab_limit = model::VocabLimit(
              loaded->config(), model::HfTokenizer::Load(checkpoint).vocab_size());
        }
        return loaded;
      }));
  services::ReleaseFreedHeap();  // the checkpoint's and tokenizer's load buffers
  const model::ModelConfig& config = decoder->config();
  options->service.model_name = config.name.empty() ? checkpoint : config.name;
  spdlog::info(
      "loaded teacher '{}' from {} on {} in {}: vocab {} (scores ids below {}), {} "
      "layers, hidden {}",
      options->service.model_name, checkpoint, options->device.str(), c10::toString(options->dtype),
      config.vocab_size,
      options->service.vocab_limit > 0 ? options->service.vocab_limit : config.vocab_size,
      config.num_hidden_layers, config.hidden_size);
  return decoder;
}

// The gRPC server for `service` on options.address.
absl::StatusOr<std::unique_ptr<services::GrpcServer>> StartServer(
    const TeacherServerOptions& options, TeacherService* service) {
  absl::StatusOr<std::unique_ptr<services::GrpcServer>> server =
      services::GrpcServer::Start(options.address, {service}, options.server);
  if (!server.ok()) {
    return absl::Status(server.status().code(), absl::StrCat("cannot serve on ", options.address,
                                                             ": ", server.status().message()));
  }
  spdlog::info("teacher serving on {} (port {}, {}), max_batch_sequences {}, max_wait {} ms",
               options.address, (*server)->port(),
               services::DescribeTransport(options.server.security),
               options.service.batching.max_batch_sequences,
               absl::ToInt64Milliseconds(options.service.batching.max_wait));
  return server;
}

// Drains first so in-flight Score calls still get their batch, then stops
// the batcher (anything left gets UNAVAILABLE).
void Drain(services::GrpcServer* server, TeacherService* service) {
  spdlog::info("teacher: termination signal, shutting down");
  server->Shutdown(absl::Milliseconds(1500));
  service->Shutdown();
  const DynamicBatcherStats stats = service->batcher_stats();
  spdlog::info("teacher: stopped after {} batches, {} sequences (largest batch {})", stats.batches,
               stats.sequences, stats.largest_batch);
}

absl::Status Serve(const CommonFlags& flags) {
  absl::StatusOr<services::Config> config = services::LoadConfigFromFlags(flags);
  if (!config.ok()) return ConfigurationError(config.status());
  services::InitLogging("teacher", flags.log_file);
  services::ConfigureTorchThreads(config->teacher.threads);
  services::ReturnLargeBuffersToTheSystem();
  KAPPA_ASSIGN_OR_RETURN(TeacherServerOptions options,
                         TeacherServerOptionsFromConfig(*config, flags));
  KAPPA_ASSIGN_OR_RETURN(model::Decoder model, LoadTeacherModel(&options));

  services::metrics::Registry registry;
  TeacherMetrics metrics(registry);
  KAPPA_ASSIGN_OR_RETURN(std::unique_ptr<TeacherService> service,
                         TeacherService::Create(model, options.service, &metrics));
  // The batcher's queue is read at scrape time; the metrics server (declared
  // after `service`) stops before the service goes away.
  registry.AddCollectHook(
      [&] { metrics.SetQueueDepth(service->batcher_stats().queued_sequences); });
  KAPPA_ASSIGN_OR_RETURN(
      std::unique_ptr<services::metrics::MetricsServer> metrics_server,
      services::metrics::ServeMetricsIfRequested(flags.metrics_address, &registry));
  KAPPA_ASSIGN_OR_RETURN(std::unique_ptr<services::GrpcServer> server,
                         StartServer(options, service.get()));
  KAPPA_RETURN_IF_ERROR(services::WriteReadyFile(
      flags.ready_file, {getpid(), services::WithPort(options.address, server->port()),
                         services::metrics::BoundAddress(metrics_server.get())}));

  services::WaitForTerminationSignal();
  Drain(server.get(), service.get());
  return absl::OkStatus();
}

}  // namespace
}  // namespace kappa::teacher

int main(int argc, char** argv) {
  return kappa::services::ServiceMain(
      argc, argv,
      {"kappa-teacher",
       "  --checkpoint DIR       teacher checkpoint dir (overrides teacher.checkpoint)\n",
       {"checkpoint"},
       kappa::teacher::Serve});
}
