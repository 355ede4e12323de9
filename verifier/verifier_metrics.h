// The verifier's Prometheus metrics (docs/metrics.md): requests, how long
// scoring took, and how many rewards of each value it gave.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/metrics.h"

namespace kappa::verifier {

class VerifierMetrics {
 public:
  explicit VerifierMetrics(services::metrics::Registry& registry);

  // One Verify call: its handling time and its outcome (rewards, or the
  // INVALID_ARGUMENT that rejected it).
  void RecordRequest(double seconds, const absl::StatusOr<std::vector<float>>& rewards);
  // One sandboxed code run: its outcome ("pass", "fail", "timeout", "killed",
  // "error"; verifier/sandbox.h) and wall time.
  void RecordSandboxRun(std::string_view outcome, double seconds);

 private:
  services::metrics::Registry& registry_;
  services::metrics::Counter& requests_;
  services::metrics::Counter& rejected_;
  services::metrics::Histogram& verify_seconds_;
  services::metrics::Histogram& sandbox_seconds_;
};

}  // namespace kappa::verifier
