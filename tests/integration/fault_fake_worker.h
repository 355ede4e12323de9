// A rollout worker inside the test process: it speaks kappa.v1.Learner over a
// real Rollout stream but samples nothing. Each work item is answered at once
// with a group that is a pure function of the prompt (tokens, behaviour
// log-probs, rewards, uniform teacher log-probs), so a test can drive a real
// learner deterministically, or flood it from many clients, without a model,
// a teacher or a verifier.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kappa/v1/learner.grpc.pb.h"
#include "kappa/v1/teacher.pb.h"
#include "services/tensor_codec.h"

namespace kappa::testing {

struct FakeWorkerOptions {
  std::string worker_id = "fake";
  int32_t max_outstanding = 1;
  int64_t vocab_size = 51;  // the character tokenizer's
  // Policy version the groups claim; -1: the one each work item asks for.
  int64_t report_version = -1;
  // Time each group takes, as sampling would (keeps a short run long enough
  // to be interrupted in the middle).
  std::chrono::milliseconds sample_time{0};
  // Sends every group twice (a buggy or replaying client): the learner must
  // drop the copy and count it, or close the stream when credit runs out.
  bool send_twice = false;
  // Changes the n-th group sent (0-based, over all streams) before it goes
  // out: a worker that returns what it was not handed. Null: none.
  std::function<void(int64_t n, kappa::v1::ScoredGroup& group)> tamper;
  // Takes work and never answers (an idle or hostile stream holding slots).
  bool silent = false;
};

struct FakeWorkerStats {
  int64_t connections = 0;
  int64_t items = 0;
  int64_t groups_sent = 0;
};

// The group a worker obeying `item` could have sent, derived from the prompt
// alone. Rewards alternate within the group so advantages are non-zero.
inline kappa::v1::ScoredGroup FakeGroup(const kappa::v1::WorkItem& item, int64_t vocab_size,
                                        int64_t version) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : item.prompt_text()) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  kappa::v1::ScoredGroup group;
  group.set_lease_id(item.lease_id());
  group.set_prompt_id(item.prompt_id());
  *group.mutable_prompt_tokens() = item.prompt_tokens();
  group.set_policy_version(version);
  for (int i = 0; i < item.group_size(); ++i) {
    kappa::v1::ScoredSample* sample = group.add_samples();
    const int64_t length = 1 + static_cast<int64_t>((h >> (4 * (i % 8))) % item.max_new_tokens());
    std::vector<float> behaviour;
    for (int64_t t = 0; t < length; ++t) {
      sample->add_response_tokens(static_cast<int32_t>(3 + (h + 7 * i + 13 * t) % (vocab_size - 3)));
      behaviour.push_back(-1.0f - 0.25f * static_cast<float>((h + i + t) % 8));
    }
    services::SetFloat32(sample->mutable_behavior_logprobs(), {length}, behaviour.data());
    sample->set_reward(static_cast<float>((h + i) % 2));
    const float uniform = -std::log(static_cast<float>(vocab_size));
    if (item.teacher_form() == kappa::v1::SCORE_FORM_FULL) {
      const std::vector<float> full(static_cast<size_t>(length * vocab_size), uniform);
      services::SetFloat32(sample->mutable_teacher_logprobs(), {length, vocab_size}, full.data());
    } else if (item.teacher_form() == kappa::v1::SCORE_FORM_SAMPLED) {
      const std::vector<float> sampled(static_cast<size_t>(length), uniform);
      services::SetFloat32(sample->mutable_teacher_logprobs(), {length}, sampled.data());
    }
  }
  return group;
}

// A channel that reconnects within half a second once its server is back
// (gRPC's default backoff grows to minutes), for tests that restart servers.
inline std::shared_ptr<grpc::Channel> FastReconnectChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// One worker: Start() serves Rollout streams on a thread, reconnecting
// (every 50 ms) when one breaks, until Stop().
class FakeWorker {
 public:
  FakeWorker(std::shared_ptr<grpc::Channel> channel, FakeWorkerOptions options)
      : stub_(kappa::v1::Learner::NewStub(channel)), options_(std::move(options)) {}
  ~FakeWorker() { Stop(); }

  void Start() {
    thread_ = std::thread([this] {
      while (!stopping_) {
        ServeStream();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // reconnect backoff
      }
    });
  }
  void Stop() {
    stopping_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (context_ != nullptr) context_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }
  FakeWorkerStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  void ServeStream() {
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      context_ = &context;
    }
    auto stream = stub_->Rollout(&context);
    kappa::v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(options_.worker_id);
    hello.mutable_hello()->set_max_outstanding(options_.max_outstanding);
    if (stream->Write(hello)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.connections;
      }
      std::deque<kappa::v1::WorkItem> items;
      int64_t credits = 0;
      kappa::v1::LearnerMessage message;
      bool open = true;
      while (open && stream->Read(&message)) {
        if (message.has_work()) {
          items.push_back(message.work());
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.items;
        } else if (message.has_credit()) {
          credits += message.credit().groups();
        }
        while (open && !options_.silent && credits > 0 && !items.empty()) {
          const kappa::v1::WorkItem& item = items.front();
          if (options_.sample_time.count() > 0) std::this_thread::sleep_for(options_.sample_time);
          kappa::v1::WorkerMessage reply;
          *reply.mutable_group() = FakeGroup(
              item, options_.vocab_size,
              options_.report_version >= 0 ? options_.report_version : item.policy_version());
          if (options_.tamper) options_.tamper(tampered_++, *reply.mutable_group());
          open = stream->Write(reply) && (!options_.send_twice || stream->Write(reply));
          if (open) {
            --credits;
            items.pop_front();
            std::lock_guard<std::mutex> lock(mu_);
            ++stats_.groups_sent;
          }
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      context_ = nullptr;
    }
    context.TryCancel();
    stream->Finish();
  }

  std::unique_ptr<kappa::v1::Learner::Stub> stub_;
  const FakeWorkerOptions options_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  grpc::ClientContext* context_ = nullptr;  // guarded by mu_
  FakeWorkerStats stats_;                   // guarded by mu_
  int64_t tampered_ = 0;                    // groups offered to options_.tamper (the thread's)
  std::thread thread_;
};

}  // namespace kappa::testing
