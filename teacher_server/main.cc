// kappa-teacher: serves kappa.v1.Teacher for one checkpoint.
//
//   kappa-teacher --config FILE [key=value ...] [--checkpoint DIR] [--address HOST:PORT]
//                 [--log-file FILE]
//   kappa-teacher --health-check HOST:PORT
//
// Serves until SIGTERM/SIGINT, then drains in-flight calls and exits within 2 s.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <exception>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "model/checkpoint.h"
#include "services/config.h"
#include "services/logging.h"
#include "services/server.h"
#include "services/torch_runtime.h"
#include "teacher_server/teacher_service.h"

namespace {

constexpr char kUsage[] =
    "usage: kappa-teacher --config FILE [key=value ...] [--checkpoint DIR] [--address HOST:PORT]\n"
    "                     [--log-file FILE]\n"
    "       kappa-teacher --health-check HOST:PORT\n";

struct Flags {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string checkpoint;
  std::string address;
  std::string log_file;
  std::string health_check;
};

// Accepts "--flag value" and "--flag=value"; bare "key=value" words are
// config overrides. Returns false (after printing why) on anything else.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  const std::vector<std::pair<std::string, std::string*>> known = {
      {"--config", &flags->config_path},   {"--checkpoint", &flags->checkpoint},
      {"--address", &flags->address},      {"--log-file", &flags->log_file},
      {"--health-check", &flags->health_check}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    bool matched = false;
    for (const auto& [name, target] : known) {
      if (arg == name) {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "kappa-teacher: %s needs a value\n%s", name.c_str(), kUsage);
          return false;
        }
        *target = argv[++i];
        matched = true;
      } else if (absl::StartsWith(arg, name + "=")) {
        *target = arg.substr(name.size() + 1);
        matched = true;
      }
      if (matched) break;
    }
    if (matched) continue;
    if (!absl::StartsWith(arg, "-") && arg.find('=') != std::string::npos) {
      flags->overrides.push_back(arg);
      continue;
    }
    std::fprintf(stderr, "kappa-teacher: unknown argument '%s'\n%s", arg.c_str(), kUsage);
    return false;
  }
  return true;
}

int HealthCheck(const std::string& address) {
  const absl::Status status = kappa::services::CheckHealth(address, absl::Seconds(5));
  if (status.ok()) {
    std::printf("SERVING\n");
    return 0;
  }
  std::fprintf(stderr, "NOT SERVING: %s\n", status.ToString().c_str());
  return 1;
}

int Serve(const Flags& flags) {
  absl::StatusOr<kappa::services::Config> config =
      flags.config_path.empty()
          ? kappa::services::ParseConfig("{}", "<defaults>", flags.overrides)
          : kappa::services::LoadConfig(flags.config_path, flags.overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "kappa-teacher: %s\n", config.status().ToString().c_str());
    return 2;
  }
  kappa::services::InitLogging("teacher", flags.log_file);
  kappa::services::ConfigureTorchThreads(config->teacher.threads);

  std::string checkpoint = flags.checkpoint;
  if (checkpoint.empty()) checkpoint = config->teacher.checkpoint;
  if (checkpoint.empty()) checkpoint = config->data_dir + "/teacher";  // the bootstrap's place
  const std::string address = flags.address.empty() ? config->teacher.address : flags.address;

  kappa::teacher::TeacherOptions options;
  options.batching.max_batch_sequences = config->teacher.max_batch_sequences;
  options.batching.max_wait = absl::Milliseconds(config->teacher.max_wait_ms);
  options.batching.max_queued_sequences = 64 * config->teacher.max_batch_sequences;

  std::unique_ptr<kappa::teacher::TeacherService> service;
  try {
    kappa::model::Decoder model = kappa::model::LoadCheckpoint(checkpoint);
    options.model_name = model->config().name.empty() ? checkpoint : model->config().name;
    spdlog::info("loaded teacher '{}' from {}: vocab {}, {} layers, hidden {}",
                 options.model_name, checkpoint, model->config().vocab_size,
                 model->config().num_hidden_layers, model->config().hidden_size);
    absl::StatusOr<std::unique_ptr<kappa::teacher::TeacherService>> created =
        kappa::teacher::TeacherService::Create(model, options);
    if (!created.ok()) {
      spdlog::error("teacher: {}", created.status().ToString());
      return 1;
    }
    service = std::move(*created);
  } catch (const std::exception& e) {
    spdlog::error("teacher: cannot load checkpoint {}: {}", checkpoint, e.what());
    return 1;
  }

  absl::StatusOr<std::unique_ptr<kappa::services::GrpcServer>> server =
      kappa::services::GrpcServer::Start(address, {service.get()});
  if (!server.ok()) {
    spdlog::error("teacher: cannot serve on {}: {}", address, server.status().ToString());
    return 1;
  }
  spdlog::info("teacher serving on {} (port {}), max_batch_sequences {}, max_wait {} ms", address,
               (*server)->port(), options.batching.max_batch_sequences,
               config->teacher.max_wait_ms);

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
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  if (!flags.health_check.empty()) return HealthCheck(flags.health_check);
  return Serve(flags);
}
