// Fuzzes the wire side of the tensor codec (services/tensor_codec.h): the
// input is a serialized kappa.v1.Tensor as a peer would send it. Whatever the
// bytes, validation must not crash, and a tensor it accepts must be safe to
// read: its element count times the dtype size is exactly its data size, and
// float32 data survives GetFloat32 -> SetFloat32 unchanged, and
// FirstNonFinite agrees with std::isfinite element by element.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kappa/v1/tensor.pb.h"
#include "services/tensor_codec.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();  // a broken invariant is a finding, like a crash
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kappa::services::ValidateTensor;
  kappa::v1::Tensor tensor;
  if (!tensor.ParseFromArray(data, static_cast<int>(size))) return 0;

  const absl::Status status = ValidateTensor(tensor, "fuzz");
  // Asking for the tensor's own dtype and rank changes nothing.
  Check(ValidateTensor(tensor, "fuzz", tensor.dtype(), tensor.shape_size()).ok() == status.ok());
  if (!status.ok()) {
    Check(status.code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }

  const int64_t elements = kappa::services::NumElements(tensor);
  Check(elements >= 0);
  Check(static_cast<uint64_t>(elements) * kappa::services::DTypeSize(tensor.dtype()) ==
        tensor.data().size());

  if (tensor.dtype() == kappa::v1::DTYPE_FLOAT32) {
    const std::vector<float> values = kappa::services::GetFloat32(tensor);
    Check(static_cast<int64_t>(values.size()) == elements);
    const std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
    kappa::v1::Tensor copy;
    kappa::services::SetFloat32(&copy, shape, values.data());
    Check(copy.data() == tensor.data());
    Check(ValidateTensor(copy, "copy").ok());

    int64_t first_non_finite = -1;
    for (int64_t i = 0; i < elements && first_non_finite < 0; ++i) {
      if (!std::isfinite(values[i])) first_non_finite = i;
    }
    Check(kappa::services::FirstNonFinite(values.data(), elements, tensor.dtype()) ==
          first_non_finite);
  }
  return 0;
}
