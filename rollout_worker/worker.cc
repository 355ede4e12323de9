#include "rollout_worker/worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rollout_worker/backoff.h"

namespace kappa::rollout {
namespace {

using kappa::v1::LearnerMessage;
using kappa::v1::WorkerMessage;

// Upper bound on a blocking wait, as a safety net for wakeups.
constexpr auto kPollInterval = std::chrono::milliseconds(200);

GroupSamplerOptions SamplerOptions(const WorkerOptions& options) {
  GroupSamplerOptions sampler = options.sampler;
  sampler.worker_id = options.worker_id;
  sampler.metrics = options.metrics;
  return sampler;
}

bool LeaseExpired(const kappa::v1::WorkItem& item) {
  return item.lease_deadline_unix_ms() > 0 &&
         absl::ToUnixMillis(absl::Now()) > item.lease_deadline_unix_ms();
}

}  // namespace

struct RolloutWorker::Connection {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriterInterface<WorkerMessage, LearnerMessage>> stream;
  std::thread reader;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<kappa::v1::WorkItem> queue;  // guarded by mu
  int64_t credits = 0;                    // guarded by mu
  bool broken = false;                    // guarded by mu
  bool received_any = false;              // guarded by mu

  bool Broken() {
    std::lock_guard<std::mutex> lock(mu);
    return broken;
  }
  void MarkBroken() {
    {
      std::lock_guard<std::mutex> lock(mu);
      broken = true;
    }
    cv.notify_all();
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
                                    options_.max_backoff, options_.device,
                                    options_.dtype}),
      sampler_(std::move(verifier_channel), std::move(teacher_channel),
               SamplerOptions(options_)) {}

RolloutWorker::~RolloutWorker() { Stop(); }

WorkerStats RolloutWorker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void RolloutWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_.store(true);
    if (connection_ != nullptr) {
      connection_->context.TryCancel();
      std::lock_guard<std::mutex> connection_lock(connection_->mu);
      connection_->cv.notify_all();
    }
  }
  stop_cv_.notify_all();
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
    std::unique_lock<std::mutex> lock(mu_);
    stop_cv_.wait_for(lock, absl::ToChronoNanoseconds(delay), [this] { return stopping(); });
  }
  watcher_.Stop();
  const WorkerStats final_stats = stats();
  spdlog::info("rollout worker {} stopped: {} groups sent, {} items received, {} dropped, "
               "{} connections",
               options_.worker_id, final_stats.groups_sent, final_stats.items_received,
               final_stats.items_dropped, final_stats.connections);
  return absl::OkStatus();
}

grpc::Status RolloutWorker::ServeStream(bool* received_any) {
  Connection connection;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.connections;
    }
    if (options_.metrics != nullptr) options_.metrics->RecordConnection();
    spdlog::info("connected to the learner as {}", options_.worker_id);
    connection.reader = std::thread([this, &connection] { ReadLoop(&connection); });
    while (!stopping()) {
      kappa::v1::WorkItem item;
      {
        std::unique_lock<std::mutex> lock(connection.mu);
        connection.cv.wait_for(lock, kPollInterval, [&] {
          return !connection.queue.empty() || connection.broken || stopping();
        });
        if (connection.broken || stopping()) break;
        if (connection.queue.empty()) continue;
        item = std::move(connection.queue.front());
        connection.queue.pop_front();
      }
      ProcessItems(&connection, std::move(item));
    }
  } else {
    connection.MarkBroken();
  }

  if (!connection.Broken() || stopping()) connection.context.TryCancel();
  if (connection.reader.joinable()) connection.reader.join();
  const grpc::Status status = connection.stream->Finish();
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(connection.mu);
    dropped = static_cast<int64_t>(connection.queue.size());
    *received_any = connection.received_any;
  }
  std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(connection->mu);
      connection->received_any = true;
      if (is_work) {
        connection->queue.push_back(std::move(*message.mutable_work()));
      } else if (message.has_credit() && message.credit().groups() > 0) {
        connection->credits += message.credit().groups();
      }
    }
    connection->cv.notify_all();
    if (is_work) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.items_received;
    }
  }
  connection->MarkBroken();
}

void RolloutWorker::DropItem(const kappa::v1::WorkItem& item, const std::string& why,
                             bool quiet) {
  if (quiet) {
    spdlog::info("work item lease {} (prompt {}) dropped: {}", item.lease_id(), item.prompt_id(),
                 why);
  } else {
    spdlog::error("work item lease {} (prompt {}) dropped: {}", item.lease_id(),
                  item.prompt_id(), why);
  }
  if (options_.metrics != nullptr) options_.metrics->RecordItemsDropped(1);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.items_dropped;
}

void RolloutWorker::ProcessItems(Connection* connection, kappa::v1::WorkItem first) {
  auto abandon = [this, connection] { return stopping() || connection->Broken(); };

  // Wait for a policy at least as new as the learner asks for.
  const absl::Time policy_deadline =
      first.lease_deadline_unix_ms() > 0
          ? absl::FromUnixMillis(first.lease_deadline_unix_ms())
          : absl::Now() + options_.max_policy_wait;
  Policy policy;
  while (true) {
    absl::StatusOr<Policy> waited = watcher_.WaitForVersion(
        first.policy_version(), std::min(policy_deadline, absl::Now() + absl::Milliseconds(200)));
    if (waited.ok()) {
      policy = *std::move(waited);
      break;
    }
    if (abandon()) return DropItem(first, "worker stopping or stream broken", true);
    if (absl::Now() >= policy_deadline) {
      return DropItem(first,
                      absl::StrCat("no policy version >= ", first.policy_version(),
                                   " before the lease deadline (have ",
                                   watcher_.Current().version, ")"),
                      false);
    }
  }

  // The items queued behind `first` that this policy serves join its decode,
  // in order: the first one that asks for a newer version ends the batch.
  std::vector<kappa::v1::WorkItem> items;
  items.push_back(std::move(first));
  {
    std::lock_guard<std::mutex> lock(connection->mu);
    while (!connection->queue.empty() &&
           static_cast<int32_t>(items.size()) < std::max(1, options_.max_outstanding) &&
           connection->queue.front().policy_version() <= policy.version) {
      items.push_back(std::move(connection->queue.front()));
      connection->queue.pop_front();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.decode_batches;
  }
  if (options_.metrics != nullptr) {
    options_.metrics->RecordDecodeBatch(static_cast<int64_t>(items.size()));
  }

  // Every group's Verify/Score/demonstration RPCs run at once, so the
  // teacher's dynamic batcher sees the whole batch rather than one group at
  // a time; groups still go out in order, each as soon as it and those
  // before it are complete.
  std::vector<absl::StatusOr<kappa::v1::ScoredGroup>> sampled = sampler_.Sample(items, policy);
  std::vector<std::future<absl::StatusOr<kappa::v1::ScoredGroup>>> completing;
  for (size_t i = 0; i < items.size(); ++i) {
    completing.push_back(std::async(std::launch::async, [&, i] {
      return sampled[i].ok() ? sampler_.Complete(items[i], *std::move(sampled[i]), policy, abandon)
                             : absl::StatusOr<kappa::v1::ScoredGroup>(sampled[i].status());
    }));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const kappa::v1::WorkItem& item = items[i];
    absl::StatusOr<kappa::v1::ScoredGroup> group = completing[i].get();
    if (!group.ok()) {
      const bool quiet = absl::IsCancelled(group.status()) && abandon();
      DropItem(item, std::string(group.status().ToString()), quiet);
      continue;
    }
    SendGroup(connection, item, *std::move(group));
  }
}

void RolloutWorker::SendGroup(Connection* connection, const kappa::v1::WorkItem& item,
                              kappa::v1::ScoredGroup group) {
  {
    std::unique_lock<std::mutex> lock(connection->mu);
    while (connection->credits <= 0 && !connection->broken && !stopping()) {
      connection->cv.wait_for(lock, kPollInterval);
    }
    if (connection->broken || stopping()) {
      lock.unlock();
      return DropItem(item, "stream broke while waiting for credit", true);
    }
    if (LeaseExpired(item)) {
      lock.unlock();
      return DropItem(item, "lease expired while waiting for credit", false);
    }
    --connection->credits;
  }

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
  if (!connection->stream->Write(message)) {
    connection->MarkBroken();
    return DropItem(item, "stream write failed", true);
  }
  if (options_.metrics != nullptr) options_.metrics->RecordGroupSent(samples, tokens, seconds);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.groups_sent;
  }
  spdlog::info("group sent: prompt {} lease {} policy v{} (asked v{}) G={} mean_reward={:.3f} "
               "teacher_form={} demonstrations={} {:.2f}s",
               item.prompt_id(), item.lease_id(), version, item.policy_version(), samples,
               samples > 0 ? reward_sum / samples : 0.0, item.teacher_form(), demonstrations,
               seconds);
}

}  // namespace kappa::rollout
