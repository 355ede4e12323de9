#include "rollout_worker/policy_watcher.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <utility>

#include "model/checkpoint.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "rollout_worker/backoff.h"
#include "rollout_worker/policy_assembler.h"
#include "services/status_util.h"

namespace kappa::rollout {
namespace {

// The assembled weights are CPU tensors; the decoder is loaded there and then
// moved to `device` whole (weights and buffers, in `dtype`), so samplers see
// it only there.
absl::StatusOr<std::shared_ptr<model::Decoder>> BuildDecoder(const AssembledPolicy& policy,
                                                             const c10::Device& device,
                                                             c10::ScalarType dtype) {
  // A policy the learner sent that does not load is bad input, whatever threw.
  return services::CaptureExceptions(
      "",
      [&] {
        const model::ModelConfig config = model::ModelConfig::FromJson(policy.model_config_json);
        auto decoder = std::make_shared<model::Decoder>(config);
        model::LoadWeights(*decoder, policy.weights);
        (*decoder)->to(device, dtype);
        (*decoder)->eval();
        for (auto& parameter : (*decoder)->parameters()) parameter.set_requires_grad(false);
        return decoder;
      },
      absl::StatusCode::kInvalidArgument);
}

}  // namespace

PolicyWatcher::PolicyWatcher(std::shared_ptr<grpc::ChannelInterface> learner_channel,
                             PolicyWatcherOptions options)
    : stub_(kappa::v1::Learner::NewStub(std::move(learner_channel))),
      options_(std::move(options)) {}

PolicyWatcher::~PolicyWatcher() { Stop(); }

void PolicyWatcher::Start() {
  absl::MutexLock thread_lock(&thread_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void PolicyWatcher::Stop() {
  {
    // The release wakes every wait (their conditions read stopping_).
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (active_context_ != nullptr) active_context_->TryCancel();
  }
  // Several threads may Stop() at once (e.g. a signal handler thread and the
  // owner's shutdown path); exactly one joins, the others wait for it.
  absl::MutexLock thread_lock(&thread_mu_);
  if (thread_.joinable()) thread_.join();
}

Policy PolicyWatcher::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

absl::StatusOr<Policy> PolicyWatcher::WaitForVersion(int64_t min_version,
                                                     absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  const auto ready = [this, min_version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return current_.model != nullptr && current_.version >= min_version;
  };
  const auto ready_or_stopping = [this, &ready]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ready() || stopping_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready_or_stopping), deadline);
  if (ready()) return current_;
  if (stopping_) return absl::CancelledError("policy watcher stopped");
  return absl::DeadlineExceededError("no policy version >= " + std::to_string(min_version) +
                                     " yet (have " + std::to_string(current_.version) + ")");
}

void PolicyWatcher::Publish(Policy policy) {
  // The release wakes the WaitForVersion() calls this version satisfies, so
  // the count goes up first: a caller that sees the version sees it counted.
  absl::MutexLock lock(&mu_);
  current_ = std::move(policy);
  published_versions_.fetch_add(1);
}

void PolicyWatcher::Loop() {
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  while (true) {
    const int64_t published_before = published_versions_.load();
    const grpc::Status status = WatchOnce();
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (published_versions_.load() != published_before) backoff.Reset();
    const absl::Duration delay = backoff.Next();
    spdlog::warn("WatchPolicy stream ended ({}: {}); reconnecting in {:.0f} ms",
                 static_cast<int>(status.error_code()), status.error_message(),
                 absl::ToDoubleMilliseconds(delay));
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), delay);
    if (stopping_) return;
  }
}

grpc::Status PolicyWatcher::WatchOnce() {
  grpc::ClientContext context;
  kappa::v1::WatchPolicyRequest request;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status::CANCELLED;
    active_context_ = &context;
    request.set_known_version(current_.version);
  }
  request.set_worker_id(options_.worker_id);
  std::unique_ptr<grpc::ClientReaderInterface<kappa::v1::PolicyChunk>> reader =
      stub_->WatchPolicy(&context, request);

  PolicyAssembler assembler;
  kappa::v1::PolicyChunk chunk;
  while (reader->Read(&chunk)) {
    if (chunk.version() <= Current().version) continue;  // already have it
    absl::StatusOr<std::optional<AssembledPolicy>> added = assembler.Add(chunk);
    if (!added.ok()) {
      rejected_versions_.fetch_add(1);
      spdlog::error("{}", std::string(added.status().message()));
      continue;
    }
    if (!added->has_value()) continue;
    const AssembledPolicy& assembled = **added;
    const absl::Time start = absl::Now();
    absl::StatusOr<std::shared_ptr<model::Decoder>> decoder =
        BuildDecoder(assembled, options_.device, options_.dtype);
    if (!decoder.ok()) {
      rejected_versions_.fetch_add(1);
      spdlog::error("policy version {} discarded: cannot load weights: {}", assembled.version,
                    std::string(decoder.status().message()));
      continue;
    }
    Publish(Policy{assembled.version, *std::move(decoder)});
    spdlog::info("policy version {} loaded on {} ({} parameters, {:.1f} ms)", assembled.version,
                 options_.device.str(), assembled.weights.size(),
                 absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  if (assembler.pending_version() >= 0) {
    spdlog::error("policy version {} discarded: stream ended mid-version",
                  assembler.pending_version());
  }
  const grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  active_context_ = nullptr;
  return status;
}

}  // namespace kappa::rollout
