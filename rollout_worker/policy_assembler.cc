#include "rollout_worker/policy_assembler.h"

#include <spdlog/spdlog.h>

#include <cstring>
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

}  // namespace

void PolicyAssembler::Reset() {
  version_ = -1;
  discarded_ = false;
  config_json_.clear();
  parameters_.clear();
}

absl::Status PolicyAssembler::Discard(absl::Status why) {
  // Keep version_ so the rest of this version's chunks are recognised and skipped.
  discarded_ = true;
  parameters_.clear();
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
    config_json_ = chunk.model_config_json().empty() ? last_config_json_
                                                     : chunk.model_config_json();
    if (config_json_.empty()) {
      absl::Status error = Discard(absl::InvalidArgumentError(absl::StrCat(
          "policy version ", version_, ": first chunk carries no model_config_json")));
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
    if (chunk.last_of_version() && chunk.data().empty()) return absl::OkStatus();  // end marker
    return absl::InvalidArgumentError("chunk without a parameter name");
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
    parameter.tensor = torch::empty(shape, torch::TensorOptions().dtype(*type));
    parameter.total_bytes = total;
    it = parameters_.emplace(chunk.name(), std::move(parameter)).first;
  } else {
    const torch::Tensor& existing = it->second.tensor;
    absl::StatusOr<torch::ScalarType> type = services::ToTorchDType(chunk.dtype());
    if (!type.ok() || *type != existing.scalar_type() ||
        existing.sizes().vec() !=
            std::vector<int64_t>(chunk.shape().begin(), chunk.shape().end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": dtype/shape ", static_cast<int>(chunk.dtype()), " ",
          ShapeString(chunk.shape()), " differ from its first chunk"));
    }
  }
  Parameter& parameter = it->second;
  const int64_t begin = chunk.byte_offset();
  const int64_t size = static_cast<int64_t>(chunk.data().size());
  if (begin < 0 || begin > parameter.total_bytes || size > parameter.total_bytes - begin) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": bytes [", begin, ", ", begin + size, ") beyond its ",
                     parameter.total_bytes, " bytes (shape ", ShapeString(chunk.shape()), ")"));
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
  parameter.ranges.emplace(begin, end);
  parameter.received_bytes += size;
  std::memcpy(static_cast<char*>(parameter.tensor.data_ptr()) + begin, chunk.data().data(),
              static_cast<size_t>(size));
  return absl::OkStatus();
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
  AssembledPolicy policy;
  policy.version = version_;
  policy.model_config_json = config_json_;
  for (auto& [name, parameter] : parameters_) {
    if (parameter.received_bytes != parameter.total_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "parameter '", name, "' incomplete: ", parameter.received_bytes,
                       " of ", parameter.total_bytes, " bytes"));
    }
    if (parameter.tensor.is_floating_point() &&
        !torch::isfinite(parameter.tensor).all().item<bool>()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "parameter '", name, "' has non-finite values"));
    }
    policy.weights.emplace(name, std::move(parameter.tensor));
  }
  return policy;
}

}  // namespace kappa::rollout
