// Free TCP ports and addresses for the services of a loopback run.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace kappa::cli {

// Binds port 0 on `host`, reads the port the kernel chose, closes the socket.
// Another socket can take the port before anyone binds it again, so `kappa
// run` lets each service bind port 0 itself (services/ready_file.h); this is
// left only for the data-parallel store, whose address every rank must know
// before any of them starts. A lost race shows up as rank 0 failing to start,
// which `kappa run` reports.
absl::StatusOr<int> PickFreePort(const std::string& host);

// "host:port" -> port, or -1 when the address has no numeric port.
int PortOf(const std::string& address);

// The address to connect to for a listen address: a wildcard bind address
// ("0.0.0.0:P", "[::]:P") becomes "127.0.0.1:P"; anything else is kept.
std::string ConnectAddress(const std::string& address);

}  // namespace kappa::cli
