#include "rollout_worker/policy_assembler.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cstring>
#include <exception>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/tensor_codec.h"
#include "services/torch_tensor_codec.h"

namespace kappa::rollout {
namespace {

// Far above any model kappa trains; guards the allocation against a corrupt shape.
constexpr int64_t kMaxParameterBytes = int64_t{1} << 36;

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The integer type of the same width, to XOR a floating tensor's bits.
torch::ScalarType BitsType(int64_t element_bytes) {
  switch (element_bytes) {
    case 1:
      return torch::kUInt8;
    case 2:
      return torch::kInt16;
    case 4:
      return torch::kInt32;
    default:
      return torch::kInt64;
  }
}

template <typename Bits>
bool AllFiniteBits(const void* data, int64_t count, Bits mask) {
  const auto* bytes = static_cast<const char*>(data);
  Bits all = 0;
  for (int64_t i = 0; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
    // Non-finite: every exponent bit set. One branch-free pass, then a test.
    all |= static_cast<Bits>(((bits & mask) == mask) ? 1 : 0);
  }
  return all == 0;
}

}  // namespace

bool AllFiniteBytes(const void* data, int64_t bytes, torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return AllFiniteBits<uint32_t>(data, bytes / 4, 0x7f800000u);
    case torch::kBFloat16:
      return AllFiniteBits<uint16_t>(data, bytes / 2, 0x7f80u);
    case torch::kFloat16:
      return AllFiniteBits<uint16_t>(data, bytes / 2, 0x7c00u);
    default:
      return true;
  }
}

void PolicyAssembler::Reset() {
  version_ = -1;
  policy_id_ = 0;
  discarded_ = false;
  delta_ = false;
  data_bytes_ = 0;
  config_json_.clear();
  targets_.clear();
  parameters_.clear();
}

absl::Status PolicyAssembler::Discard(absl::Status why) {
  // Keep version_ so the rest of this version's chunks are recognised and skipped.
  discarded_ = true;
  parameters_.clear();
  targets_.clear();
  config_json_.clear();
  return why;
}

absl::StatusOr<std::optional<AssembledPolicy>> PolicyAssembler::Add(
    const kappa::v1::PolicyChunk& chunk) {
  if (chunk.version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy chunk with negative version ", chunk.version()));
  }
  if (version_ >= 0 && chunk.version() != version_) {
    if (!discarded_) {
      spdlog::error("policy version {} discarded: incomplete ({} parameters received) when "
                    "a chunk of version {} arrived",
                    version_, parameters_.size(), chunk.version());
    }
    Reset();
  }
  if (discarded_) {
    if (chunk.last_of_version()) Reset();
    return std::optional<AssembledPolicy>();
  }
  if (version_ < 0) {  // first chunk of a version
    version_ = chunk.version();
    policy_id_ = chunk.policy_id();
    config_json_ = chunk.model_config_json().empty() ? last_config_json_
                                                     : chunk.model_config_json();
    adapter_json_ = chunk.adapter_config_json();
    absl::Status error;
    if (config_json_.empty()) {
      error = absl::InvalidArgumentError(
          absl::StrCat("policy version ", version_, ": first chunk carries no model_config_json"));
    } else if (destination_) {
      absl::StatusOr<std::map<std::string, torch::Tensor>> targets =
          destination_(version_, config_json_, adapter_json_);
      if (targets.ok()) {
        targets_ = *std::move(targets);
      } else {
        error = absl::InvalidArgumentError(
            absl::StrCat("policy version ", version_, " discarded: ", targets.status().message()));
      }
    }
    if (!error.ok()) {
      error = Discard(std::move(error));
      if (chunk.last_of_version()) Reset();
      return error;
    }
  }
  if (absl::Status status = AddToParameter(chunk); !status.ok()) {
    absl::Status error = Discard(absl::InvalidArgumentError(
        absl::StrCat("policy version ", version_, " discarded: ", status.message())));
    if (chunk.last_of_version()) Reset();
    return error;
  }
  if (!chunk.last_of_version()) return std::optional<AssembledPolicy>();

  absl::StatusOr<AssembledPolicy> finished = Finish(chunk);
  Reset();
  if (!finished.ok()) return finished.status();
  last_config_json_ = finished->model_config_json;
  return std::optional<AssembledPolicy>(std::move(*finished));
}

absl::Status PolicyAssembler::AddToParameter(const kappa::v1::PolicyChunk& chunk) {
  if (chunk.name().empty()) {
    if (chunk.last_of_version() && chunk.data().empty() &&
        chunk.encoding() == kappa::v1::PolicyChunk::RAW) {
      return absl::OkStatus();  // end marker
    }
    return absl::InvalidArgumentError("chunk without a parameter name");
  }
  if (chunk.policy_id() != policy_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", chunk.name(), "': policy_id differs from the first chunk's"));
  }
  const std::string field = absl::StrCat("parameter '", chunk.name(), "'");
  auto it = parameters_.find(chunk.name());
  if (it == parameters_.end()) {
    absl::StatusOr<torch::ScalarType> type = services::ToTorchDType(chunk.dtype());
    const size_t element_bytes = services::DTypeSize(chunk.dtype());
    if (!type.ok() || element_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown dtype ", static_cast<int>(chunk.dtype())));
    }
    int64_t total = static_cast<int64_t>(element_bytes);
    std::vector<int64_t> shape;
    for (int64_t dim : chunk.shape()) {
      if (dim < 0 || (dim > 0 && total > kMaxParameterBytes / dim)) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": invalid shape ", ShapeString(chunk.shape())));
      }
      total *= dim;
      shape.push_back(dim);
    }
    Parameter parameter;
    if (destination_) {
      auto target = targets_.find(chunk.name());
      if (target == targets_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": not a parameter of the model (config.json)"));
      }
      if (target->second.sizes().vec() != shape) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeString(shape),
                                                       " differs from the model's ",
                                                       ShapeString(target->second.sizes().vec())));
      }
      if (!target->second.is_contiguous()) {
        return absl::InternalError(absl::StrCat(field, ": destination is not contiguous"));
      }
      parameter.tensor = target->second;
    } else {
      parameter.tensor = torch::empty(shape, torch::TensorOptions().dtype(*type));
    }
    parameter.flat = parameter.tensor.view({-1});
    parameter.wire_dtype = *type;
    parameter.element_bytes = static_cast<int64_t>(element_bytes);
    parameter.shape = std::move(shape);
    parameter.total_bytes = total;
    parameter.direct =
        parameter.tensor.device().is_cpu() && parameter.tensor.scalar_type() == *type;
    it = parameters_.emplace(chunk.name(), std::move(parameter)).first;
  } else {
    const Parameter& existing = it->second;
    absl::StatusOr<torch::ScalarType> type = services::ToTorchDType(chunk.dtype());
    if (!type.ok() || *type != existing.wire_dtype ||
        existing.shape != std::vector<int64_t>(chunk.shape().begin(), chunk.shape().end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": dtype/shape ", static_cast<int>(chunk.dtype()), " ",
          ShapeString(chunk.shape()), " differ from its first chunk"));
    }
  }
  Parameter& parameter = it->second;
  const int64_t begin = chunk.byte_offset();
  int64_t size = static_cast<int64_t>(chunk.data().size());
  switch (chunk.encoding()) {
    case kappa::v1::PolicyChunk::RAW:
      break;
    case kappa::v1::PolicyChunk::UNCHANGED:
      if (size != 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": an UNCHANGED chunk with data"));
      }
      size = chunk.span_bytes();
      [[fallthrough]];
    case kappa::v1::PolicyChunk::XOR:
      if (base_.version < 0 || chunk.base_version() != base_.version ||
          chunk.base_policy_id() != base_.policy_id) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": a delta against version ", chunk.base_version(),
            base_.version < 0 ? std::string(", and this worker holds no base version")
                              : absl::StrCat(", but this worker holds version ", base_.version,
                                             chunk.base_version() == base_.version
                                                 ? " with other weights (policy_id differs)"
                                                 : "")));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown encoding ", static_cast<int>(chunk.encoding())));
  }
  if (begin < 0 || size < 0 || begin > parameter.total_bytes ||
      size > parameter.total_bytes - begin) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": bytes [", begin, ", ", begin + size, ") beyond its ",
                     parameter.total_bytes, " bytes (shape ", ShapeString(chunk.shape()), ")"));
  }
  if (begin % parameter.element_bytes != 0 || size % parameter.element_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": bytes [", begin, ", ", begin + size,
                                                   ") not aligned to its ", parameter.element_bytes,
                                                   "-byte elements"));
  }
  if (size == 0) return absl::OkStatus();
  const int64_t end = begin + size;
  auto next = parameter.ranges.lower_bound(begin);
  if (next != parameter.ranges.end() && next->first < end) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": chunk at byte ", begin, " overlaps earlier data"));
  }
  if (next != parameter.ranges.begin() && std::prev(next)->second > begin) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": chunk at byte ", begin, " overlaps earlier data"));
  }
  if (absl::Status written = Write(parameter, chunk, field, begin, size); !written.ok()) {
    return written;
  }
  parameter.ranges.emplace(begin, end);
  parameter.received_bytes += size;
  data_bytes_ += static_cast<int64_t>(chunk.data().size());
  if (chunk.encoding() != kappa::v1::PolicyChunk::RAW) delta_ = true;
  return absl::OkStatus();
}

absl::Status PolicyAssembler::Write(Parameter& parameter, const kappa::v1::PolicyChunk& chunk,
                                    const std::string& field, int64_t begin, int64_t size) {
  const int64_t first = begin / parameter.element_bytes;
  const int64_t count = size / parameter.element_bytes;
  const auto non_finite = [&] {
    return absl::InvalidArgumentError(absl::StrCat(field, " has non-finite values"));
  };
  try {
    torch::NoGradGuard no_grad;
    if (chunk.encoding() == kappa::v1::PolicyChunk::RAW) {
      if (!AllFiniteBytes(chunk.data().data(), size, parameter.wire_dtype)) return non_finite();
      if (parameter.direct) {
        std::memcpy(static_cast<char*>(parameter.tensor.data_ptr()) + begin, chunk.data().data(),
                    static_cast<size_t>(size));
      } else {
        const torch::Tensor source =
            torch::from_blob(const_cast<char*>(chunk.data().data()), {count},
                             torch::TensorOptions().dtype(parameter.wire_dtype));
        parameter.flat.narrow(0, first, count).copy_(source);
      }
      return absl::OkStatus();
    }
    auto base = base_.weights.find(chunk.name());
    if (base == base_.weights.end() || base->second.numel() != parameter.flat.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": a delta, but the base version has no such parameter"));
    }
    const torch::Tensor base_range = base->second.reshape({-1}).narrow(0, first, count);
    if (chunk.encoding() == kappa::v1::PolicyChunk::UNCHANGED) {
      parameter.flat.narrow(0, first, count).copy_(base_range);
      return absl::OkStatus();
    }
    // XOR: the base's bytes in the wire dtype, XOR the chunk's.
    if (parameter.direct && base_range.device().is_cpu() &&
        base_range.scalar_type() == parameter.wire_dtype) {
      const auto* before = static_cast<const char*>(base_range.data_ptr());
      char* out = static_cast<char*>(parameter.tensor.data_ptr()) + begin;
      const char* delta = chunk.data().data();
      for (int64_t i = 0; i < size; i += 8) {
        if (i + 8 <= size) {
          uint64_t x, y;
          std::memcpy(&x, before + i, 8);
          std::memcpy(&y, delta + i, 8);
          x ^= y;
          std::memcpy(out + i, &x, 8);
        } else {
          for (int64_t j = i; j < size; ++j) out[j] = static_cast<char>(before[j] ^ delta[j]);
        }
      }
      if (!AllFiniteBytes(out, size, parameter.wire_dtype)) return non_finite();
      return absl::OkStatus();
    }
    const torch::ScalarType bits = BitsType(parameter.element_bytes);
    const torch::Tensor delta = torch::from_blob(const_cast<char*>(chunk.data().data()), {count},
                                                 torch::TensorOptions().dtype(bits))
                                    .to(base_range.device());
    const torch::Tensor rebuilt =
        torch::bitwise_xor(base_range.to(parameter.wire_dtype).contiguous().view(bits), delta)
            .view(parameter.wire_dtype);
    if (rebuilt.is_floating_point() && !torch::isfinite(rebuilt).all().item<bool>()) {
      return non_finite();
    }
    parameter.flat.narrow(0, first, count).copy_(rebuilt);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": cannot write: ", e.what()));
  }
}

absl::StatusOr<AssembledPolicy> PolicyAssembler::Finish(const kappa::v1::PolicyChunk& last) {
  const std::string prefix = absl::StrCat("policy version ", version_, " discarded: ");
  if (last.num_parameters() > 0 &&
      static_cast<int64_t>(parameters_.size()) != last.num_parameters()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "received ", parameters_.size(),
                                                   " parameters, expected ",
                                                   last.num_parameters()));
  }
  if (parameters_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "no parameters"));
  }
  for (const auto& [name, tensor] : targets_) {
    if (parameters_.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "parameter '", name, "' of the model was not received"));
    }
  }
  AssembledPolicy policy;
  policy.version = version_;
  policy.policy_id = policy_id_;
  policy.model_config_json = config_json_;
  policy.adapter_config_json = adapter_json_;
  policy.delta = delta_;
  policy.data_bytes = data_bytes_;
  for (auto& [name, parameter] : parameters_) {
    if (parameter.received_bytes != parameter.total_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "parameter '", name, "' incomplete: ", parameter.received_bytes,
                       " of ", parameter.total_bytes, " bytes"));
    }
    policy.weights.emplace(name, std::move(parameter.tensor));
  }
  return policy;
}

}  // namespace kappa::rollout
