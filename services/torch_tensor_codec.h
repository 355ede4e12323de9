// The one tensor codec, libtorch side: torch::Tensor <-> kappa.v1.Tensor.
// A separate library (kappa_torch_codec) so the verifier's runtime carries no
// libtorch.
#pragma once

#include <torch/types.h>

#include <string_view>

#include "absl/status/statusor.h"
#include "kappa/v1/tensor.pb.h"

namespace kappa::services {

// Encodes `tensor` (any device, any layout) as `wire_dtype` (DTYPE_UNSPECIFIED
// keeps the tensor's own dtype). Writes straight from the contiguous CPU
// storage into the message's bytes (one copy).
void EncodeTensor(const torch::Tensor& tensor, kappa::v1::Tensor* out,
                  kappa::v1::DType wire_dtype = kappa::v1::DTYPE_UNSPECIFIED);
// Validates (see ValidateTensor) and decodes into a CPU tensor of the wire
// dtype. Also rejects non-finite floating values when reject_non_finite.
absl::StatusOr<torch::Tensor> DecodeTensor(const kappa::v1::Tensor& tensor,
                                           std::string_view field,
                                           bool reject_non_finite = true);

kappa::v1::DType ToWireDType(torch::ScalarType type);  // DTYPE_UNSPECIFIED if unsupported
absl::StatusOr<torch::ScalarType> ToTorchDType(kappa::v1::DType dtype);

}  // namespace kappa::services
