// kappa-verifier: serves kappa.v1.Verifier and grpc.health.v1 until SIGTERM.
//
//   kappa-verifier [--config FILE] [key=value ...] [--address HOST:PORT]
//                  [--metrics-address HOST:PORT] [--log-file FILE]
//                  [--health-check ADDR] [--code-* VALUE ...]
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/cli_flags.h"
#include "services/config.h"
#include "services/logging.h"
#include "services/metrics.h"
#include "services/metrics_server.h"
#include "services/ready_file.h"
#include "services/server.h"
#include "verifier/verifier_service.h"

namespace {

// The code sandbox's settings are flags rather than config keys (the config
// schema is shared by every process); defaults suit the demo machine.
constexpr char kExtraUsage[] =
    "  --code-enabled true|false   score \"code\" items in the sandbox (default true)\n"
    "  --code-max-concurrent N     sandboxes at once (default: hardware threads)\n"
    "  --code-cpu-seconds N        RLIMIT_CPU per run (default 5)\n"
    "  --code-wall-seconds N       wall-clock timeout per run (default 10)\n"
    "  --code-memory-mb N          RLIMIT_AS per run (default 1024)\n"
    "  --code-python PATH          interpreter (default /usr/bin/python3)\n"
    "  --code-work-root DIR        where run dirs are made (default $TMPDIR or /tmp)\n";
const std::vector<std::string> kExtraFlags = {
    "code-enabled",   "code-max-concurrent", "code-cpu-seconds", "code-wall-seconds",
    "code-memory-mb", "code-python",         "code-work-root"};

absl::Status ApplyCodeFlags(const std::map<std::string, std::string>& extra,
                            kappa::verifier::CodeOptions* code) {
  for (const auto& [name, value] : extra) {
    int64_t number = 0;
    const bool numeric = absl::SimpleAtoi(value, &number) && number > 0;
    // Named captures: clang (before C++20) cannot capture structured bindings.
    auto need_number = [&name = name, &value = value]() {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected a positive integer, got '", value, "'"));
    };
    if (name == "code-enabled") {
      if (!absl::SimpleAtob(value, &code->enabled)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--code-enabled: expected true or false, got '", value, "'"));
      }
    } else if (name == "code-python") {
      code->sandbox.python = value;
    } else if (name == "code-work-root") {
      code->sandbox.work_root = value;
    } else if (!numeric) {
      return need_number();
    } else if (name == "code-max-concurrent") {
      code->max_concurrent = static_cast<int>(number);
    } else if (name == "code-cpu-seconds") {
      code->sandbox.cpu_seconds = static_cast<int>(number);
    } else if (name == "code-wall-seconds") {
      code->sandbox.wall_timeout = absl::Seconds(number);
    } else if (name == "code-memory-mb") {
      code->sandbox.address_space_bytes = number << 20;
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  namespace services = kappa::services;
  services::InstallTerminationHandlers();
  absl::StatusOr<services::CommonFlags> flags =
      services::ParseCommonFlags(argc, argv, kExtraFlags);
  kappa::verifier::VerifierOptions options;
  if (flags.ok()) {
    if (absl::Status status = ApplyCodeFlags(flags->extra, &options.code); !status.ok()) {
      flags = status;
    }
  }
  if (!flags.ok()) {
    std::cerr << flags.status().message() << "\n"
              << services::Usage("kappa-verifier", kExtraUsage);
    return 2;
  }
  if (flags->help) {
    std::cout << services::Usage("kappa-verifier", kExtraUsage);
    return 0;
  }
  if (!flags->health_check_address.empty()) {
    return services::RunHealthCheck(*flags);
  }

  services::InitLogging("verifier", flags->log_file);
  absl::StatusOr<services::Config> config = services::LoadConfigFromFlags(*flags);
  if (!config.ok()) {
    spdlog::error("{}", config.status().ToString());
    return 2;
  }
  const std::string address = flags->address.empty() ? config->verifier.address : flags->address;

  if (absl::Status status = kappa::verifier::ApplyVerifierConfig(*config, &options); !status.ok()) {
    spdlog::error("{}", status.ToString());
    return 2;
  }
  services::metrics::Registry registry;
  kappa::verifier::VerifierMetrics metrics(registry);
  kappa::verifier::VerifierService service(options, &metrics);
  absl::StatusOr<std::unique_ptr<services::metrics::MetricsServer>> metrics_server =
      services::metrics::ServeMetricsIfRequested(flags->metrics_address, &registry);
  if (!metrics_server.ok()) {
    spdlog::error("{}", metrics_server.status().ToString());
    return 1;
  }
  absl::StatusOr<services::ServerOptions> server_options =
      services::ServerOptionsFromConfig(*config);
  if (!server_options.ok()) {
    spdlog::error("{}", server_options.status().ToString());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<services::GrpcServer>> server =
      services::GrpcServer::Start(address, {&service}, *server_options);
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  spdlog::info("serving kappa.v1.Verifier on {} (port {}, {}, max_items {})", address,
               (*server)->port(), services::DescribeTransport(server_options->security),
               config->verifier.max_items);
  if (absl::Status ready = services::WriteReadyFile(
          flags->ready_file, {getpid(), services::WithPort(address, (*server)->port()),
                              services::metrics::BoundAddress(metrics_server->get())});
      !ready.ok()) {
    spdlog::error("{}", ready.ToString());
    return 1;
  }
  if (options.reward_family.has_value()) {
    spdlog::info("every item is scored as task family '{}' (verifier.reward: {})",
                 *options.reward_family, config->verifier.reward);
  }

  services::WaitForTerminationSignal();
  spdlog::info("termination requested; shutting down");
  (*server)->Shutdown();
  spdlog::info("stopped");
  return 0;
}
