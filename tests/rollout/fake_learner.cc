#include "tests/rollout/fake_learner.h"

#include <chrono>
#include <thread>
#include <utility>

namespace kappa::rollout::testing {
namespace {
constexpr auto kPoll = std::chrono::milliseconds(10);
}

void FakeLearner::Publish(int64_t version, std::vector<kappa::v1::PolicyChunk> chunks) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    versions_.emplace_back(version, std::move(chunks));
  }
  cv_.notify_all();
}

void FakeLearner::Send(const kappa::v1::LearnerMessage& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.push_back(message);
  }
  cv_.notify_all();
}

void FakeLearner::SendCredit(int32_t groups) {
  kappa::v1::LearnerMessage message;
  message.mutable_credit()->set_groups(groups);
  Send(message);
}

void FakeLearner::SendWork(const kappa::v1::WorkItem& item) {
  kappa::v1::LearnerMessage message;
  *message.mutable_work() = item;
  Send(message);
}

void FakeLearner::RefuseHellos(grpc::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  hello_refusal_ = std::move(status);
}

bool FakeLearner::WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), done);
}

bool FakeLearner::WaitForGroups(size_t count, absl::Duration timeout) {
  return WaitFor([&] { return groups_.size() >= count; }, timeout);
}
bool FakeLearner::WaitForHellos(size_t count, absl::Duration timeout) {
  return WaitFor([&] { return hellos_.size() >= count; }, timeout);
}
bool FakeLearner::WaitForWatchers(size_t count, absl::Duration timeout) {
  return WaitFor([&] { return watch_known_versions_.size() >= count; }, timeout);
}

std::vector<kappa::v1::ScoredGroup> FakeLearner::groups() {
  std::lock_guard<std::mutex> lock(mu_);
  return groups_;
}
std::vector<kappa::v1::Hello> FakeLearner::hellos() {
  std::lock_guard<std::mutex> lock(mu_);
  return hellos_;
}
std::vector<int64_t> FakeLearner::watch_known_versions() {
  std::lock_guard<std::mutex> lock(mu_);
  return watch_known_versions_;
}
int64_t FakeLearner::renewals() {
  std::lock_guard<std::mutex> lock(mu_);
  return renewals_;
}

int64_t FakeLearner::protocol_errors() {
  std::lock_guard<std::mutex> lock(mu_);
  return protocol_errors_;
}

void FakeLearner::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

grpc::Status FakeLearner::Rollout(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<kappa::v1::LearnerMessage, kappa::v1::WorkerMessage>* stream) {
  kappa::v1::WorkerMessage first;
  if (!stream->Read(&first) || !first.has_hello()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++protocol_errors_;
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "first message must be a Hello");
  }
  std::optional<grpc::Status> refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hellos_.push_back(first.hello());
    refusal = hello_refusal_;
  }
  cv_.notify_all();
  if (refusal) return *refusal;

  std::thread reader([&] {
    kappa::v1::WorkerMessage message;
    while (stream->Read(&message)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (message.has_group()) {
        groups_.push_back(message.group());
      } else if (message.has_renew()) {
        renewals_ += message.renew().lease_ids_size();
      } else {
        ++protocol_errors_;
      }
      cv_.notify_all();
    }
  });
  while (!context->IsCancelled()) {
    kappa::v1::LearnerMessage message;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kPoll, [&] { return closed_ || !outbox_.empty(); });
      if (closed_) break;
      if (outbox_.empty()) continue;
      message = std::move(outbox_.front());
      outbox_.pop_front();
    }
    if (!stream->Write(message)) break;
  }
  context->TryCancel();  // unblocks the reader's Read
  reader.join();
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake learner closed the stream");
}

grpc::Status FakeLearner::WatchPolicy(grpc::ServerContext* context,
                                      const kappa::v1::WatchPolicyRequest* request,
                                      grpc::ServerWriter<kappa::v1::PolicyChunk>* writer) {
  int64_t sent = request->known_version();
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch_known_versions_.push_back(sent);
  }
  cv_.notify_all();
  size_t next = 0;
  while (!context->IsCancelled()) {
    std::vector<kappa::v1::PolicyChunk> chunks;
    int64_t version = -1;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kPoll, [&] { return closed_ || next < versions_.size(); });
      if (closed_) break;
      if (next >= versions_.size()) continue;
      version = versions_[next].first;
      chunks = versions_[next].second;
      ++next;
    }
    if (version <= sent) continue;
    for (const kappa::v1::PolicyChunk& chunk : chunks) {
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
    }
    sent = version;
  }
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake learner closed the stream");
}

}  // namespace kappa::rollout::testing
