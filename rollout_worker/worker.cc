#include "rollout_worker/worker.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "rollout_worker/backoff.h"
#include "rollout_worker/engine_session.h"

namespace kappa::rollout {
namespace {

using kappa::v1::LearnerMessage;
using kappa::v1::WorkerMessage;

// How often a wait for a policy version checks whether its item is being
// abandoned: a broken stream is not an event the policy watcher sees, so that
// one wait is sliced (every other wait here is a condition wait).
constexpr absl::Duration kAbandonCheckInterval = absl::Milliseconds(200);

// How often the renewal thread looks at the held leases at most (it looks
// sooner when a lease's quarter span is shorter).
constexpr absl::Duration kRenewCheckInterval = absl::Seconds(1);

GroupSamplerOptions SamplerOptions(const WorkerOptions& options, const LeaseClock* leases) {
  GroupSamplerOptions sampler = options.sampler;
  sampler.worker_id = options.worker_id;
  sampler.metrics = options.metrics;
  sampler.leases = leases;
  return sampler;
}

}  // namespace

struct RolloutWorker::Connection {
  explicit Connection(const std::atomic<bool>* worker_stopping) : stopping(worker_stopping) {}

  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriterInterface<WorkerMessage, LearnerMessage>> stream;
  std::thread reader;
  std::thread renewer;
  const std::atomic<bool>* const stopping;  // the worker's stopping_

  // Taken after the worker's mu_ when both are held (Stop()).
  absl::Mutex mu ABSL_ACQUIRED_AFTER(mu_);
  // Work items the reader received and the loop has not taken yet, oldest
  // first.
  std::deque<kappa::v1::WorkItem> queue ABSL_GUARDED_BY(mu);
  // Groups the learner will accept now: credits received minus groups sent.
  int64_t credits ABSL_GUARDED_BY(mu) = 0;
  // The stream ended (read or write failed); set once, never cleared.
  bool broken ABSL_GUARDED_BY(mu) = false;
  // The learner sent at least one message on this stream.
  bool received_any ABSL_GUARDED_BY(mu) = false;
  // Work items received on this stream: the renewal thread wakes when it
  // changes, so a new lease's span sets how soon it looks again.
  int64_t items_received ABSL_GUARDED_BY(mu) = 0;
  // Serializes stream writes: the continuous path sends groups from the
  // threads that complete them.
  absl::Mutex write_mu;

  // The conditions the loop waits on; each ends the wait on a break or Stop().
  bool HasItemOrEndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !queue.empty() || EndedLocked();
  }
  bool HasCreditOrEndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return credits > 0 || EndedLocked();
  }
  bool EndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return broken || stopping->load(); }

  bool Broken() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    return broken;
  }
  // Wakes every wait on mu (the release re-evaluates their conditions).
  void MarkBroken() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    broken = true;
  }
};

RolloutWorker::RolloutWorker(std::shared_ptr<grpc::ChannelInterface> learner_channel,
                             std::shared_ptr<grpc::ChannelInterface> verifier_channel,
                             std::shared_ptr<grpc::ChannelInterface> teacher_channel,
                             WorkerOptions options)
    : options_(std::move(options)),
      learner_(kappa::v1::Learner::NewStub(learner_channel)),
      watcher_(learner_channel,
               PolicyWatcherOptions{options_.worker_id, options_.initial_backoff,
                                    options_.max_backoff, options_.device, options_.dtype},
               options_.weight_sync),
      sampler_(std::move(verifier_channel), std::move(teacher_channel),
               SamplerOptions(options_, &leases_)),
      engine_(options_.engine) {
  if (options_.metrics != nullptr) options_.metrics->SetEngineSlots(options_.engine.max_rows);
}

RolloutWorker::~RolloutWorker() { Stop(); }

WorkerStats RolloutWorker::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void RolloutWorker::Stop() {
  {
    // Releasing mu_ wakes Run()'s backoff wait; taking and releasing the
    // connection's mu wakes the loop's waits for an item or credit (their
    // conditions read stopping_).
    absl::MutexLock lock(&mu_);
    stopping_.store(true);
    if (connection_ != nullptr) {
      connection_->context.TryCancel();
      absl::MutexLock connection_lock(&connection_->mu);
    }
  }
  sampler_.Cancel();
  watcher_.Stop();
}

absl::Status RolloutWorker::Run() {
  spdlog::info("rollout worker {} starting (max_outstanding {})", options_.worker_id,
               options_.max_outstanding);
  watcher_.Start();
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  while (!stopping()) {
    bool received_any = false;
    const grpc::Status status = ServeStream(&received_any);
    if (stopping()) break;
    if (options_.metrics != nullptr && !status.ok()) options_.metrics->RecordRpcError("learner");
    if (!received_any && status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      // The learner refused the Hello itself (e.g. rollout.max_outstanding
      // above its cap): a configuration error no retry can fix, so stop
      // with it rather than reconnect forever.
      watcher_.Stop();
      return absl::InvalidArgumentError(
          absl::StrCat("the learner refused this worker: ", status.error_message()));
    }
    if (received_any) backoff.Reset();  // the learner was up: retry soon
    const absl::Duration delay = backoff.Next();
    spdlog::warn("Rollout stream to the learner ended ({}: {}); reconnecting in {:.0f} ms",
                 static_cast<int>(status.error_code()), status.error_message(),
                 absl::ToDoubleMilliseconds(delay));
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &RolloutWorker::stopping), delay);
  }
  watcher_.Stop();
  const WorkerStats final_stats = stats();
  spdlog::info("rollout worker {} stopped: {} groups sent, {} items received, {} dropped, "
               "{} connections",
               options_.worker_id, final_stats.groups_sent, final_stats.items_received,
               final_stats.items_dropped, final_stats.connections);
  const SamplerMessageBytes bytes = sampler_.message_bytes();
  spdlog::info(
      "message bytes: group sent {} in {}; score sent {} received {} in {} calls; "
      "verify sent {} received {} in {} calls",
      final_stats.group_bytes_sent, final_stats.groups_sent, bytes.score_sent, bytes.score_received,
      bytes.score_calls, bytes.verify_sent, bytes.verify_received, bytes.verify_calls);
  return absl::OkStatus();
}

grpc::Status RolloutWorker::ServeStream(bool* received_any) {
  Connection connection(&stopping_);
  {
    absl::MutexLock lock(&mu_);
    if (stopping()) return grpc::Status::CANCELLED;
    connection_ = &connection;
  }
  sampler_.Resume();
  connection.stream = learner_->Rollout(&connection.context);

  WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(options_.worker_id);
  hello.mutable_hello()->set_max_outstanding(std::max(1, options_.max_outstanding));
  if (connection.stream->Write(hello)) {
    {
      absl::MutexLock lock(&mu_);
      ++stats_.connections;
    }
    if (options_.metrics != nullptr) options_.metrics->RecordConnection();
    spdlog::info("connected to the learner as {}", options_.worker_id);
    connection.reader = std::thread([this, &connection] { ReadLoop(&connection); });
    connection.renewer = std::thread([this, &connection] { RenewLoop(&connection); });
    ServeWithEngine(&connection);
  } else {
    connection.MarkBroken();
  }

  if (!connection.Broken() || stopping()) connection.context.TryCancel();
  if (connection.reader.joinable()) connection.reader.join();
  if (connection.renewer.joinable()) connection.renewer.join();
  leases_.ForgetAll();  // the learner re-issues them once they lapse
  const grpc::Status status = connection.stream->Finish();
  int64_t dropped = 0;
  {
    absl::MutexLock lock(&connection.mu);
    dropped = static_cast<int64_t>(connection.queue.size());
    *received_any = connection.received_any;
  }
  absl::MutexLock lock(&mu_);
  connection_ = nullptr;
  stats_.items_dropped += dropped;
  if (options_.metrics != nullptr) options_.metrics->RecordItemsDropped(dropped);
  if (dropped > 0) spdlog::warn("dropped {} queued work items with the stream", dropped);
  return status;
}

void RolloutWorker::ReadLoop(Connection* connection) {
  LearnerMessage message;
  while (connection->stream->Read(&message)) {
    const bool is_work = message.has_work();
    {
      // Lock order is mu_ before connection->mu (see Stop()), so never nest them here.
      // Releasing the lock wakes a wait for an item or credit.
      absl::MutexLock lock(&connection->mu);
      connection->received_any = true;
      if (is_work) {
        leases_.Track(message.work());
        ++connection->items_received;
        connection->queue.push_back(std::move(*message.mutable_work()));
      } else if (message.has_renewed()) {
        const kappa::v1::LeasesRenewed& renewed = message.renewed();
        leases_.Renewed({renewed.lease_ids().begin(), renewed.lease_ids().end()},
                        absl::FromUnixMillis(renewed.lease_deadline_unix_ms()));
      } else if (message.has_credit() && message.credit().groups() > 0) {
        connection->credits += message.credit().groups();
      }
    }
    if (is_work) {
      absl::MutexLock lock(&mu_);
      ++stats_.items_received;
    }
  }
  connection->MarkBroken();
}

void RolloutWorker::RenewLoop(Connection* connection) {
  int64_t items_seen = 0;
  while (true) {
    {
      absl::MutexLock lock(&connection->mu);
      auto woken = [connection, &items_seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(connection->mu) {
        return connection->EndedLocked() || connection->items_received != items_seen;
      };
      connection->mu.AwaitWithTimeout(absl::Condition(&woken),
                                      leases_.NextCheck(kRenewCheckInterval));
      if (connection->EndedLocked()) return;
      items_seen = connection->items_received;
    }
    const std::vector<std::string> due = leases_.DueForRenewal();
    if (due.empty()) continue;
    WorkerMessage renew;
    for (const std::string& id : due) renew.mutable_renew()->add_lease_ids(id);
    bool written = false;
    {
      absl::MutexLock write_lock(&connection->write_mu);
      written = connection->stream->Write(renew);
    }
    if (!written) {
      connection->MarkBroken();
      return;
    }
  }
}

void RolloutWorker::DropItem(const kappa::v1::WorkItem& item, const std::string& why,
                             bool quiet) {
  leases_.Forget(item.lease_id());
  if (quiet) {
    spdlog::info("work item lease {} (prompt {}) dropped: {}", item.lease_id(), item.prompt_id(),
                 why);
  } else {
    spdlog::error("work item lease {} (prompt {}) dropped: {}", item.lease_id(),
                  item.prompt_id(), why);
  }
  if (options_.metrics != nullptr) options_.metrics->RecordItemsDropped(1);
  absl::MutexLock lock(&mu_);
  ++stats_.items_dropped;
}

std::optional<Policy> RolloutWorker::WaitForPolicy(const kappa::v1::WorkItem& item,
                                                   const std::function<bool()>& abandon) {
  // Checks abandon() between slices (Stop() also ends the wait: it stops the
  // watcher).
  const absl::Time unleased_deadline = absl::Now() + options_.max_policy_wait;
  while (true) {
    // The lease's deadline moves while it is renewed.
    const absl::Time policy_deadline =
        item.lease_deadline_unix_ms() > 0 ? leases_.Deadline(item) : unleased_deadline;
    absl::StatusOr<Policy> waited = watcher_.WaitForVersion(
        item.policy_version(), std::min(policy_deadline, absl::Now() + kAbandonCheckInterval));
    if (waited.ok()) return *std::move(waited);
    if (abandon()) {
      DropItem(item, "worker stopping or stream broken", true);
      return std::nullopt;
    }
    if (absl::Now() >= policy_deadline) {
      DropItem(item,
               absl::StrCat("no policy version >= ", item.policy_version(),
                            " before the lease deadline (have ", watcher_.Current().version, ")"),
               false);
      return std::nullopt;
    }
  }
}

void RolloutWorker::SendGroup(Connection* connection, const kappa::v1::WorkItem& item,
                              kappa::v1::ScoredGroup group) {
  const char* dropped = nullptr;  // why, if the group cannot be sent
  bool quiet = true;
  {
    absl::MutexLock lock(&connection->mu,
                         absl::Condition(connection, &Connection::HasCreditOrEndedLocked));
    if (connection->EndedLocked()) {
      dropped = "stream broke while waiting for credit";
    } else if (leases_.Expired(item)) {
      dropped = "lease expired while waiting for credit";
      quiet = false;
    } else {
      --connection->credits;
    }
  }
  if (dropped != nullptr) return DropItem(item, dropped, quiet);

  double reward_sum = 0;
  int64_t tokens = 0;
  for (const kappa::v1::ScoredSample& sample : group.samples()) {
    reward_sum += sample.reward();
    tokens += sample.response_tokens_size();
  }
  const int samples = group.samples_size();
  const int demonstrations = group.demonstrations_size();
  const double seconds = group.generation_seconds();
  const int64_t version = group.policy_version();
  WorkerMessage message;
  *message.mutable_group() = std::move(group);
  const auto bytes = static_cast<int64_t>(message.ByteSizeLong());
  bool written = false;
  {
    absl::MutexLock write_lock(&connection->write_mu);
    written = connection->stream->Write(message);
  }
  if (!written) {
    connection->MarkBroken();
    return DropItem(item, "stream write failed", true);
  }
  leases_.Forget(item.lease_id());
  if (options_.metrics != nullptr) {
    options_.metrics->RecordGroupSent(samples, tokens, seconds);
    options_.metrics->RecordMessageBytes("group", "sent", bytes);
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.groups_sent;
    stats_.group_bytes_sent += bytes;
  }
  spdlog::info("group sent: prompt {} lease {} policy v{} (asked v{}) G={} mean_reward={:.3f} "
               "teacher_form={} demonstrations={} {:.2f}s",
               item.prompt_id(), item.lease_id(), version, item.policy_version(), samples,
               samples > 0 ? reward_sum / samples : 0.0, item.teacher_form(), demonstrations,
               seconds);
}

}  // namespace kappa::rollout

namespace kappa::rollout {

void RolloutWorker::CompleteAndSend(Connection* connection, const kappa::v1::WorkItem& item,
                                    absl::StatusOr<kappa::v1::ScoredGroup> sampled,
                                    const Policy& policy, const std::function<bool()>& abandon) {
  absl::StatusOr<kappa::v1::ScoredGroup> group =
      sampled.ok() ? sampler_.Complete(item, *std::move(sampled), policy, abandon)
                   : std::move(sampled);
  if (!group.ok()) {
    const bool quiet = absl::IsCancelled(group.status()) && abandon();
    return DropItem(item, std::string(group.status().ToString()), quiet);
  }
  SendGroup(connection, item, *std::move(group));
}

void RolloutWorker::ServeWithEngine(Connection* connection) {
  auto abandon = [this, connection] { return stopping() || connection->Broken(); };
  EngineSessionCallbacks callbacks;
  callbacks.take_items = [connection](bool wait, std::deque<kappa::v1::WorkItem>* into) {
    absl::MutexLock lock(&connection->mu);
    if (wait) connection->mu.Await(absl::Condition(connection, &Connection::HasItemOrEndedLocked));
    if (connection->EndedLocked()) return false;
    for (kappa::v1::WorkItem& item : connection->queue) into->push_back(std::move(item));
    connection->queue.clear();
    return true;
  };
  callbacks.wait_for_policy = [this, abandon](const kappa::v1::WorkItem& item) {
    return WaitForPolicy(item, abandon);
  };
  callbacks.complete_and_send = [this, connection, abandon](
                                    const kappa::v1::WorkItem& item,
                                    absl::StatusOr<kappa::v1::ScoredGroup> group,
                                    const Policy& policy) {
    CompleteAndSend(connection, item, std::move(group), policy, abandon);
  };
  callbacks.drop = [this](const kappa::v1::WorkItem& item, const std::string& why) {
    DropItem(item, why, false);
  };
  callbacks.group_decoded = [this] {
    absl::MutexLock lock(&mu_);
    ++stats_.decode_batches;
  };
  EngineSession session(&engine_, &sampler_, &watcher_, options_.metrics,
                        std::max(1, options_.max_outstanding), std::move(callbacks));
  const int64_t dropped = session.Serve();
  if (dropped > 0) {
    spdlog::warn("dropped {} work items in the decode engine with the stream", dropped);
    if (options_.metrics != nullptr) options_.metrics->RecordItemsDropped(dropped);
    absl::MutexLock lock(&mu_);
    stats_.items_dropped += dropped;
  }
}

}  // namespace kappa::rollout
