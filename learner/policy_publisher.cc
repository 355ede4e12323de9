#include "learner/policy_publisher.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "base/stable_hash.h"

namespace kappa::learner {
namespace {

using base::SplitMix64;

uint64_t RandomNonce() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device() ^
         static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
}

int64_t TensorBytes(const torch::Tensor& tensor) {
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

std::shared_ptr<const EncodedDelta> ComputeDelta(std::shared_ptr<const EncodedPolicy> target,
                                                 const EncodedPolicy& base,
                                                 const PublisherOptions& options) {
  auto delta = std::make_shared<EncodedDelta>();
  delta->base_version = base.version;
  delta->base_policy_id = base.policy_id;
  std::unordered_map<std::string, const torch::Tensor*> base_by_name;
  for (const auto& [name, tensor] : base.weights) base_by_name.emplace(name, &tensor);
  const int64_t block = std::max<int64_t>(1, options.delta_block_bytes);
  for (const auto& [name, tensor] : target->weights) {
    EncodedDelta::Parameter parameter;
    auto it = base_by_name.find(name);
    const int64_t total = TensorBytes(tensor);
    if (it == base_by_name.end() || it->second->sizes() != tensor.sizes() ||
        it->second->scalar_type() != tensor.scalar_type()) {
      parameter.raw = true;
      delta->bytes += total;
      delta->parameters.push_back(std::move(parameter));
      continue;
    }
    const char* now = static_cast<const char*>(tensor.data_ptr());
    const char* before = static_cast<const char*>(it->second->data_ptr());
    std::vector<EncodedDelta::Segment>& segments = parameter.segments;
    if (now == before) {  // one tensor in both versions (a frozen weight)
      if (total > 0) segments.push_back({0, total, true, 0});
      delta->parameters.push_back(std::move(parameter));
      continue;
    }
    for (int64_t offset = 0; offset < total;) {
      const int64_t size = std::min(block, total - offset);
      const bool same = std::memcmp(now + offset, before + offset, static_cast<size_t>(size)) == 0;
      if (same) {
        if (!segments.empty() && segments.back().unchanged) {
          segments.back().size += size;
        } else {
          segments.push_back({offset, size, true, 0});
        }
      } else {
        const int64_t at = static_cast<int64_t>(parameter.xor_bytes.size());
        parameter.xor_bytes.resize(static_cast<size_t>(at + size));
        XorBytes(now + offset, before + offset, size, parameter.xor_bytes.data() + at);
        if (!segments.empty() && !segments.back().unchanged &&
            segments.back().size + size <= options.max_chunk_bytes) {
          segments.back().size += size;
        } else {
          segments.push_back({offset, size, false, at});
        }
        delta->bytes += size;
      }
      offset += size;
    }
    delta->parameters.push_back(std::move(parameter));
  }
  delta->target = std::move(target);
  return delta;
}

}  // namespace

bool XorBytes(const char* a, const char* b, int64_t size, char* out) {
  uint64_t any = 0;
  int64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    x ^= y;
    any |= x;
    std::memcpy(out + i, &x, 8);
  }
  for (; i < size; ++i) {
    out[i] = static_cast<char>(a[i] ^ b[i]);
    any |= static_cast<unsigned char>(out[i]);
  }
  return any == 0;
}

PolicyPublisher::PolicyPublisher() : PolicyPublisher(PublisherOptions{}) {}

PolicyPublisher::PolicyPublisher(PublisherOptions options)
    : options_(std::move(options)),
      nonce_(RandomNonce()),
      shm_(options_.shm_dir.empty() ? nullptr
                                    : std::make_unique<ShmPolicyStore>(options_.shm_dir)) {}

uint64_t PolicyPublisher::PolicyId(int64_t version) const {
  return SplitMix64(nonce_ ^ SplitMix64(static_cast<uint64_t>(version)));
}

void PolicyPublisher::Publish(std::shared_ptr<const PolicySnapshot> snapshot) {
  // The old encodings are released outside the lock (they may be large).
  VersionSlots released;
  {
    absl::MutexLock lock(&mu_);
    if (options_.keep_delta_bases) {
      released = std::move(base_slots_);
      base_slots_ = std::move(latest_slots_);
    } else {
      released = std::move(latest_slots_);
    }
    latest_slots_ = VersionSlots{snapshot, {}};
    latest_ = std::move(snapshot);
    published_.SignalAll();
  }
}

std::shared_ptr<const PolicySnapshot> PolicyPublisher::WaitNewer(int64_t known_version,
                                                                 absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!shutdown_ && (latest_ == nullptr || latest_->version <= known_version)) {
    if (published_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  if (shutdown_ || latest_ == nullptr || latest_->version <= known_version) return nullptr;
  return latest_;
}

void PolicyPublisher::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    published_.SignalAll();
  }
  if (shm_ != nullptr) shm_->UnlinkAll();
}

const std::string& PolicyPublisher::shm_host_key() const {
  static const std::string kNone;
  return shm_ != nullptr ? shm_->host_key() : kNone;
}

bool PolicyPublisher::shut_down() const {
  absl::MutexLock lock(&mu_);
  return shutdown_;
}

int64_t PolicyPublisher::version() const {
  absl::MutexLock lock(&mu_);
  return latest_ == nullptr ? -1 : latest_->version;
}

int64_t PolicyPublisher::encodings_made() const {
  absl::MutexLock lock(&mu_);
  return encodings_made_;
}

std::shared_ptr<PolicyPublisher::Slot> PolicyPublisher::SlotFor(
    const std::shared_ptr<const PolicySnapshot>& snapshot, torch::ScalarType dtype) {
  absl::MutexLock lock(&mu_);
  for (VersionSlots* slots : {&latest_slots_, &base_slots_}) {
    if (slots->snapshot == snapshot) {
      std::shared_ptr<Slot>& slot = slots->by_dtype[static_cast<int>(dtype)];
      if (slot == nullptr) slot = std::make_shared<Slot>();
      return slot;
    }
  }
  return std::make_shared<Slot>();
}

std::shared_ptr<const EncodedPolicy> PolicyPublisher::EncodeInto(Slot& slot,
                                                                 const PolicySnapshot& snapshot,
                                                                 torch::ScalarType dtype) {
  absl::MutexLock lock(&slot.mu);
  return EncodeLocked(slot, snapshot, dtype);
}

std::shared_ptr<const EncodedPolicy> PolicyPublisher::EncodeLocked(Slot& slot,
                                                                   const PolicySnapshot& snapshot,
                                                                   torch::ScalarType dtype) {
  if (slot.encoded != nullptr) return slot.encoded;
  auto encoded = std::make_shared<EncodedPolicy>();
  encoded->version = snapshot.version;
  encoded->policy_id = PolicyId(snapshot.version);
  encoded->model_config_json = snapshot.model_config_json;
  encoded->adapter_config_json = snapshot.adapter_config_json;
  encoded->dtype = dtype;
  encoded->weights.reserve(snapshot.weights.size());
  for (size_t i = 0; i < snapshot.weights.size(); ++i) {
    const auto& [name, tensor] = snapshot.weights[i];
    torch::Tensor wire = tensor;
    if (wire.device() != torch::kCPU || wire.scalar_type() != dtype || !wire.is_contiguous()) {
      wire = static_cast<int64_t>(i) < snapshot.frozen_weights
                 ? FrozenEncoding(tensor, dtype)
                 : tensor.to(torch::kCPU, dtype).contiguous();
    }
    encoded->bytes += TensorBytes(wire);
    encoded->weights.emplace_back(name, std::move(wire));
  }
  slot.encoded = encoded;
  {
    absl::MutexLock count_lock(&mu_);
    ++encodings_made_;
  }
  return encoded;
}

torch::Tensor PolicyPublisher::FrozenEncoding(const torch::Tensor& frozen,
                                              torch::ScalarType dtype) {
  absl::MutexLock lock(&frozen_mu_);
  auto& entry = frozen_encodings_[{frozen.data_ptr(), static_cast<int>(dtype)}];
  if (!entry.second.defined()) entry = {frozen, frozen.to(torch::kCPU, dtype).contiguous()};
  return entry.second;
}

void PolicyPublisher::CheckDtype(const PolicySnapshot& snapshot, torch::ScalarType dtype) {
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16) {
    throw std::invalid_argument(std::string("policy weights cannot travel as ") +
                                c10::toString(dtype) + " (float32 or bfloat16)");
  }
  if (dtype == torch::kFloat32 && snapshot.dtype == torch::kBFloat16) {
    throw std::invalid_argument(
        "policy weights cannot travel as float32: this learner keeps bfloat16 snapshots "
        "(rollout.weights_dtype)");
  }
}

std::shared_ptr<const EncodedPolicy> PolicyPublisher::Encode(
    const std::shared_ptr<const PolicySnapshot>& snapshot, torch::ScalarType dtype) {
  CheckDtype(*snapshot, dtype);
  std::shared_ptr<Slot> slot = SlotFor(snapshot, dtype);
  return EncodeInto(*slot, *snapshot, dtype);
}

absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> PolicyPublisher::Shm(
    const std::shared_ptr<const PolicySnapshot>& snapshot, torch::ScalarType dtype) {
  CheckDtype(*snapshot, dtype);
  if (shm_ == nullptr) return absl::FailedPreconditionError("no shared-memory directory");
  std::shared_ptr<Slot> slot = SlotFor(snapshot, dtype);
  absl::MutexLock lock(&slot->mu);
  if (slot->shm != nullptr) return slot->shm;
  if (!slot->shm_error.ok()) return slot->shm_error;
  absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> segment =
      ShmLocked(*slot, *snapshot, dtype);
  if (segment.ok()) {
    slot->shm = *segment;
  } else {
    slot->shm_error = segment.status();
  }
  return segment;
}

absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> PolicyPublisher::ShmLocked(
    Slot& slot, const PolicySnapshot& snapshot, torch::ScalarType dtype) {
  dist::ShmContent content;
  content.version = snapshot.version;
  content.policy_id = PolicyId(snapshot.version);
  content.model_config_json = snapshot.model_config_json;
  content.dtype = dtype;
  // No encoding yet and a conversion to make: convert straight into the
  // segment, and let the encoding (for gRPC streams) view it.
  if (slot.encoded == nullptr && snapshot.dtype != dtype) {
    content.weights = &snapshot.weights;
    absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> segment = shm_->Write(content);
    if (!segment.ok()) return segment;
    auto encoded = std::make_shared<EncodedPolicy>();
    encoded->version = snapshot.version;
    encoded->policy_id = content.policy_id;
    encoded->model_config_json = snapshot.model_config_json;
    encoded->adapter_config_json = snapshot.adapter_config_json;
    encoded->dtype = dtype;
    encoded->weights = (*segment)->views();
    for (const auto& [name, tensor] : encoded->weights) encoded->bytes += TensorBytes(tensor);
    encoded->segment = *segment;
    slot.encoded = std::move(encoded);
    absl::MutexLock count_lock(&mu_);
    ++encodings_made_;
    return segment;
  }
  const std::shared_ptr<const EncodedPolicy> encoded = EncodeLocked(slot, snapshot, dtype);
  content.weights = &encoded->weights;
  return shm_->Write(content);
}

std::shared_ptr<const EncodedDelta> PolicyPublisher::Delta(
    const std::shared_ptr<const PolicySnapshot>& snapshot, torch::ScalarType dtype,
    int64_t base_version, uint64_t base_policy_id) {
  if (!options_.keep_delta_bases || base_version < 0 || base_policy_id != PolicyId(base_version)) {
    return nullptr;
  }
  std::shared_ptr<Slot> base_slot;
  std::shared_ptr<const PolicySnapshot> base_snapshot;
  std::shared_ptr<Slot> target_slot;
  {
    absl::MutexLock lock(&mu_);
    if (latest_slots_.snapshot != snapshot || base_slots_.snapshot == nullptr ||
        base_slots_.snapshot->version != base_version) {
      return nullptr;
    }
    auto it = base_slots_.by_dtype.find(static_cast<int>(dtype));
    // A base nobody received in this dtype: no worker holds it.
    if (it == base_slots_.by_dtype.end()) return nullptr;
    base_slot = it->second;
    base_snapshot = base_slots_.snapshot;
  }
  std::shared_ptr<const EncodedPolicy> base = EncodeInto(*base_slot, *base_snapshot, dtype);
  target_slot = SlotFor(snapshot, dtype);
  std::shared_ptr<const EncodedPolicy> target = EncodeInto(*target_slot, *snapshot, dtype);
  absl::MutexLock lock(&target_slot->mu);
  if (target_slot->delta == nullptr || target_slot->delta_base_version != base_version) {
    target_slot->delta = ComputeDelta(std::move(target), *base, options_);
    target_slot->delta_base_version = base_version;
  }
  return target_slot->delta;
}

}  // namespace kappa::learner
