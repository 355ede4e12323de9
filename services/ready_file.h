// How a service tells whoever started it where it listens. A supervisor
// (`kappa run`) starts each child with --address HOST:0 and
// --metrics-address HOST:0 and --ready-file FILE; the child binds, reads the
// ports the kernel chose, and writes them to FILE. No port is ever picked by
// one process and bound by another, so nothing can take it in between.
//
// The file is one JSON object, written atomically (a reader sees all of it or
// none), once, after every listener of the process is bound:
//   {"pid": 1234, "address": "127.0.0.1:40123", "metrics_address": "127.0.0.1:40124"}
// "address" is empty for a process without a gRPC server (a rollout worker),
// "metrics_address" empty when no /metrics endpoint was asked for.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kappa::services {

struct ReadyInfo {
  int64_t pid = 0;
  std::string address;          // host:port the gRPC server listens on; "" if none
  std::string metrics_address;  // host:port of /metrics; "" if none
};

// `address` with its port replaced by `port`: ("127.0.0.1:0", 4012) ->
// "127.0.0.1:4012", ("[::]:0", 7) -> "[::]:7". An address without a port
// gets ":port" appended.
std::string WithPort(const std::string& address, int port);

// Writes `info` to `path` atomically (services/atomic_file.h). Does nothing
// when `path` is empty (no --ready-file given). INTERNAL naming the file when
// it cannot be written.
absl::Status WriteReadyFile(const std::string& path, const ReadyInfo& info);

// NOT_FOUND while the file does not exist (the process has not bound yet);
// DATA_LOSS naming the file when it is not what WriteReadyFile writes.
absl::StatusOr<ReadyInfo> ReadReadyFile(const std::string& path);

}  // namespace kappa::services
