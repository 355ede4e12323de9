#include "rollout_worker/policy_watcher.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <exception>
#include <utility>

#include "base/status.h"
#include "dist/shm_segment.h"
#include "model/checkpoint.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "model/transformer.h"
#include "rollout_worker/backoff.h"
#include "rollout_worker/policy_assembler.h"
#include "services/torch_tensor_codec.h"

namespace kappa::rollout {
namespace {

// Whether a model held in `held` gives the `wire` bytes of its version
// exactly (the delta base must be those bytes).
bool ReproducesWireBytes(c10::ScalarType held, c10::ScalarType wire) {
  return held == wire || (wire == c10::kBFloat16 && held == c10::kFloat);
}

// This host's shared-memory key when `sync` takes segments; empty otherwise
// (and when it cannot be read: then the worker asks for chunks).
std::string ShmHostKeyFor(const WeightSyncOptions& sync) {
  if (sync.shm == WeightSyncOptions::Shm::kOff) return "";
  absl::StatusOr<std::string> key = dist::ShmHostKey(sync.shm_dir);
  if (!key.ok()) {
    spdlog::warn("shared-memory weight sync unavailable ({}); versions come as gRPC chunks",
                 key.status().ToString());
    return "";
  }
  return *std::move(key);
}

}  // namespace

std::optional<c10::ScalarType> WeightsDtype(services::ModelDtype dtype) {
  switch (dtype) {
    case services::ModelDtype::kAuto:
      return std::nullopt;
    case services::ModelDtype::kFloat32:
      return c10::kFloat;
    case services::ModelDtype::kBFloat16:
      return c10::kBFloat16;
  }
  throw std::logic_error("unreachable");
}

void SetWeightTransport(services::WeightTransport transport, WeightSyncOptions* sync) {
  using Shm = WeightSyncOptions::Shm;
  using services::WeightTransport;
  sync->c10d = transport == WeightTransport::kC10d;
  sync->shm = transport == WeightTransport::kShm    ? Shm::kRequired
              : transport == WeightTransport::kAuto ? Shm::kAuto
                                                    : Shm::kOff;
}

c10::ScalarType WireDtype(const WeightSyncOptions& sync, c10::ScalarType dtype) {
  if (sync.weights_dtype) return *sync.weights_dtype;
  return dtype == c10::kBFloat16 ? c10::kBFloat16 : c10::kFloat;
}

PolicyWatcher::PolicyWatcher(std::shared_ptr<grpc::ChannelInterface> learner_channel,
                             PolicyWatcherOptions options, WeightSyncOptions sync)
    : stub_(kappa::v1::Learner::NewStub(std::move(learner_channel))),
      options_(std::move(options)),
      sync_(sync),
      shm_host_key_(ShmHostKeyFor(sync_)) {}

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
    return ready() || stopping_ || !fatal_.ok();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready_or_stopping), deadline);
  if (ready()) return current_;
  if (!fatal_.ok()) return fatal_;
  if (stopping_) return absl::CancelledError("policy watcher stopped");
  return absl::DeadlineExceededError("no policy version >= " + std::to_string(min_version) +
                                     " yet (have " + std::to_string(current_.version) + ")");
}

Policy PolicyWatcher::Publish(Policy policy, uint64_t policy_id) {
  // The release wakes the WaitForVersion() calls this version satisfies, so
  // the count goes up first: a caller that sees the version sees it counted.
  absl::MutexLock lock(&mu_);
  std::swap(current_, policy);
  current_policy_id_ = policy_id;
  published_versions_.fetch_add(1);
  return policy;
}

void PolicyWatcher::PublishSpare(int64_t version, uint64_t policy_id) {
  Policy previous = Publish(Policy{version, spare_}, policy_id);
  std::swap(current_config_json_, spare_config_json_);
  spare_ = std::move(previous.model);
  if (spare_ == nullptr) spare_config_json_.clear();
}

absl::Status PolicyWatcher::fatal_status() const {
  absl::MutexLock lock(&mu_);
  return fatal_;
}

bool PolicyWatcher::WaitForStop(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), timeout);
  return stopping_;
}

absl::StatusOr<std::map<std::string, torch::Tensor>> PolicyWatcher::Destination(
    const std::string& model_config_json, const std::string& adapter_config_json) {
  // A config the learner sent that does not build is bad input, whatever threw.
  return base::CaptureExceptions(
      "",
      [&] {
        // use_count() == 1: only this thread holds it (samplers get models
        // only through current_, and this one is not current), so nobody
        // can take a new reference while it is written.
        const std::string configs = model_config_json + '\n' + adapter_config_json;
        if (spare_ == nullptr || spare_.use_count() != 1 || spare_config_json_ != configs) {
          spare_.reset();  // a sampler's reference keeps the old one alive
          const model::ModelConfig config = model::ModelConfig::FromJson(model_config_json);
          // No random initialization: every parameter is written before use.
          // Built piece by piece on the device in its dtype (no float32 copy).
          auto decoder = std::make_shared<model::Decoder>(
              config, /*random_init=*/false, model::Placement{options_.device, options_.dtype});
          if (!adapter_config_json.empty()) {
            (*decoder)->EnableLora(
                model::ParseAdapterConfig(adapter_config_json, "adapter_config_json").lora);
            model::CastAdapters(*decoder, options_.dtype);
          }
          (*decoder)->eval();
          for (auto& parameter : (*decoder)->parameters()) parameter.set_requires_grad(false);
          spare_ = std::move(decoder);
          spare_config_json_ = configs;
          models_allocated_.fetch_add(1);
        }
        return model::PolicyTensors(*spare_);
      },
      absl::StatusCode::kInvalidArgument);
}

void PolicyWatcher::Loop() {
  if (sync_.c10d) ReceiveFromGroup();
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  while (true) {
    const int64_t published_before = published_versions_.load();
    const grpc::Status status = WatchOnce();
    if (WaitForStop(absl::ZeroDuration())) return;
    if (sync_.shm == WeightSyncOptions::Shm::kRequired &&
        status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // The learner cannot serve shared memory to this worker: retrying
      // will not change that.
      spdlog::error("WatchPolicy refused: {}", status.error_message());
      absl::MutexLock lock(&mu_);
      fatal_ = absl::FailedPreconditionError(status.error_message());
      return;
    }
    if (published_versions_.load() != published_before) backoff.Reset();
    const absl::Duration delay = backoff.Next();
    spdlog::warn("WatchPolicy stream ended ({}: {}); reconnecting in {:.0f} ms",
                 static_cast<int>(status.error_code()), status.error_message(),
                 absl::ToDoubleMilliseconds(delay));
    if (WaitForStop(delay)) return;
  }
}

grpc::Status PolicyWatcher::WatchOnce() {
  grpc::ClientContext context;
  kappa::v1::WatchPolicyRequest request;
  const c10::ScalarType wire = WireDtype(sync_, options_.dtype);
  PolicyAssembler assembler([this](int64_t, const std::string& model_config_json,
                                   const std::string& adapter_config_json) {
    return Destination(model_config_json, adapter_config_json);
  });
  // Deltas apply to the published model (read only; the inactive copy is
  // another model).
  const auto set_base = [&](const Policy& policy, uint64_t policy_id) {
    if (policy.model == nullptr) return;
    assembler.SetBase(PolicyBase{policy.version, policy_id, model::PolicyTensors(*policy.model)});
  };
  const bool offer_delta =
      (sync_.weight_delta || sync_.lora_adapters) && ReproducesWireBytes(options_.dtype, wire);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status::CANCELLED;
    active_context_ = &context;
    request.set_known_version(current_.version);
    // Also without a version yet: the stream's later versions may then be
    // deltas against the ones it sent.
    if (offer_delta) {
      request.set_accept_delta(true);
      request.set_known_policy_id(current_policy_id_);
      set_base(current_, current_policy_id_);
    }
  }
  request.set_worker_id(options_.worker_id);
  request.set_weights_dtype(services::ToWireDType(wire));
  // Shared memory unless the previous stream's segment failed (then this
  // stream takes chunks, and the next one tries again).
  const bool offer_shm = !shm_host_key_.empty() && !shm_suspended_;
  shm_suspended_ = false;
  if (offer_shm) {
    request.set_accept_shm(true);
    request.set_host_key(shm_host_key_);
    request.set_require_shm(sync_.shm == WeightSyncOptions::Shm::kRequired);
  } else if (sync_.shm == WeightSyncOptions::Shm::kRequired && shm_host_key_.empty()) {
    // This worker cannot read its own /dev/shm: the learner refuses it by name.
    request.set_require_shm(true);
  }
  std::unique_ptr<grpc::ClientReaderInterface<kappa::v1::PolicyChunk>> reader =
      stub_->WatchPolicy(&context, request);

  kappa::v1::PolicyChunk chunk;
  absl::Time start = absl::Now();
  while (reader->Read(&chunk)) {
    if (chunk.version() <= Current().version) continue;  // already have it
    if (chunk.encoding() == kappa::v1::PolicyChunk::SHARED_MEMORY) {
      start = absl::Now();
      assembler.Reset();
      if (absl::Status loaded = LoadFromShm(chunk); !loaded.ok()) {
        rejected_versions_.fetch_add(1);
        shm_failures_.fetch_add(1);
        spdlog::warn(
            "policy version {}: shared-memory segment not used ({}); reconnecting for gRPC "
            "chunks",
            chunk.version(), loaded.ToString());
        shm_suspended_ = true;
        context.TryCancel();
        break;
      }
      if (offer_delta) set_base(Current(), chunk.policy_id());
      spdlog::info("policy version {} loaded on {} from shared memory ({} bytes, {:.1f} ms)",
                   chunk.version(), options_.device.str(), chunk.shm_bytes(),
                   absl::ToDoubleMilliseconds(absl::Now() - start));
      continue;
    }
    if (assembler.pending_version() != chunk.version()) start = absl::Now();
    absl::StatusOr<std::optional<AssembledPolicy>> added = assembler.Add(chunk);
    if (!added.ok()) {
      rejected_versions_.fetch_add(1);
      spdlog::error("{}", std::string(added.status().message()));
      // The learner thinks this stream holds what it sent; with deltas a
      // fresh stream states the version actually held.
      if (offer_delta) {
        context.TryCancel();
        break;
      }
      continue;
    }
    if (!added->has_value()) continue;
    const AssembledPolicy& assembled = **added;
    // Every parameter of spare_ was written; it becomes current, and the
    // model it replaces becomes the next inactive copy.
    // (Counted first: a caller woken by the version sees them.)
    if (assembled.delta) delta_versions_.fetch_add(1);
    bytes_received_.fetch_add(assembled.data_bytes);
    PublishSpare(assembled.version, assembled.policy_id);
    if (offer_delta) set_base(Current(), assembled.policy_id);
    spdlog::info("policy version {} loaded on {} ({} parameters, {} {} bytes{}, {:.1f} ms)",
                 assembled.version, options_.device.str(), assembled.weights.size(),
                 assembled.data_bytes, c10::toString(wire), assembled.delta ? " as a delta" : "",
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
