#include "services/torch_tensor_codec.h"

#include <torch/torch.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/tensor_codec.h"

namespace kappa::services {

kappa::v1::DType ToWireDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32: return kappa::v1::DTYPE_FLOAT32;
    case torch::kBFloat16: return kappa::v1::DTYPE_BFLOAT16;
    case torch::kFloat16: return kappa::v1::DTYPE_FLOAT16;
    case torch::kInt32: return kappa::v1::DTYPE_INT32;
    case torch::kInt64: return kappa::v1::DTYPE_INT64;
    default: return kappa::v1::DTYPE_UNSPECIFIED;
  }
}

absl::StatusOr<torch::ScalarType> ToTorchDType(kappa::v1::DType dtype) {
  switch (dtype) {
    case kappa::v1::DTYPE_FLOAT32: return torch::kFloat32;
    case kappa::v1::DTYPE_BFLOAT16: return torch::kBFloat16;
    case kappa::v1::DTYPE_FLOAT16: return torch::kFloat16;
    case kappa::v1::DTYPE_INT32: return torch::kInt32;
    case kappa::v1::DTYPE_INT64: return torch::kInt64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported dtype ", static_cast<int>(dtype), " (",
                       std::string(DTypeName(dtype)), ")"));
  }
}

void EncodeTensor(const torch::Tensor& tensor, kappa::v1::Tensor* out,
                  kappa::v1::DType wire_dtype) {
  if (wire_dtype == kappa::v1::DTYPE_UNSPECIFIED) wire_dtype = ToWireDType(tensor.scalar_type());
  const absl::StatusOr<torch::ScalarType> type = ToTorchDType(wire_dtype);
  if (!type.ok()) {
    // A programming error (the caller chose the dtype), not bad input.
    throw std::invalid_argument(absl::StrCat("EncodeTensor: cannot encode a ",
                                             std::string(c10::toString(tensor.scalar_type())),
                                             " tensor as wire dtype ",
                                             std::string(DTypeName(wire_dtype))));
  }
  // .to() and .contiguous() are no-ops when the tensor already fits; the
  // only unconditional copy is the one into the message below.
  const torch::Tensor source =
      tensor.detach().to(torch::kCPU, *type, /*non_blocking=*/false, /*copy=*/false).contiguous();
  out->Clear();
  out->set_dtype(wire_dtype);
  for (int64_t dim : source.sizes()) out->add_shape(dim);
  const size_t bytes = static_cast<size_t>(source.numel()) * source.element_size();
  out->mutable_data()->assign(static_cast<const char*>(source.data_ptr()), bytes);
}

absl::StatusOr<torch::Tensor> DecodeTensor(const kappa::v1::Tensor& tensor,
                                           std::string_view field, bool reject_non_finite) {
  if (absl::Status status = ValidateTensor(tensor, field); !status.ok()) return status;
  const torch::ScalarType type = *ToTorchDType(tensor.dtype());
  const std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  torch::Tensor decoded = torch::empty(shape, torch::TensorOptions().dtype(type));
  if (!tensor.data().empty()) {
    std::memcpy(decoded.data_ptr(), tensor.data().data(), tensor.data().size());
  }
  if (reject_non_finite) {
    const int64_t index = FirstNonFinite(decoded.data_ptr(), decoded.numel(), tensor.dtype());
    if (index >= 0) {
      const double value = decoded.flatten()[index].item<double>();
      return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": non-finite value ",
                                                     value, " at flat index ", index));
    }
  }
  return decoded;
}

}  // namespace kappa::services
