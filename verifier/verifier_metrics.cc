#include "verifier/verifier_metrics.h"

#include <string>

namespace kappa::verifier {
namespace {

constexpr char kRewardsHelp[] = "Rewards given, by value.";
constexpr char kSandboxRunsHelp[] = "Sandboxed code runs, by outcome.";

}  // namespace

VerifierMetrics::VerifierMetrics(services::metrics::Registry& registry)
    : registry_(registry),
      requests_(registry.GetCounter("kappa_verifier_requests_total", "Verify calls handled.")),
      rejected_(registry.GetCounter("kappa_verifier_rejected_requests_total",
                                    "Verify calls refused as invalid (no item scored).")),
      verify_seconds_(registry.GetHistogram(
          "kappa_verifier_verify_seconds", "Time to validate and score one Verify call.",
          {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25})),
      sandbox_seconds_(registry.GetHistogram(
          "kappa_verifier_sandbox_seconds", "Wall time of one sandboxed code run.",
          {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})) {
  // The binary rewards exist (at 0) before the first call.
  for (const char* value : {"0", "1"}) {
    registry.GetCounter("kappa_verifier_rewards_total", kRewardsHelp, {{"value", value}});
  }
  for (const char* outcome : {"pass", "fail", "timeout", "killed", "error"}) {
    registry.GetCounter("kappa_verifier_sandbox_runs_total", kSandboxRunsHelp,
                        {{"outcome", outcome}});
  }
}

void VerifierMetrics::RecordSandboxRun(std::string_view outcome, double seconds) {
  registry_
      .GetCounter("kappa_verifier_sandbox_runs_total", kSandboxRunsHelp,
                  {{"outcome", std::string(outcome)}})
      .Increment();
  sandbox_seconds_.Observe(seconds);
}

void VerifierMetrics::RecordRequest(double seconds,
                                    const absl::StatusOr<std::vector<float>>& rewards) {
  requests_.Increment();
  verify_seconds_.Observe(seconds);
  if (!rewards.ok()) {
    rejected_.Increment();
    return;
  }
  for (float reward : *rewards) {
    registry_
        .GetCounter("kappa_verifier_rewards_total", kRewardsHelp,
                    {{"value", services::metrics::FormatValue(reward)}})
        .Increment();
  }
}

}  // namespace kappa::verifier
