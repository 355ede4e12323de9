// The one tensor codec, wire side (no libtorch: the verifier links this).
// kappa.v1.Tensor = {dtype, shape, little-endian row-major bytes}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kappa/v1/tensor.pb.h"

namespace kappa::services {

// Bytes per element; 0 for DTYPE_UNSPECIFIED or unknown values.
size_t DTypeSize(kappa::v1::DType dtype);
std::string_view DTypeName(kappa::v1::DType dtype);

// Checks dtype known, dims >= 0, element count * size == data size (with
// overflow checks). Errors are INVALID_ARGUMENT and start with `field`, e.g.
// "samples[2].teacher_logprobs: 12 bytes for shape [4] of float32 (expected 16)".
absl::Status ValidateTensor(const kappa::v1::Tensor& tensor, std::string_view field);
// ValidateTensor plus an exact expected dtype and rank (-1: any rank).
absl::Status ValidateTensor(const kappa::v1::Tensor& tensor, std::string_view field,
                            kappa::v1::DType expected_dtype, int expected_rank);

int64_t NumElements(const kappa::v1::Tensor& tensor);

// Flat index of the first NaN or ±Inf among the `count` elements of `dtype`
// at `data`; -1 when all are finite, and always for integer dtypes. One pass
// over the exponent bits, no allocation: it runs on every decoded log-prob
// tensor, so it must cost about a memory read (bench/transport_bench.cc).
int64_t FirstNonFinite(const void* data, int64_t count, kappa::v1::DType dtype);

// Host-endian helpers (this codebase only targets little-endian hosts; a
// static_assert in the .cc enforces it).
void SetFloat32(kappa::v1::Tensor* out, const std::vector<int64_t>& shape, const float* values);
std::vector<float> GetFloat32(const kappa::v1::Tensor& tensor);  // requires a valid FLOAT32 tensor

}  // namespace kappa::services
