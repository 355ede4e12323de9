#include "services/tensor_codec.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kappa::services {
namespace {

using kappa::v1::DType;

kappa::v1::Tensor MakeTensor(DType dtype, std::initializer_list<int64_t> shape, size_t bytes) {
  kappa::v1::Tensor tensor;
  tensor.set_dtype(dtype);
  for (int64_t dim : shape) tensor.add_shape(dim);
  tensor.set_data(std::string(bytes, '\0'));
  return tensor;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(TensorCodecTest, DTypeSizesAndNames) {
  EXPECT_EQ(DTypeSize(kappa::v1::DTYPE_FLOAT32), 4u);
  EXPECT_EQ(DTypeSize(kappa::v1::DTYPE_BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(kappa::v1::DTYPE_FLOAT16), 2u);
  EXPECT_EQ(DTypeSize(kappa::v1::DTYPE_INT32), 4u);
  EXPECT_EQ(DTypeSize(kappa::v1::DTYPE_INT64), 8u);
  EXPECT_EQ(DTypeSize(kappa::v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(99)), 0u);
  EXPECT_EQ(DTypeName(kappa::v1::DTYPE_BFLOAT16), "bfloat16");
}

TEST(TensorCodecTest, AcceptsEveryDTypeWithMatchingBytes) {
  for (DType dtype : {kappa::v1::DTYPE_FLOAT32, kappa::v1::DTYPE_BFLOAT16,
                      kappa::v1::DTYPE_FLOAT16, kappa::v1::DTYPE_INT32, kappa::v1::DTYPE_INT64}) {
    const kappa::v1::Tensor tensor = MakeTensor(dtype, {2, 3}, 6 * DTypeSize(dtype));
    EXPECT_TRUE(ValidateTensor(tensor, "x").ok()) << DTypeName(dtype);
    EXPECT_TRUE(ValidateTensor(tensor, "x", dtype, 2).ok()) << DTypeName(dtype);
    EXPECT_EQ(NumElements(tensor), 6);
  }
}

TEST(TensorCodecTest, ScalarsAndEmptyTensors) {
  EXPECT_TRUE(ValidateTensor(MakeTensor(kappa::v1::DTYPE_INT64, {}, 8), "s").ok());
  EXPECT_FALSE(ValidateTensor(MakeTensor(kappa::v1::DTYPE_INT64, {}, 0), "s").ok());
  EXPECT_TRUE(ValidateTensor(MakeTensor(kappa::v1::DTYPE_FLOAT32, {0, 5}, 0), "e").ok());
  // A zero dimension makes a huge shape legal (and empty).
  EXPECT_TRUE(ValidateTensor(
      MakeTensor(kappa::v1::DTYPE_FLOAT32, {std::numeric_limits<int64_t>::max(), 0}, 0), "e")
                  .ok());
}

TEST(TensorCodecTest, RejectsWrongByteCount) {
  const absl::Status status = ValidateTensor(
      MakeTensor(kappa::v1::DTYPE_FLOAT32, {4}, 12), "samples[2].teacher_logprobs");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status),
            "samples[2].teacher_logprobs: 12 bytes for shape [4] of float32 (expected 16)");
}

TEST(TensorCodecTest, RejectsUnknownDType) {
  for (DType dtype : {kappa::v1::DTYPE_UNSPECIFIED, static_cast<DType>(42)}) {
    const absl::Status status = ValidateTensor(MakeTensor(dtype, {1}, 4), "t");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(status).rfind("t: unsupported dtype", 0), 0u) << status;
  }
}

TEST(TensorCodecTest, RejectsNegativeDimension) {
  const absl::Status status = ValidateTensor(MakeTensor(kappa::v1::DTYPE_INT32, {2, -3}, 0), "t");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status), "t: negative dimension -3 at shape[1] of [2, -3]");
}

TEST(TensorCodecTest, RejectsOverflowingShape) {
  const int64_t big = int64_t{1} << 40;
  // big^2 * 4 bytes wraps a 64-bit product; a naive check would see 0 == 0.
  for (auto shape : {std::initializer_list<int64_t>{big, big, 16},
                     std::initializer_list<int64_t>{int64_t{1} << 62, 4}}) {
    const absl::Status status = ValidateTensor(MakeTensor(kappa::v1::DTYPE_FLOAT32, shape, 0), "t");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(Message(status).find("too large"), std::string::npos) << status;
  }
}

TEST(TensorCodecTest, RejectsUnexpectedDTypeOrRank) {
  const kappa::v1::Tensor tensor = MakeTensor(kappa::v1::DTYPE_BFLOAT16, {2, 2}, 8);
  EXPECT_EQ(Message(ValidateTensor(tensor, "t", kappa::v1::DTYPE_FLOAT32, 2)),
            "t: dtype bfloat16, expected float32");
  EXPECT_EQ(Message(ValidateTensor(tensor, "t", kappa::v1::DTYPE_BFLOAT16, 1)),
            "t: rank 2 (shape [2, 2]), expected rank 1");
  EXPECT_TRUE(ValidateTensor(tensor, "t", kappa::v1::DTYPE_BFLOAT16, -1).ok());
}

TEST(TensorCodecTest, Float32RoundTripThroughSerializedMessage) {
  const float values[] = {1.5f, -2.0f, 0.0f, 3.25e-8f, 1e30f, -7.0f};
  kappa::v1::Tensor tensor;
  SetFloat32(&tensor, {2, 3}, values);
  kappa::v1::Tensor parsed;
  ASSERT_TRUE(parsed.ParseFromString(tensor.SerializeAsString()));
  ASSERT_TRUE(ValidateTensor(parsed, "t", kappa::v1::DTYPE_FLOAT32, 2).ok());
  EXPECT_EQ(GetFloat32(parsed), std::vector<float>(std::begin(values), std::end(values)));
  // Little-endian bytes on the wire: 1.5f is 0x3FC00000.
  EXPECT_EQ(parsed.data().substr(0, 4), std::string("\x00\x00\xc0\x3f", 4));
}

}  // namespace
}  // namespace kappa::services

namespace kappa::services {
namespace {

TEST(FirstNonFiniteTest, FindsTheFirstNanOrInfInEveryFloatingDType) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values(10000, 1.5f);
  values[3] = std::numeric_limits<float>::max();          // large but finite
  values[4] = std::numeric_limits<float>::denorm_min();   // tiny but finite
  EXPECT_EQ(FirstNonFinite(values.data(), 10000, kappa::v1::DTYPE_FLOAT32), -1);
  values[9000] = -inf;  // in a later block than the first
  values[8191] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FirstNonFinite(values.data(), 10000, kappa::v1::DTYPE_FLOAT32), 8191);
  EXPECT_EQ(FirstNonFinite(values.data(), 8191, kappa::v1::DTYPE_FLOAT32), -1);
  values[0] = inf;
  EXPECT_EQ(FirstNonFinite(values.data(), 10000, kappa::v1::DTYPE_FLOAT32), 0);

  // bfloat16: the upper half of a float32; float16: 5 exponent bits.
  const std::vector<uint16_t> bf16 = {0x3fc0 /*1.5*/, 0x7f7f /*max*/, 0xff80 /*-inf*/};
  EXPECT_EQ(FirstNonFinite(bf16.data(), 3, kappa::v1::DTYPE_BFLOAT16), 2);
  EXPECT_EQ(FirstNonFinite(bf16.data(), 2, kappa::v1::DTYPE_BFLOAT16), -1);
  const std::vector<uint16_t> f16 = {0x3e00 /*1.5*/, 0x7bff /*65504*/, 0x7e00 /*nan*/};
  EXPECT_EQ(FirstNonFinite(f16.data(), 3, kappa::v1::DTYPE_FLOAT16), 2);
  EXPECT_EQ(FirstNonFinite(f16.data(), 2, kappa::v1::DTYPE_FLOAT16), -1);

  // Integers have no non-finite values, whatever their bits.
  const std::vector<int32_t> ints = {0x7f800000, -1};
  EXPECT_EQ(FirstNonFinite(ints.data(), 2, kappa::v1::DTYPE_INT32), -1);
}

}  // namespace
}  // namespace kappa::services
