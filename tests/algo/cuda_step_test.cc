// The hybrid step on CUDA agrees with the same step on the CPU (skipped
// where no GPU is visible; the GPU machine runs it).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "learner/algo/hybrid_step.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

HybridStepReport RunOn(const torch::Device& device, const TrainBatch& batch) {
  model::Decoder model = testing::TinyModel(8);
  model->to(device);
  HybridStepConfig config;
  config.balance = ParseBalance({"m3_mask", "m3_project"});
  config.monitor.kdr_exact_every = 1;
  config.monitor.kdr_exact_positions = 6;
  auto optimizer = std::make_unique<PolicyOptimizer>(model, 1e-3, 0.0, 1.0);
  HybridStep step(model, std::move(optimizer), config);
  return step.Run(batch);
}

TEST(CudaStep, MatchesTheCpuStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const TrainBatch batch = BuildTrainBatch(testing::RandomGroups(3, 4, true, 5), true, 0);
  const HybridStepReport cpu = RunOn(torch::kCPU, batch);
  const HybridStepReport gpu = RunOn(torch::kCUDA, batch);
  ASSERT_TRUE(cpu.stats.kappa() && gpu.stats.kappa());
  EXPECT_NEAR(*gpu.stats.kappa(), *cpu.stats.kappa(), 1e-3 * *cpu.stats.kappa());
  EXPECT_NEAR(gpu.stats.grad_cosine, cpu.stats.grad_cosine, 1e-3);
  EXPECT_NEAR(gpu.stats.grad_norm, cpu.stats.grad_norm, 1e-3 * cpu.stats.grad_norm);
  ASSERT_TRUE(cpu.kdr && gpu.kdr);
  EXPECT_NEAR(gpu.kdr->mean, cpu.kdr->mean, 1e-3 * std::abs(cpu.kdr->mean) + 1e-6);
  EXPECT_EQ(gpu.masked_positions, cpu.masked_positions);
  EXPECT_EQ(gpu.exact_positions, 6);
  ASSERT_TRUE(cpu.kdr_exact && gpu.kdr_exact);
  EXPECT_NEAR(gpu.kdr_exact->mean, cpu.kdr_exact->mean, 1e-3 * std::abs(cpu.kdr_exact->mean) + 1e-6);
}

}  // namespace
}  // namespace kappa::learner
