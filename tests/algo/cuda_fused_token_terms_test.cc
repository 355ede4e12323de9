// The CUDA kernels of the fused token terms against the torch-op path of the
// same autograd node, on the GPU, at real vocabulary sizes. Skipped without
// a CUDA device or in a build without the kernels (KAPPA_CUDA=OFF); the GPU
// machine runs it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "learner/algo/fused_token_terms.h"
#include "learner/algo/logprob_losses.h"
#include "learner/algo/losses.h"

namespace kappa::learner {
namespace {

bool SkipWithoutKernels() { return !torch::cuda::is_available() || !FusedTokenTermsHasCudaKernels(); }
const char* kSkipReason = "needs a CUDA device and a KAPPA_CUDA build";

double MaxAbs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want, double rtol, double atol,
                 const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const torch::Tensor g = got.detach().to(torch::kFloat64);
  const torch::Tensor w = want.detach().to(torch::kFloat64);
  EXPECT_FALSE(torch::isnan(g).any().item<bool>()) << what;
  const double scale = MaxAbs(w);
  EXPECT_LE(MaxAbs(g - w), atol + rtol * scale) << what << " (max |want| " << scale << ")";
}

struct Case {
  torch::Tensor logits, targets, teacher, mask, w_r, w_d;
};

// B·L rows on the GPU; the last rows of some sequences are padding (mask 0,
// zero teacher row).
Case MakeCase(int64_t B, int64_t L, int64_t V, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  Case c;
  c.logits = (4 * torch::randn({B, L, V}, cuda)).to(dtype).requires_grad_(true);
  c.teacher = torch::log_softmax(3 * torch::randn({B, L, V}, cuda), -1);
  c.targets = torch::randint(0, V, {B, L}, cuda.dtype(torch::kInt64));
  c.mask = torch::ones({B, L}, cuda);
  c.mask.narrow(1, L - 3, 3)[0].zero_();
  c.teacher.narrow(1, L - 3, 3)[0].zero_();
  c.w_r = torch::randn({B, L}, cuda);
  c.w_d = torch::rand({B, L}, cuda) + 0.5;
  return c;
}

void CompareKernelWithTorchOps(int64_t V, torch::ScalarType dtype) {
  const Case c = MakeCase(3, 40, V, dtype, static_cast<uint64_t>(V));
  const double temperature = 0.9;
  const FusedTokenTerms k =
      ComputeFusedTokenTerms(c.logits, c.targets, c.teacher, temperature, FusedImpl::kAuto);
  const FusedTokenTerms t =
      ComputeFusedTokenTerms(c.logits, c.targets, c.teacher, temperature, FusedImpl::kTorchOps);
  // Both paths read the same (bf16 or fp32) logits and compute in fp32.
  ExpectClose(k.logprobs, t.logprobs, 1e-5, 1e-4, "log-probs");
  ExpectClose(k.token_logprobs, t.token_logprobs, 1e-5, 1e-4, "token log-probs");
  ExpectClose(k.reverse_kl, t.reverse_kl, 1e-4, 1e-4, "reverse KL");
  ExpectClose(k.entropy, t.entropy, 1e-4, 1e-4, "entropy");

  auto losses = [&](const FusedTokenTerms& f) {
    return std::make_pair(Aggregate(f.token_logprobs * c.w_r, c.mask, Aggregation::kTokenMean),
                          Aggregate(f.reverse_kl * c.w_d, c.mask, Aggregation::kTokenMean));
  };
  auto grad = [&](const torch::Tensor& loss, bool retain) {
    return torch::autograd::grad({loss}, {c.logits}, {}, retain)[0];
  };
  const auto [lr_k, ld_k] = losses(k);
  const auto [lr_t, ld_t] = losses(t);
  const double rtol = dtype == torch::kBFloat16 ? 1e-2 : 1e-4;
  const torch::Tensor gr_k = grad(lr_k, true), gd_k = grad(ld_k, true), gs_k = grad(lr_k + ld_k, false);
  const torch::Tensor gr_t = grad(lr_t, true), gd_t = grad(ld_t, true), gs_t = grad(lr_t + ld_t, false);
  EXPECT_EQ(gr_k.scalar_type(), dtype);
  ExpectClose(gr_k, gr_t, rtol, 0, "dL_R/dz");
  ExpectClose(gd_k, gd_t, rtol, 0, "dL_D/dz");
  ExpectClose(gs_k, gs_t, rtol, 0, "d(L_R + L_D)/dz");
  // Padding rows: exactly zero.
  EXPECT_EQ(MaxAbs(gs_k[0].narrow(0, 37, 3).to(torch::kFloat32)), 0.0);
  EXPECT_GT(MaxAbs(gr_k), 0.0);
  EXPECT_GT(MaxAbs(gd_k), 0.0);
}

TEST(CudaFusedTokenTermsTest, Float32V32000) {
  if (SkipWithoutKernels()) GTEST_SKIP() << kSkipReason;
  CompareKernelWithTorchOps(32000, torch::kFloat32);
}
TEST(CudaFusedTokenTermsTest, Bfloat16V32000) {
  if (SkipWithoutKernels()) GTEST_SKIP() << kSkipReason;
  CompareKernelWithTorchOps(32000, torch::kBFloat16);
}
TEST(CudaFusedTokenTermsTest, Float32V151936) {
  if (SkipWithoutKernels()) GTEST_SKIP() << kSkipReason;
  CompareKernelWithTorchOps(151936, torch::kFloat32);
}
TEST(CudaFusedTokenTermsTest, Bfloat16V151936) {
  if (SkipWithoutKernels()) GTEST_SKIP() << kSkipReason;
  CompareKernelWithTorchOps(151936, torch::kBFloat16);
}

TEST(CudaFusedTokenTermsTest, MatchesTheCpuPath) {
  if (SkipWithoutKernels()) GTEST_SKIP() << kSkipReason;
  const Case c = MakeCase(2, 8, 1000, torch::kFloat32, 9);
  const FusedTokenTerms k = ComputeFusedTokenTerms(c.logits, c.targets, c.teacher, 1.2);
  const torch::Tensor z = c.logits.detach().cpu().requires_grad_(true);
  const FusedTokenTerms cpu = ComputeFusedTokenTerms(z, c.targets.cpu(), c.teacher.cpu(), 1.2);
  ExpectClose(k.reverse_kl.cpu(), cpu.reverse_kl, 1e-4, 1e-5, "reverse KL vs CPU");
  const torch::Tensor g = torch::autograd::grad({(k.reverse_kl * c.w_d).sum()}, {c.logits})[0];
  const torch::Tensor g_cpu =
      torch::autograd::grad({(cpu.reverse_kl * c.w_d.cpu()).sum()}, {z})[0];
  ExpectClose(g.cpu(), g_cpu, 1e-4, 0, "gradient vs CPU");
}

// Timing at B·L = 2048, V = 32000 (printed): forward + the two backward
// passes of the κ monitor, kernel vs torch ops vs the unfused ops.
TEST(CudaFusedTokenTermsTest, TimesForwardAndTwoBackwardPasses) {
  if (SkipWithoutKernels()) GTEST_SKIP() << kSkipReason;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const Case c = MakeCase(8, 256, 32000, dtype, 1);
    auto step = [&](int which) {
      torch::Tensor tok, kl;
      if (which < 2) {
        const FusedTokenTerms f = ComputeFusedTokenTerms(
            c.logits, c.targets, c.teacher, 1.0, which == 0 ? FusedImpl::kAuto : FusedImpl::kTorchOps);
        tok = f.token_logprobs;
        kl = f.reverse_kl;
      } else {
        const torch::Tensor lp = StableLogSoftmax(c.logits);
        tok = GatherTokenLogProbs(lp, c.targets);
        kl = ReverseKlFromLogProbs(lp, c.teacher);
        torch::NoGradGuard no_grad;
        (void)EntropyFromLogProbs(lp.detach());
      }
      torch::autograd::grad({tok.mean()}, {c.logits}, {}, true);
      torch::autograd::grad({kl.mean()}, {c.logits});
    };
    const char* names[] = {"kernel", "torch ops", "unfused"};
    for (int which = 0; which < 3; ++which) {
      for (int i = 0; i < 3; ++i) step(which);  // warm-up
      torch::cuda::synchronize();
      const int iters = 20;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) step(which);
      torch::cuda::synchronize();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
          iters;
      std::printf("%s logits, B*L=2048, V=32000, %-9s: %.3f ms per forward + 2 backward\n",
                  dtype == torch::kBFloat16 ? "bf16" : "fp32", names[which], ms);
    }
  }
}

}  // namespace
}  // namespace kappa::learner
