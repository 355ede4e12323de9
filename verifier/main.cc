// kappa-verifier: serves kappa.v1.Verifier and grpc.health.v1 until SIGTERM.
//
//   kappa-verifier [--config FILE] [key=value ...] [--address HOST:PORT]
//                  [--metrics-address HOST:PORT] [--log-file FILE]
//                  [--health-check ADDR]
#include <iostream>

#include <spdlog/spdlog.h>

#include "services/cli_flags.h"
#include "services/config.h"
#include "services/logging.h"
#include "services/metrics.h"
#include "services/metrics_server.h"
#include "services/server.h"
#include "verifier/verifier_service.h"

int main(int argc, char** argv) {
  namespace services = kappa::services;
  services::InstallTerminationHandlers();
  absl::StatusOr<services::CommonFlags> flags = services::ParseCommonFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << flags.status().message() << "\n" << services::Usage("kappa-verifier");
    return 2;
  }
  if (flags->help) {
    std::cout << services::Usage("kappa-verifier");
    return 0;
  }
  if (!flags->health_check_address.empty()) {
    return services::RunHealthCheck(flags->health_check_address);
  }

  services::InitLogging("verifier", flags->log_file);
  absl::StatusOr<services::Config> config = services::LoadConfigFromFlags(*flags);
  if (!config.ok()) {
    spdlog::error("{}", config.status().ToString());
    return 2;
  }
  const std::string address = flags->address.empty() ? config->verifier.address : flags->address;

  kappa::verifier::VerifierOptions options;
  options.max_items = config->verifier.max_items;
  services::metrics::Registry registry;
  kappa::verifier::VerifierMetrics metrics(registry);
  kappa::verifier::VerifierService service(options, &metrics);
  absl::StatusOr<std::unique_ptr<services::metrics::MetricsServer>> metrics_server =
      services::metrics::ServeMetricsIfRequested(flags->metrics_address, &registry);
  if (!metrics_server.ok()) {
    spdlog::error("{}", metrics_server.status().ToString());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<services::GrpcServer>> server =
      services::GrpcServer::Start(address, {&service});
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  spdlog::info("serving kappa.v1.Verifier on {} (port {}, max_items {})", address,
               (*server)->port(), config->verifier.max_items);

  services::WaitForTerminationSignal();
  spdlog::info("termination requested; shutting down");
  (*server)->Shutdown();
  spdlog::info("stopped");
  return 0;
}
