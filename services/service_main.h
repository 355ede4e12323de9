// The one edge between a service binary and its process: main() calls
// ServiceMain, which parses the flags, answers --help and --health-check,
// runs the binary's Serve and turns the status Serve returns into the exit
// code. Serve itself only returns statuses; nothing below it prints an
// error and picks an exit code.
//
// Exit codes, the same for every binary (tests and `kappa run` read them):
//   0  Serve returned OK (it served until SIGTERM/SIGINT and drained)
//   2  a usage or configuration error: bad flags, or a status Serve marked
//      with ConfigurationError (a bad key, device, TLS file, ...)
//   1  anything else (a checkpoint that does not load, a port in use, ...)
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/cli_flags.h"

namespace kappa::services {

// `status` marked as a configuration error (exit code 2); OK stays OK.
absl::Status ConfigurationError(absl::Status status);
bool IsConfigurationError(const absl::Status& status);

// The exit code of a Serve status (the table above). Logs a non-OK status
// as "<program>: <status>" on the current spdlog logger.
int ExitCodeFor(const absl::Status& status, const std::string& program);

struct ServiceBinary {
  std::string program;                   // "kappa-teacher": usage and messages
  std::string extra_usage;               // Usage() lines of its own flags
  std::vector<std::string> extra_flags;  // their names, without "--"
  // Serves until a termination signal; REQUIRES: the termination handlers
  // are installed (ServiceMain does so first).
  std::function<absl::Status(const CommonFlags&)> serve;
};

// Installs the termination handlers (before anything slow, so an early
// SIGTERM is handled), parses argv, then --help (usage on stdout, 0),
// --health-check (RunHealthCheck's code) or binary.serve. Returns the exit
// code.
int ServiceMain(int argc, char** argv, const ServiceBinary& binary);

}  // namespace kappa::services
