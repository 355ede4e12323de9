#include "services/tensor_codec.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kappa::services {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "kappa.v1.Tensor bytes are little-endian and are copied as-is");

std::string ShapeText(const kappa::v1::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.shape(), ", "), "]");
}

absl::Status Invalid(std::string_view field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", what));
}

// The product of `shape`. A zero dimension makes a tensor empty however large
// the others are, and ValidateTensor accepts such shapes ([2^40, 2^40, 0] with
// no data), so it is checked first and the product cannot overflow (found by
// tests/fuzz/tensor_codec_fuzzer); otherwise the product is taken unsigned, so
// even an unvalidated shape wraps instead of being undefined behaviour.
template <typename Dims>
int64_t ElementCount(const Dims& shape) {
  for (int64_t dim : shape) {
    if (dim == 0) return 0;
  }
  uint64_t elements = 1;
  for (int64_t dim : shape) elements *= static_cast<uint64_t>(dim);
  return static_cast<int64_t>(elements);
}

}  // namespace

size_t DTypeSize(kappa::v1::DType dtype) {
  switch (dtype) {
    case kappa::v1::DTYPE_FLOAT32: return 4;
    case kappa::v1::DTYPE_BFLOAT16: return 2;
    case kappa::v1::DTYPE_FLOAT16: return 2;
    case kappa::v1::DTYPE_INT32: return 4;
    case kappa::v1::DTYPE_INT64: return 8;
    default: return 0;
  }
}

std::string_view DTypeName(kappa::v1::DType dtype) {
  switch (dtype) {
    case kappa::v1::DTYPE_UNSPECIFIED: return "unspecified";
    case kappa::v1::DTYPE_FLOAT32: return "float32";
    case kappa::v1::DTYPE_BFLOAT16: return "bfloat16";
    case kappa::v1::DTYPE_FLOAT16: return "float16";
    case kappa::v1::DTYPE_INT32: return "int32";
    case kappa::v1::DTYPE_INT64: return "int64";
    default: return "unknown";
  }
}

absl::Status ValidateTensor(const kappa::v1::Tensor& tensor, std::string_view field) {
  const size_t element_size = DTypeSize(tensor.dtype());
  if (element_size == 0) {
    return Invalid(field, absl::StrCat("unsupported dtype ", static_cast<int>(tensor.dtype()),
                                       " (", std::string(DTypeName(tensor.dtype())), ")"));
  }
  bool has_zero = false;
  for (int i = 0; i < tensor.shape_size(); ++i) {
    if (tensor.shape(i) < 0) {
      return Invalid(field, absl::StrCat("negative dimension ", tensor.shape(i), " at shape[", i,
                                         "] of ", ShapeText(tensor)));
    }
    has_zero |= tensor.shape(i) == 0;
  }
  // Multiply in uint64, stopping before the product could wrap; the byte
  // count must also fit a protobuf bytes field (< 2 GiB).
  const uint64_t max_bytes = std::numeric_limits<int32_t>::max();
  uint64_t elements = has_zero ? 0 : 1;
  for (int64_t dim : tensor.shape()) {
    if (has_zero) break;
    if (elements > max_bytes / static_cast<uint64_t>(dim)) {
      return Invalid(field, absl::StrCat("shape ", ShapeText(tensor), " is too large"));
    }
    elements *= static_cast<uint64_t>(dim);
  }
  const uint64_t expected = elements * element_size;
  if (expected > max_bytes) {
    return Invalid(field, absl::StrCat("shape ", ShapeText(tensor), " of ",
                                       std::string(DTypeName(tensor.dtype())), " is too large"));
  }
  if (tensor.data().size() != expected) {
    return Invalid(field, absl::StrCat(tensor.data().size(), " bytes for shape ",
                                       ShapeText(tensor), " of ",
                                       std::string(DTypeName(tensor.dtype())), " (expected ",
                                       expected, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensor(const kappa::v1::Tensor& tensor, std::string_view field,
                            kappa::v1::DType expected_dtype, int expected_rank) {
  if (tensor.dtype() != expected_dtype) {
    return Invalid(field, absl::StrCat("dtype ", std::string(DTypeName(tensor.dtype())),
                                       ", expected ", std::string(DTypeName(expected_dtype))));
  }
  if (expected_rank >= 0 && tensor.shape_size() != expected_rank) {
    return Invalid(field, absl::StrCat("rank ", tensor.shape_size(), " (shape ",
                                       ShapeText(tensor), "), expected rank ", expected_rank));
  }
  return ValidateTensor(tensor, field);
}

int64_t NumElements(const kappa::v1::Tensor& tensor) { return ElementCount(tensor.shape()); }

namespace {

// A float is NaN or ±Inf exactly when all its exponent bits are set. Blocks
// are OR-reduced without branches (the compiler vectorizes that loop); only a
// block that holds one is searched element by element.
template <typename Bits>
int64_t FirstWithExponentAllOnes(const void* data, int64_t count, Bits exponent_mask) {
  const auto* bits = static_cast<const unsigned char*>(data);
  auto load = [bits](int64_t i) {
    Bits value;
    std::memcpy(&value, bits + i * sizeof(Bits), sizeof(Bits));  // no alignment assumed
    return value;
  };
  constexpr int64_t kBlock = 4096;
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t end = std::min(count, begin + kBlock);
    bool any = false;
    for (int64_t i = begin; i < end; ++i) any |= (load(i) & exponent_mask) == exponent_mask;
    if (!any) continue;
    for (int64_t i = begin; i < end; ++i) {
      if ((load(i) & exponent_mask) == exponent_mask) return i;
    }
  }
  return -1;
}

}  // namespace

int64_t FirstNonFinite(const void* data, int64_t count, kappa::v1::DType dtype) {
  switch (dtype) {
    case kappa::v1::DTYPE_FLOAT32:
      return FirstWithExponentAllOnes<uint32_t>(data, count, 0x7f800000u);
    case kappa::v1::DTYPE_BFLOAT16:
      return FirstWithExponentAllOnes<uint16_t>(data, count, 0x7f80u);
    case kappa::v1::DTYPE_FLOAT16:
      return FirstWithExponentAllOnes<uint16_t>(data, count, 0x7c00u);
    default:
      return -1;
  }
}

void SetFloat32(kappa::v1::Tensor* out, const std::vector<int64_t>& shape, const float* values) {
  out->Clear();
  out->set_dtype(kappa::v1::DTYPE_FLOAT32);
  for (int64_t dim : shape) out->add_shape(dim);
  out->mutable_data()->assign(reinterpret_cast<const char*>(values),
                              static_cast<size_t>(ElementCount(shape)) * sizeof(float));
}

std::vector<float> GetFloat32(const kappa::v1::Tensor& tensor) {
  std::vector<float> values(tensor.data().size() / sizeof(float));
  if (!values.empty()) std::memcpy(values.data(), tensor.data().data(), values.size() * 4);
  return values;
}

}  // namespace kappa::services
