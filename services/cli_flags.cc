#include "services/cli_flags.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "services/server.h"

namespace kappa::services {
namespace {

// Shared flags that take a value, and where each one goes.
std::string* ValueFlag(const std::string& name, CommonFlags* flags) {
  if (name == "config") return &flags->config_path;
  if (name == "address") return &flags->address;
  if (name == "metrics-address") return &flags->metrics_address;
  if (name == "log-file") return &flags->log_file;
  if (name == "ready-file") return &flags->ready_file;
  if (name == "health-check") return &flags->health_check_address;
  return nullptr;
}

}  // namespace

absl::StatusOr<CommonFlags> ParseCommonFlags(int argc, const char* const* argv,
                                             const std::vector<std::string>& extra_flags) {
  CommonFlags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      if (arg.find('=') == std::string::npos || arg.front() == '=') {
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected argument '", arg, "' (overrides are key=value)"));
      }
      flags.overrides.push_back(arg);
      continue;
    }
    const size_t equals = arg.find('=');
    const std::string name = arg.substr(2, equals == std::string::npos ? equals : equals - 2);
    std::string* destination = ValueFlag(name, &flags);
    if (destination == nullptr &&
        std::find(extra_flags.begin(), extra_flags.end(), name) != extra_flags.end()) {
      destination = &flags.extra[name];
    }
    if (destination == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '--", name, "'"));
    }
    if (equals != std::string::npos) {
      *destination = arg.substr(equals + 1);
    } else if (i + 1 < argc) {
      *destination = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag '--", name, "' needs a value"));
    }
  }
  return flags;
}

absl::StatusOr<Config> LoadConfigFromFlags(const CommonFlags& flags) {
  absl::StatusOr<std::vector<std::string>> overrides =
      WithEnvironmentOverrides(flags.overrides, environ);
  if (!overrides.ok()) return overrides.status();
  if (flags.config_path.empty()) return ParseConfig("", "<defaults>", *overrides);
  return LoadConfig(flags.config_path, *overrides);
}

std::string Usage(const std::string& program, const std::string& extra_usage) {
  return absl::StrCat(
      "usage: ", program, " [--config FILE] [key=value ...] [flags]\n",
      "  --config FILE          run configuration (YAML); defaults when absent\n",
      "  key=value              override a config key, e.g. trainer.steps=20\n",
      "  --address HOST:PORT    listen/connect address (overrides the config)\n",
      "  --metrics-address HOST:PORT  serve Prometheus /metrics there\n",
      "  --log-file FILE        also append logs to FILE\n",
      "  --ready-file FILE      once listening, write the bound addresses there (JSON)\n",
      "  --health-check ADDR    probe grpc.health.v1 at ADDR; exit 0 if SERVING\n", extra_usage,
      extra_usage.empty() || extra_usage.back() == '\n' ? "" : "\n",
      "  --help                 this text\n");
}

int RunHealthCheck(const CommonFlags& flags, absl::Duration timeout) {
  // The configuration only for its security section: a probe of a TLS server
  // needs the CA (and under mutual TLS a client certificate) and the token.
  absl::StatusOr<Config> config = LoadConfigFromFlags(flags);
  if (!config.ok()) {
    std::cerr << config.status().message() << std::endl;
    return 2;
  }
  absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(config->security);
  if (!security.ok()) {
    std::cerr << security.status().message() << std::endl;
    return 2;
  }
  const std::string& address = flags.health_check_address;
  const absl::Status status = CheckHealth(address, timeout, *security);
  if (!status.ok()) {
    std::cerr << status.message() << std::endl;
    return 1;
  }
  std::cout << address << ": SERVING" << std::endl;
  return 0;
}

}  // namespace kappa::services
