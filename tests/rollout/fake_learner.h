// Test scaffolding: a minimal in-process kappa.v1.Learner that publishes
// whatever policy chunks a test gives it, forwards test-chosen LearnerMessages
// on the active Rollout stream, and records what workers send back.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "kappa/v1/learner.grpc.pb.h"

namespace kappa::rollout::testing {

class FakeLearner final : public kappa::v1::Learner::Service {
 public:
  // Adds one version's chunks; WatchPolicy streams send it to every watcher
  // whose known version is older.
  void Publish(int64_t version, std::vector<kappa::v1::PolicyChunk> chunks);
  // Queued and written, in order, on the current Rollout stream.
  void Send(const kappa::v1::LearnerMessage& message);
  void SendCredit(int32_t groups);
  void SendWork(const kappa::v1::WorkItem& item);
  // Every later Rollout stream ends with `status` right after its Hello, as
  // the learner ends one whose Hello it refuses.
  void RefuseHellos(grpc::Status status);

  // Wait until the predicate over the recorded state holds, or timeout.
  bool WaitForGroups(size_t count, absl::Duration timeout);
  bool WaitForHellos(size_t count, absl::Duration timeout);
  bool WaitForWatchers(size_t count, absl::Duration timeout);

  std::vector<kappa::v1::ScoredGroup> groups();
  std::vector<kappa::v1::Hello> hellos();
  std::vector<int64_t> watch_known_versions();
  int64_t protocol_errors();
  // Lease ids the worker asked to renew (RenewLeases); never answered.
  int64_t renewals();

  // Makes every open handler return, so the server can shut down promptly.
  void Close();

  grpc::Status Rollout(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<kappa::v1::LearnerMessage, kappa::v1::WorkerMessage>* stream)
      override;
  grpc::Status WatchPolicy(grpc::ServerContext* context,
                           const kappa::v1::WatchPolicyRequest* request,
                           grpc::ServerWriter<kappa::v1::PolicyChunk>* writer) override;

 private:
  bool WaitFor(const std::function<bool()>& done, absl::Duration timeout);

  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<std::pair<int64_t, std::vector<kappa::v1::PolicyChunk>>> versions_;
  std::deque<kappa::v1::LearnerMessage> outbox_;
  std::vector<kappa::v1::ScoredGroup> groups_;
  std::vector<kappa::v1::Hello> hellos_;
  std::vector<int64_t> watch_known_versions_;
  int64_t protocol_errors_ = 0;
  int64_t renewals_ = 0;
  std::optional<grpc::Status> hello_refusal_;
};

}  // namespace kappa::rollout::testing
