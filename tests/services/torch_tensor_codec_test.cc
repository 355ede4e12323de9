#include "services/torch_tensor_codec.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>

#include "services/tensor_codec.h"
#include "services/torch_runtime.h"

namespace kappa::services {
namespace {

// Sends a message through its serialized form, as the wire would.
kappa::v1::Tensor OverTheWire(const kappa::v1::Tensor& tensor) {
  kappa::v1::Tensor parsed;
  EXPECT_TRUE(parsed.ParseFromString(tensor.SerializeAsString()));
  return parsed;
}

TEST(TorchTensorCodecTest, RoundTripsEveryDType) {
  for (torch::ScalarType type :
       {torch::kFloat32, torch::kBFloat16, torch::kFloat16, torch::kInt32, torch::kInt64}) {
    const torch::Tensor original =
        (torch::arange(24, torch::kFloat32).reshape({2, 3, 4}) * 1.5 - 7).to(type);
    kappa::v1::Tensor wire;
    EncodeTensor(original, &wire);
    EXPECT_EQ(wire.dtype(), ToWireDType(type));
    EXPECT_EQ(wire.data().size(), 24 * DTypeSize(wire.dtype()));
    absl::StatusOr<torch::Tensor> decoded = DecodeTensor(OverTheWire(wire), "t");
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->scalar_type(), type);
    EXPECT_EQ(decoded->sizes(), original.sizes());
    EXPECT_TRUE(torch::equal(*decoded, original)) << c10::toString(type);
  }
}

TEST(TorchTensorCodecTest, ConvertsToTheWireDType) {
  const torch::Tensor original = torch::randn({5, 7});
  kappa::v1::Tensor wire;
  EncodeTensor(original, &wire, kappa::v1::DTYPE_BFLOAT16);
  EXPECT_EQ(wire.dtype(), kappa::v1::DTYPE_BFLOAT16);
  EXPECT_EQ(wire.data().size(), 35u * 2);
  absl::StatusOr<torch::Tensor> decoded = DecodeTensor(wire, "t");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(*decoded, original.to(torch::kBFloat16)));
  // bf16 keeps the top 16 bits of fp32: ~3 significant digits.
  EXPECT_TRUE(torch::allclose(decoded->to(torch::kFloat32), original, 1e-2, 1e-2));
}

TEST(TorchTensorCodecTest, EncodesNonContiguousViewsAndScalars) {
  const torch::Tensor base = torch::arange(12, torch::kInt64).reshape({3, 4});
  const torch::Tensor view = base.t().slice(0, 1, 3);  // [2, 3], strided
  ASSERT_FALSE(view.is_contiguous());
  kappa::v1::Tensor wire;
  EncodeTensor(view, &wire);
  absl::StatusOr<torch::Tensor> decoded = DecodeTensor(wire, "t");
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(torch::equal(*decoded, view));

  EncodeTensor(torch::tensor(3.5f), &wire);
  EXPECT_EQ(wire.shape_size(), 0);
  decoded = DecodeTensor(wire, "s");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->dim(), 0);
  EXPECT_EQ(decoded->item<float>(), 3.5f);

  EncodeTensor(torch::zeros({0, 4}), &wire);
  decoded = DecodeTensor(wire, "e");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->sizes(), (std::vector<int64_t>{0, 4}));
}

TEST(TorchTensorCodecTest, DecodeOwnsItsMemory) {
  kappa::v1::Tensor wire;
  EncodeTensor(torch::ones({4}), &wire);
  absl::StatusOr<torch::Tensor> decoded = DecodeTensor(wire, "t");
  ASSERT_TRUE(decoded.ok());
  wire.Clear();  // the decoded tensor must not alias the message's bytes
  EXPECT_TRUE(torch::equal(*decoded, torch::ones({4})));
}

TEST(TorchTensorCodecTest, RejectsNonFiniteWithFieldAndIndex) {
  for (torch::ScalarType type : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    torch::Tensor values = torch::zeros({2, 3}, type);
    values[1][1] = std::numeric_limits<float>::infinity();
    values[1][2] = std::numeric_limits<float>::quiet_NaN();
    kappa::v1::Tensor wire;
    EncodeTensor(values, &wire);
    absl::StatusOr<torch::Tensor> decoded = DecodeTensor(wire, "samples[0].teacher_logprobs");
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(decoded.status().message(),
              "samples[0].teacher_logprobs: non-finite value inf at flat index 4")
        << c10::toString(type);
    EXPECT_TRUE(DecodeTensor(wire, "t", /*reject_non_finite=*/false).ok());
  }
}

TEST(TorchTensorCodecTest, DecodeValidatesFirst) {
  kappa::v1::Tensor wire;
  EncodeTensor(torch::ones({4}), &wire);
  wire.mutable_data()->pop_back();
  EXPECT_EQ(DecodeTensor(wire, "x").status().message(),
            "x: 15 bytes for shape [4] of float32 (expected 16)");
  wire.set_dtype(kappa::v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(DecodeTensor(wire, "x").status().code(), absl::StatusCode::kInvalidArgument);
  wire.set_dtype(kappa::v1::DTYPE_INT64);
  wire.clear_shape();
  wire.add_shape(-2);
  EXPECT_EQ(DecodeTensor(wire, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TorchTensorCodecTest, DTypeMapping) {
  EXPECT_EQ(ToWireDType(torch::kFloat64), kappa::v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(ToWireDType(torch::kBool), kappa::v1::DTYPE_UNSPECIFIED);
  EXPECT_FALSE(ToTorchDType(kappa::v1::DTYPE_UNSPECIFIED).ok());
  EXPECT_EQ(*ToTorchDType(kappa::v1::DTYPE_FLOAT16), torch::kFloat16);
  kappa::v1::Tensor wire;
  EXPECT_THROW(EncodeTensor(torch::ones({2}, torch::kFloat64), &wire), std::invalid_argument);
  EncodeTensor(torch::ones({2}, torch::kFloat64), &wire, kappa::v1::DTYPE_FLOAT32);
  EXPECT_EQ(wire.dtype(), kappa::v1::DTYPE_FLOAT32);
}

TEST(TorchRuntimeTest, SetsIntraOpThreads) {
  ConfigureTorchThreads(2);
  EXPECT_EQ(at::get_num_threads(), 2);
  ConfigureTorchThreads(0);  // keeps the current setting; calling twice is safe
  EXPECT_EQ(at::get_num_threads(), 2);
}

}  // namespace
}  // namespace kappa::services
