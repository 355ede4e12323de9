#include "rollout_worker/worker_metrics.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"

namespace kappa::rollout {
namespace {

constexpr char kRpcErrorsHelp[] = "Failed RPC attempts, by the peer called.";
constexpr char kStageSecondsHelp[] =
    "Seconds one group spent in a stage: decode, verify, teacher_score, demonstrations.";
const std::vector<double> kStageSecondsBounds = {0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                                 2.5,   5,    10,   30,  60,   120};

}  // namespace

WorkerMetrics::WorkerMetrics(services::metrics::Registry& registry)
    : registry_(registry),
      samples_(registry.GetCounter("kappa_worker_samples_total",
                                   "Responses sampled and sent to the learner.")),
      tokens_(registry.GetCounter("kappa_worker_tokens_total",
                                  "Response tokens sampled and sent to the learner.")),
      groups_(
          registry.GetCounter("kappa_worker_groups_total", "Scored groups sent to the learner.")),
      items_dropped_(registry.GetCounter(
          "kappa_worker_items_dropped_total",
          "Work items given up: failed, lease expired, or lost with a broken stream.")),
      connections_(registry.GetCounter("kappa_worker_learner_connections_total",
                                       "Rollout streams opened to the learner (Hello sent).")),
      // A group's time is its decode in the engine (admission to its last
      // row's stop) plus its own Verify and Score: tens of milliseconds for
      // the demo model, seconds for a large one.
      generation_seconds_(registry.GetHistogram(
          "kappa_worker_generation_seconds",
          "Wall time to sample, verify and score one group (its decode included).",
          {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})),
      policy_version_(registry.GetGauge("kappa_worker_policy_version",
                                        "Policy version the worker samples with.")),
      // Occupancy = rate(busy_slot_steps) / (rate(steps) × slots).
      engine_steps_(registry.GetCounter("kappa_worker_engine_steps_total",
                                        "Continuous-engine steps (one token for every row).")),
      engine_busy_slot_steps_(
          registry.GetCounter("kappa_worker_engine_busy_slot_steps_total",
                              "Σ over engine steps of the slots that held a row.")),
      engine_slots_(registry.GetGauge("kappa_worker_engine_slots",
                                      "Slots of the continuous engine (rollout.max_batch_rows).")),
      kv_cache_bytes_(registry.GetGauge("kappa_worker_kv_cache_bytes",
                                        "Bytes of the engine's preallocated key/value slots.")) {
  for (const char* peer : {"learner", "teacher", "verifier"}) {
    registry.GetCounter("kappa_worker_rpc_errors_total", kRpcErrorsHelp, {{"peer", peer}});
  }
  for (const char* stage : {"decode", "verify", "teacher_score", "demonstrations"}) {
    registry.GetHistogram("kappa_worker_stage_seconds", kStageSecondsHelp, kStageSecondsBounds,
                          {{"stage", stage}});
  }
}

void WorkerMetrics::RecordGroupSent(int64_t samples, int64_t tokens, double generation_seconds) {
  groups_.Increment();
  samples_.Increment(static_cast<double>(samples));
  tokens_.Increment(static_cast<double>(tokens));
  generation_seconds_.Observe(generation_seconds);
}

void WorkerMetrics::RecordStageSeconds(absl::string_view stage, double seconds) {
  registry_
      .GetHistogram("kappa_worker_stage_seconds", kStageSecondsHelp, kStageSecondsBounds,
                    {{"stage", std::string(stage)}})
      .Observe(seconds);
}

void WorkerMetrics::SetEngineSlots(int64_t slots) { engine_slots_.Set(static_cast<double>(slots)); }

void WorkerMetrics::RecordEngineStep(int64_t busy_slots, int64_t kv_cache_bytes) {
  engine_steps_.Increment();
  engine_busy_slot_steps_.Increment(static_cast<double>(busy_slots));
  kv_cache_bytes_.Set(static_cast<double>(kv_cache_bytes));
}

void WorkerMetrics::RecordConnection() { connections_.Increment(); }

void WorkerMetrics::RecordItemsDropped(int64_t items) {
  items_dropped_.Increment(static_cast<double>(items));
}

void WorkerMetrics::RecordRpcError(absl::string_view peer) {
  registry_.GetCounter("kappa_worker_rpc_errors_total", kRpcErrorsHelp, {{"peer", std::string(peer)}})
      .Increment();
}

void WorkerMetrics::RecordMessageBytes(absl::string_view message, absl::string_view direction,
                                       int64_t bytes) {
  registry_
      .GetCounter("kappa_worker_message_bytes_total",
                  "Serialized bytes of the messages the worker sent and received, by kind.",
                  {{"message", std::string(message)}, {"direction", std::string(direction)}})
      .Increment(static_cast<double>(bytes));
  registry_
      .GetCounter("kappa_worker_messages_total",
                  "Messages the worker sent and received, by kind (bytes per message: "
                  "kappa_worker_message_bytes_total over this).",
                  {{"message", std::string(message)}, {"direction", std::string(direction)}})
      .Increment();
}

void WorkerMetrics::SetPolicyVersion(int64_t version) {
  policy_version_.Set(static_cast<double>(version));
}

std::string PeerOfRpc(absl::string_view rpc) {
  return absl::AsciiStrToLower(rpc.substr(0, rpc.find('.')));
}

}  // namespace kappa::rollout
