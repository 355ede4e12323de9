// The device a config key names, and the refusal of one this build cannot use.
#include "services/torch_runtime.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace kappa::services {
namespace {

TEST(ResolveDeviceTest, CpuAndCudaNamesAndClearRefusals) {
  absl::StatusOr<torch::Device> cpu = ResolveDevice("cpu", "learner.device");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->is_cpu());
  for (const char* bad : {"gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", ""}) {
    absl::StatusOr<torch::Device> device = ResolveDevice(bad, "teacher.device");
    EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(device.status().message().rfind("teacher.device: '", 0), 0u) << device.status();
  }
  // "cuda" works exactly when this libtorch sees a GPU.
  absl::StatusOr<torch::Device> cuda = ResolveDevice("cuda", "learner.device");
  if (torch::cuda::is_available()) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_TRUE(cuda->is_cuda());
  } else {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find("0 CUDA device(s)"), std::string::npos)
        << cuda.status();
  }
  EXPECT_FALSE(ResolveDevice("cuda:64", "learner.device").ok());
}

// (Names other than auto, float32 and bfloat16 are refused when the
// configuration loads: config_test's EveryNamedChoiceRefusesAnUnknownValueByName.)
TEST(ResolveModelDtypeTest, AutoFollowsTheDevice) {
  EXPECT_EQ(ResolveModelDtype(ModelDtype::kAuto, torch::kCPU), torch::kFloat32);
  EXPECT_EQ(ResolveModelDtype(ModelDtype::kAuto, torch::Device(torch::kCUDA, 0)), torch::kBFloat16);
  EXPECT_EQ(ResolveModelDtype(ModelDtype::kBFloat16, torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(ResolveModelDtype(ModelDtype::kFloat32, torch::Device(torch::kCUDA, 0)),
            torch::kFloat32);
}

}  // namespace
}  // namespace kappa::services
