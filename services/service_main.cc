#include "services/service_main.h"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "absl/strings/cord.h"
#include "services/server.h"

namespace kappa::services {
namespace {

// The payload that marks a configuration error (absl::Status payloads are
// keyed by a type URL).
constexpr char kConfigurationErrorUrl[] = "type.kappa.dev/ConfigurationError";

}  // namespace

absl::Status ConfigurationError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kConfigurationErrorUrl, absl::Cord("1"));
  return status;
}

bool IsConfigurationError(const absl::Status& status) {
  return status.GetPayload(kConfigurationErrorUrl).has_value();
}

int ExitCodeFor(const absl::Status& status, const std::string& program) {
  if (status.ok()) return 0;
  spdlog::error("{}: {}", program, status.ToString(absl::StatusToStringMode::kWithNoExtraData));
  return IsConfigurationError(status) ? 2 : 1;
}

int ServiceMain(int argc, char** argv, const ServiceBinary& binary) {
  InstallTerminationHandlers();
  absl::StatusOr<CommonFlags> flags = ParseCommonFlags(argc, argv, binary.extra_flags);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s: %s\n%s", binary.program.c_str(),
                 std::string(flags.status().message()).c_str(),
                 Usage(binary.program, binary.extra_usage).c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(Usage(binary.program, binary.extra_usage).c_str(), stdout);
    return 0;
  }
  if (!flags->health_check_address.empty()) return RunHealthCheck(*flags);
  return ExitCodeFor(binary.serve(*flags), binary.program);
}

}  // namespace kappa::services
