#include "rollout_worker/worker_metrics.h"

#include "absl/strings/ascii.h"

namespace kappa::rollout {
namespace {

constexpr char kRpcErrorsHelp[] = "Failed RPC attempts, by the peer called.";

}  // namespace

WorkerMetrics::WorkerMetrics(services::metrics::Registry& registry)
    : registry_(registry),
      samples_(registry.GetCounter("kappa_worker_samples_total",
                                   "Responses sampled and sent to the learner.")),
      tokens_(registry.GetCounter("kappa_worker_tokens_total",
                                  "Response tokens sampled and sent to the learner.")),
      groups_(registry.GetCounter("kappa_worker_groups_total", "Scored groups sent to the learner.")),
      items_dropped_(registry.GetCounter(
          "kappa_worker_items_dropped_total",
          "Work items given up: failed, lease expired, or lost with a broken stream.")),
      connections_(registry.GetCounter("kappa_worker_learner_connections_total",
                                       "Rollout streams opened to the learner (Hello sent).")),
      // One group is G samples decoded together, then verified and scored:
      // tens of milliseconds for the demo model, seconds for a large one.
      generation_seconds_(registry.GetHistogram(
          "kappa_worker_generation_seconds",
          "Wall time to sample, verify and score one group.",
          {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})),
      policy_version_(registry.GetGauge("kappa_worker_policy_version",
                                        "Policy version the worker samples with.")) {
  for (const char* peer : {"learner", "teacher", "verifier"}) {
    registry.GetCounter("kappa_worker_rpc_errors_total", kRpcErrorsHelp, {{"peer", peer}});
  }
}

void WorkerMetrics::RecordGroupSent(int64_t samples, int64_t tokens, double generation_seconds) {
  groups_.Increment();
  samples_.Increment(static_cast<double>(samples));
  tokens_.Increment(static_cast<double>(tokens));
  generation_seconds_.Observe(generation_seconds);
}

void WorkerMetrics::RecordConnection() { connections_.Increment(); }

void WorkerMetrics::RecordItemsDropped(int64_t items) {
  items_dropped_.Increment(static_cast<double>(items));
}

void WorkerMetrics::RecordRpcError(absl::string_view peer) {
  registry_.GetCounter("kappa_worker_rpc_errors_total", kRpcErrorsHelp, {{"peer", std::string(peer)}})
      .Increment();
}

void WorkerMetrics::SetPolicyVersion(int64_t version) {
  policy_version_.Set(static_cast<double>(version));
}

std::string PeerOfRpc(absl::string_view rpc) {
  return absl::AsciiStrToLower(rpc.substr(0, rpc.find('.')));
}

}  // namespace kappa::rollout
