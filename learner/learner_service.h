// kappa.v1.Learner: leases prompts to rollout workers over their Rollout
// streams, accepts scored groups into the Coordinator, and streams policy
// weights from the PolicyPublisher. Knows nothing about training itself.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "kappa/v1/learner.grpc.pb.h"
#include "learner/coordinator.h"
#include "learner/group_decoder.h"
#include "learner/policy_publisher.h"
#include "learner/weight_broadcaster.h"
#include "learner/work_config.h"
#include "tasks/dataset.h"

namespace kappa::learner {

struct ServiceCounters {
  std::atomic<int64_t> groups_received{0};
  std::atomic<int64_t> groups_invalid{0};
  // groups_invalid by reason (kappa_learner_groups_refused_total{reason}):
  // a field the decoder refused; longer than the student's positions; not
  // the prompt of the example leased; a policy version never published.
  std::atomic<int64_t> refused_malformed{0};
  std::atomic<int64_t> refused_positions{0};
  std::atomic<int64_t> refused_prompt{0};
  std::atomic<int64_t> refused_policy_version{0};
  std::atomic<int64_t> streams_opened{0};
  // WatchPolicy traffic: data bytes of full and of delta versions sent, and
  // the bytes the delta and bfloat16 encodings saved (against the version
  // in the stream's dtype, against float32).
  std::atomic<int64_t> policy_versions_full{0};
  std::atomic<int64_t> policy_versions_delta{0};
  std::atomic<int64_t> policy_bytes_full{0};
  std::atomic<int64_t> policy_bytes_delta{0};
  std::atomic<int64_t> policy_bytes_saved_delta{0};
  std::atomic<int64_t> policy_bytes_saved_bfloat16{0};
  // Versions sent as a shared-memory segment (same-host workers), and
  // versions a stream that accepts segments got as chunks because none
  // could be written (ENOSPC, ...; logged once).
  std::atomic<int64_t> policy_versions_shm{0};
  std::atomic<int64_t> policy_shm_fallbacks{0};
};

class LearnerService final : public kappa::v1::Learner::Service {
 public:
  // The prompt ids of train example `example_index` (the learner encodes
  // every prompt at start-up, learner/prompt_encoder.h).
  using Tokenize = std::function<std::vector<int32_t>(size_t example_index)>;

  LearnerService(const tasks::Dataset& train, Tokenize tokenize, const WorkTemplate& work,
                 GroupExpectations expectations, Coordinator* coordinator,
                 PolicyPublisher* publisher);

  grpc::Status Rollout(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<kappa::v1::LearnerMessage, kappa::v1::WorkerMessage>* stream)
      override;

  grpc::Status WatchPolicy(grpc::ServerContext* context,
                           const kappa::v1::WatchPolicyRequest* request,
                           grpc::ServerWriter<kappa::v1::PolicyChunk>* writer) override;

  // FAILED_PRECONDITION unless set_weight_broadcaster() gave a group.
  grpc::Status JoinWeightGroup(grpc::ServerContext* context,
                               const kappa::v1::JoinWeightGroupRequest* request,
                               kappa::v1::JoinWeightGroupResponse* response) override;

  // The same-host weight group JoinWeightGroup assigns ranks in (null: none
  // offered). Call before the server starts; `broadcaster` outlives it.
  void set_weight_broadcaster(WeightBroadcaster* broadcaster) { broadcaster_ = broadcaster; }

  // Stops handing out work and ends open streams' waits.
  void Shutdown() { shutting_down_ = true; }
  const ServiceCounters& counters() const { return counters_; }

 private:
  kappa::v1::WorkItem MakeWorkItem(const Lease& lease) const;
  // `wire` decoded and checked against what this learner handed out: its
  // fields, its length against the student's positions, its prompt against
  // the example of its lease (when `stream_id` holds it open; else the
  // coordinator drops it by lease) and its policy version. A refusal is
  // INVALID_ARGUMENT naming the field, counted in counters_ by reason.
  absl::StatusOr<ScoredGroup> CheckedGroup(const kappa::v1::ScoredGroup& wire,
                                           const std::string& stream_id);
  // INVALID_ARGUMENT unless `wire`'s prompt is the leased example's.
  absl::Status CheckLeasedPrompt(const kappa::v1::ScoredGroup& wire,
                                 const std::string& stream_id) const;
  // Renews the stream's leases named in `renew` (Coordinator::Renew) and
  // writes the LeasesRenewed answer; false when the write failed.
  bool AnswerRenewal(const kappa::v1::RenewLeases& renew, const std::string& stream_id,
                     const std::function<bool(const kappa::v1::LearnerMessage&)>& write);
  bool SendPolicy(const EncodedPolicy& encoded, grpc::ServerWriter<kappa::v1::PolicyChunk>* writer);
  bool SendPolicyDelta(const EncodedDelta& delta,
                       grpc::ServerWriter<kappa::v1::PolicyChunk>* writer);
  // One SHARED_MEMORY chunk naming `segment`, which holds `snapshot` in `dtype`.
  bool SendPolicyShm(const PolicySnapshot& snapshot, torch::ScalarType dtype,
                     const dist::ShmSegment& segment,
                     grpc::ServerWriter<kappa::v1::PolicyChunk>* writer);
  // Whether a stream asking `request` gets segments; FAILED_PRECONDITION
  // (naming rollout.weight_transport) when it requires them and cannot.
  absl::StatusOr<bool> StreamUsesShm(const kappa::v1::WatchPolicyRequest& request) const;

  const tasks::Dataset& train_;
  const Tokenize tokenize_;
  const WorkTemplate work_;
  const GroupExpectations expectations_;
  Coordinator* const coordinator_;
  PolicyPublisher* const publisher_;
  WeightBroadcaster* broadcaster_ = nullptr;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> shm_failure_logged_{false};
  std::atomic<int64_t> next_stream_{0};
  ServiceCounters counters_;
};

}  // namespace kappa::learner
