// Command-line flags every kappa binary shares:
//
//   <binary> [--config FILE] [key=value ...] [--address HOST:PORT]
//            [--metrics-address HOST:PORT] [--log-file FILE]
//            [--ready-file FILE] [--health-check ADDR] [--help]
//
// plus any binary-specific `--name VALUE` flags it declares. Both "--flag
// VALUE" and "--flag=VALUE" are accepted; every bare "a.b=value" argument is a
// config override (services/config.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/config.h"

namespace kappa::services {

struct CommonFlags {
  std::string config_path;             // --config; empty: built-in defaults
  std::vector<std::string> overrides;  // "key=value" arguments, in order
  std::string address;                 // --address; empty: the config's address
  std::string metrics_address;         // --metrics-address; empty: no /metrics endpoint
  std::string log_file;                // --log-file; empty: stderr only
  std::string ready_file;              // --ready-file; services/ready_file.h
  std::string health_check_address;    // --health-check; non-empty: probe mode
  bool help = false;                   // --help / -h
  std::map<std::string, std::string> extra;  // binary-specific flags, name without "--"
};

// Parses argv[1..argc). `extra_flags` names additional value flags the binary
// accepts (without "--", e.g. {"rank", "world-size"}); they land in
// CommonFlags::extra. INVALID_ARGUMENT for unknown flags, missing values and
// positional arguments that are not key=value.
absl::StatusOr<CommonFlags> ParseCommonFlags(int argc, const char* const* argv,
                                             const std::vector<std::string>& extra_flags = {});

// LoadConfig(config_path, overrides), or the defaults plus overrides when no
// --config was given; KAPPA_CFG_* environment overrides (config.h) apply
// between the file and the command line.
absl::StatusOr<Config> LoadConfigFromFlags(const CommonFlags& flags);

// The usage text for `program`, listing the shared flags plus `extra_usage`
// lines (e.g. "  --rank N   data-parallel rank").
std::string Usage(const std::string& program, const std::string& extra_usage = "");

// `--health-check ADDR` mode: CheckHealth(flags.health_check_address) with
// the transport security of the configuration `flags` name; prints
// "ADDR: SERVING" to stdout or the reason to stderr, and returns the process
// exit code (0 when SERVING, 1 otherwise, 2 for a bad configuration).
int RunHealthCheck(const CommonFlags& flags, absl::Duration timeout = absl::Seconds(5));

}  // namespace kappa::services
