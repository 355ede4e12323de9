// kappa-verifier: serves kappa.v1.Verifier and grpc.health.v1 until SIGTERM.
//
//   kappa-verifier [--config FILE] [key=value ...] [--address HOST:PORT]
//                  [--metrics-address HOST:PORT] [--log-file FILE]
//                  [--health-check ADDR] [--enable-code [--allow-weak-sandbox]
//                  [--code-tasks FILE[,FILE...]] [--code-* VALUE ...]]
//
// Exit codes (services/service_main.h): 2 for a bad flag, key or TLS
// setting; 1 when a port cannot be served or the ready file written.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "services/cli_flags.h"
#include "services/config.h"
#include "services/logging.h"
#include "services/metrics.h"
#include "services/metrics_server.h"
#include "services/ready_file.h"
#include "services/server.h"
#include "services/service_main.h"
#include "tasks/answer.h"
#include "tasks/from_config.h"
#include "verifier/code_tasks.h"
#include "verifier/verifier_service.h"

namespace kappa::verifier {
namespace {

using services::CommonFlags;
using services::ConfigurationError;

// The code sandbox's settings are flags rather than config keys (the config
// schema is shared by every process); defaults suit the demo machine.
constexpr char kExtraUsage[] =
    "  --enable-code               score \"code\" items: run model-written Python in the\n"
    "                              sandbox (default off; needs root, see docs/security.md)\n"
    "  --allow-weak-sandbox        with --enable-code: start even when the sandbox lacks\n"
    "                              full isolation (not root, no namespaces, no cgroups)\n"
    "  --code-tasks FILE[,FILE]    JSONL task files (the learner's, read with the task.*\n"
    "                              keys): code items run these tests, by example_id\n"
    "  --code-max-concurrent N     sandboxes at once (default: hardware threads)\n"
    "  --code-cpu-seconds N        RLIMIT_CPU per run (default 5)\n"
    "  --code-wall-seconds N       wall-clock timeout per run (default 10)\n"
    "  --code-memory-mb N          RLIMIT_AS per process (default 1024)\n"
    "  --code-run-memory-mb N      cgroup memory.max per run, all processes (default 1024)\n"
    "  --code-request-seconds N    per-request budget: code items x wall timeout\n"
    "                              (default 1200; over it RESOURCE_EXHAUSTED)\n"
    "  --code-python PATH          interpreter (default /usr/bin/python3)\n"
    "  --code-work-root DIR        where run dirs are made (default $TMPDIR or /tmp)\n";
const std::vector<std::string> kExtraFlags = {
    "enable-code",         "allow-weak-sandbox", "code-tasks",        "code-enabled",
    "code-max-concurrent", "code-cpu-seconds",   "code-wall-seconds", "code-memory-mb",
    "code-run-memory-mb",  "code-python",        "code-work-root",    "code-request-seconds"};
// Flags without a value; main() turns "--flag" into "--flag=true" for the
// shared parser, which knows only value flags.
const std::vector<std::string> kSwitches = {"enable-code", "allow-weak-sandbox"};

absl::Status ApplyCodeFlags(const std::map<std::string, std::string>& extra, CodeOptions* code) {
  for (const auto& [name, value] : extra) {
    int64_t number = 0;
    const bool numeric = absl::SimpleAtoi(value, &number) && number > 0;
    // Named captures: clang (before C++20) cannot capture structured bindings.
    auto need_number = [&name = name, &value = value]() {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected a positive integer, got '", value, "'"));
    };
    if (name == "code-enabled") {
      // Code scoring used to be on by default; now it is opted into by name.
      return absl::InvalidArgumentError(
          "--code-enabled: removed; code scoring is off unless --enable-code is given");
    } else if (name == "enable-code" || name == "allow-weak-sandbox") {
      bool* flag = name == "enable-code" ? &code->enabled : &code->allow_weak_sandbox;
      if (!absl::SimpleAtob(value, flag)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, ": takes no value (or true/false), got '", value, "'"));
      }
    } else if (name == "code-tasks") {
      continue;  // read by LoadCodeTasks
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
    } else if (name == "code-run-memory-mb") {
      code->sandbox.run_memory_bytes = number << 20;
    } else if (name == "code-request-seconds") {
      code->max_request_sandbox_seconds = number;
    }
  }
  if (code->allow_weak_sandbox && !code->enabled) {
    return absl::InvalidArgumentError("--allow-weak-sandbox: only with --enable-code");
  }
  return absl::OkStatus();
}

// --code-tasks, read as the learner reads its task files (the config's
// task.* keys); null without the flag.
absl::StatusOr<std::shared_ptr<const CodeTasks>> LoadCodeTasks(
    const services::Config& config, const std::map<std::string, std::string>& extra,
    const VerifierOptions& service) {
  const auto flag = extra.find("code-tasks");
  if (flag == extra.end()) return nullptr;
  if (!service.code.enabled) {
    return absl::InvalidArgumentError("--code-tasks: only with --enable-code");
  }
  const bool all_are_code =
      service.reward_family.has_value() && tasks::IsCodeTask(*service.reward_family);
  KAPPA_ASSIGN_OR_RETURN(
      CodeTasks loaded,
      CodeTasks::Load(flag->second, tasks::JsonlOptionsFromConfig(config.task), all_are_code));
  spdlog::info("code tasks: {} from {}", loaded.size(), flag->second);
  return std::make_shared<const CodeTasks>(std::move(loaded));
}

// Everything the binary serves with, read from the configuration and flags.
struct VerifierServerOptions {
  std::string address;  // --address, else verifier.address
  VerifierOptions service;
  std::string reward;  // verifier.reward, for the start-up line
  services::ServerOptions server;
};

// The options for `config` and the --code-* flags; a bad flag, key or TLS
// setting is a ConfigurationError naming it.
absl::StatusOr<VerifierServerOptions> VerifierServerOptionsFromConfig(
    const services::Config& config, const CommonFlags& flags) {
  VerifierServerOptions options;
  options.address = flags.address.empty() ? config.verifier.address : flags.address;
  options.reward = config.verifier.reward;
  // The code options first: ApplyVerifierConfig checks verifier.reward against them.
  KAPPA_RETURN_IF_ERROR(ConfigurationError(ApplyCodeFlags(flags.extra, &options.service.code)));
  KAPPA_RETURN_IF_ERROR(ConfigurationError(ApplyVerifierConfig(config, &options.service)));
  absl::StatusOr<std::shared_ptr<const CodeTasks>> code_tasks =
      LoadCodeTasks(config, flags.extra, options.service);
  if (!code_tasks.ok()) return ConfigurationError(code_tasks.status());
  options.service.code_tasks = *std::move(code_tasks);
  absl::StatusOr<services::ServerOptions> server = services::ServerOptionsFromConfig(config);
  if (!server.ok()) return ConfigurationError(server.status());
  options.server = *std::move(server);
  // Tests sent by a caller run only when the server knows who calls.
  options.service.callers_authenticated = options.server.security.AuthenticatesClients();
  return options;
}

// The gRPC server for `service` on options.address.
absl::StatusOr<std::unique_ptr<services::GrpcServer>> StartServer(
    const VerifierServerOptions& options, VerifierService* service) {
  KAPPA_ASSIGN_OR_RETURN(std::unique_ptr<services::GrpcServer> server,
                         services::GrpcServer::Start(options.address, {service}, options.server));
  spdlog::info("serving kappa.v1.Verifier on {} (port {}, {}, max_items {})", options.address,
               server->port(), services::DescribeTransport(options.server.security),
               options.service.max_items);
  if (options.service.reward_family.has_value()) {
    spdlog::info("every item is scored as task family '{}' (verifier.reward: {})",
                 *options.service.reward_family, options.reward);
  }
  return server;
}

absl::Status Serve(const CommonFlags& flags) {
  services::InitLogging("verifier", flags.log_file);
  absl::StatusOr<services::Config> config = services::LoadConfigFromFlags(flags);
  if (!config.ok()) return ConfigurationError(config.status());
  KAPPA_ASSIGN_OR_RETURN(const VerifierServerOptions options,
                         VerifierServerOptionsFromConfig(*config, flags));

  services::metrics::Registry registry;
  VerifierMetrics metrics(registry);
  VerifierService service(options.service, &metrics);
  // --enable-code asked for the sandbox: one that cannot run, or that is
  // weaker than intended without --allow-weak-sandbox, stops the start.
  if (absl::Status code = service.CodeStatus(); !code.ok()) {
    return ConfigurationError(
        absl::FailedPreconditionError(absl::StrCat("--enable-code: ", code.message())));
  }
  KAPPA_ASSIGN_OR_RETURN(
      std::unique_ptr<services::metrics::MetricsServer> metrics_server,
      services::metrics::ServeMetricsIfRequested(flags.metrics_address, &registry));
  KAPPA_ASSIGN_OR_RETURN(std::unique_ptr<services::GrpcServer> server,
                         StartServer(options, &service));
  KAPPA_RETURN_IF_ERROR(services::WriteReadyFile(
      flags.ready_file, {getpid(), services::WithPort(options.address, server->port()),
                         services::metrics::BoundAddress(metrics_server.get())}));

  services::WaitForTerminationSignal();
  spdlog::info("termination requested; shutting down");
  server->Shutdown();
  spdlog::info("stopped");
  return absl::OkStatus();
}

}  // namespace
}  // namespace kappa::verifier

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& arg : args) {
    for (const std::string& name : kappa::verifier::kSwitches) {
      if (arg == "--" + name) arg += "=true";
    }
  }
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  return kappa::services::ServiceMain(argc, pointers.data(),
                                      {"kappa-verifier", kappa::verifier::kExtraUsage,
                                       kappa::verifier::kExtraFlags, kappa::verifier::Serve});
}
