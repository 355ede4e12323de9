// kappa-teacher: serves kappa.v1.Teacher for one checkpoint.
//
//   kappa-teacher --config FILE [key=value ...] [--checkpoint DIR] [--address HOST:PORT]
//                 [--metrics-address HOST:PORT] [--log-file FILE]
//   kappa-teacher --health-check HOST:PORT
//
// Serves until SIGTERM/SIGINT, then drains in-flight calls and exits within 2 s.
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

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
#include "services/torch_runtime.h"
#include "teacher_server/teacher_service.h"

namespace {

constexpr char kExtraUsage[] = "  --checkpoint DIR       teacher checkpoint dir (overrides teacher.checkpoint)\n";

int Serve(const kappa::services::CommonFlags& flags) {
  absl::StatusOr<kappa::services::Config> config = kappa::services::LoadConfigFromFlags(flags);
  if (!config.ok()) {
    std::fprintf(stderr, "kappa-teacher: %s\n", config.status().ToString().c_str());
    return 2;
  }
  kappa::services::InitLogging("teacher", flags.log_file);
  kappa::services::ConfigureTorchThreads(config->teacher.threads);
  kappa::services::ReturnLargeBuffersToTheSystem();

  auto flag = flags.extra.find("checkpoint");
  std::string checkpoint = flag != flags.extra.end() ? flag->second : "";
  if (checkpoint.empty()) checkpoint = kappa::services::TeacherModelDir(*config);
  const std::string address = flags.address.empty() ? config->teacher.address : flags.address;

  kappa::teacher::TeacherOptions options;
  options.batching.max_batch_sequences = config->teacher.max_batch_sequences;
  options.batching.max_wait = absl::Milliseconds(config->teacher.max_wait_ms);
  options.batching.max_queued_sequences = 64 * config->teacher.max_batch_sequences;

  kappa::services::metrics::Registry registry;
  kappa::teacher::TeacherMetrics metrics(registry);
  absl::StatusOr<torch::Device> device =
      kappa::services::ResolveDevice(config->teacher.device, "teacher.device");
  if (!device.ok()) {
    spdlog::error("teacher: {}", device.status().ToString());
    return 2;
  }
  const torch::ScalarType dtype =
      kappa::services::ResolveModelDtype(config->teacher.dtype, *device);
  absl::StatusOr<kappa::model::Decoder> model =
      kappa::base::CaptureExceptions(absl::StrCat("cannot load checkpoint ", checkpoint), [&] {
        kappa::model::Decoder decoder = kappa::model::LoadCheckpoint(checkpoint, {*device, dtype});
        // Distributions over the tokenizer.json's ids only: padded embedding
        // rows get no mass in Score and are never generated
        // (docs/algorithms.md). kappa's toy checkpoints carry no tokenizer
        // files: every row, as before.
        if (kappa::model::HfTokenizer::Exists(checkpoint)) {
          options.vocab_limit = kappa::model::VocabLimit(
              decoder->config(), kappa::model::HfTokenizer::Load(checkpoint).vocab_size());
        }
        return decoder;
      });
  if (!model.ok()) {
    spdlog::error("teacher: {}", std::string(model.status().message()));
    return 1;
  }
  kappa::services::ReleaseFreedHeap();  // the checkpoint's and tokenizer's load buffers
  const kappa::model::ModelConfig& model_config = (*model)->config();
  options.model_name = model_config.name.empty() ? checkpoint : model_config.name;
  spdlog::info(
      "loaded teacher '{}' from {} on {} in {}: vocab {} (scores ids below {}), {} "
      "layers, hidden {}",
      options.model_name, checkpoint, device->str(), c10::toString(dtype), model_config.vocab_size,
      options.vocab_limit > 0 ? options.vocab_limit : model_config.vocab_size,
      model_config.num_hidden_layers, model_config.hidden_size);
  absl::StatusOr<std::unique_ptr<kappa::teacher::TeacherService>> created =
      kappa::teacher::TeacherService::Create(*model, options, &metrics);
  if (!created.ok()) {
    spdlog::error("teacher: {}", created.status().ToString());
    return 1;
  }
  std::unique_ptr<kappa::teacher::TeacherService> service = std::move(*created);

  // The batcher's queue is read at scrape time; the metrics server (declared
  // after `service`) stops before the service goes away.
  registry.AddCollectHook(
      [&] { metrics.SetQueueDepth(service->batcher_stats().queued_sequences); });
  absl::StatusOr<std::unique_ptr<kappa::services::metrics::MetricsServer>> metrics_server =
      kappa::services::metrics::ServeMetricsIfRequested(flags.metrics_address, &registry);
  if (!metrics_server.ok()) {
    spdlog::error("teacher: {}", metrics_server.status().ToString());
    return 1;
  }
  absl::StatusOr<kappa::services::ServerOptions> server_options =
      kappa::services::ServerOptionsFromConfig(*config);
  if (!server_options.ok()) {
    spdlog::error("{}", server_options.status().ToString());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<kappa::services::GrpcServer>> server =
      kappa::services::GrpcServer::Start(address, {service.get()}, *server_options);
  if (!server.ok()) {
    spdlog::error("teacher: cannot serve on {}: {}", address, server.status().ToString());
    return 1;
  }
  spdlog::info("teacher serving on {} (port {}, {}), max_batch_sequences {}, max_wait {} ms",
               address, (*server)->port(),
               kappa::services::DescribeTransport(server_options->security),
               options.batching.max_batch_sequences, config->teacher.max_wait_ms);
  if (absl::Status ready = kappa::services::WriteReadyFile(
          flags.ready_file, {getpid(), kappa::services::WithPort(address, (*server)->port()),
                             kappa::services::metrics::BoundAddress(metrics_server->get())});
      !ready.ok()) {
    spdlog::error("teacher: {}", ready.ToString());
    return 1;
  }

  kappa::services::WaitForTerminationSignal();
  spdlog::info("teacher: termination signal, shutting down");
  // Drain first so in-flight Score calls still get their batch, then stop
  // the batcher (anything left gets UNAVAILABLE).
  (*server)->Shutdown(absl::Milliseconds(1500));
  service->Shutdown();
  const kappa::teacher::DynamicBatcherStats stats = service->batcher_stats();
  spdlog::info("teacher: stopped after {} batches, {} sequences (largest batch {})", stats.batches,
               stats.sequences, stats.largest_batch);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything slow (checkpoint loading), so an early SIGTERM is handled.
  kappa::services::InstallTerminationHandlers();
  absl::StatusOr<kappa::services::CommonFlags> flags =
      kappa::services::ParseCommonFlags(argc, argv, {"checkpoint"});
  if (!flags.ok()) {
    std::fprintf(stderr, "kappa-teacher: %s\n%s", std::string(flags.status().message()).c_str(),
                 kappa::services::Usage("kappa-teacher", kExtraUsage).c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(kappa::services::Usage("kappa-teacher", kExtraUsage).c_str(), stdout);
    return 0;
  }
  if (!flags->health_check_address.empty()) {
    return kappa::services::RunHealthCheck(*flags);
  }
  return Serve(*flags);
}
