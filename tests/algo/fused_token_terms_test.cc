// The fused token terms (one autograd node for log p(y), the reverse KL and
// the entropy) against the unfused log_softmax → gather / exp·diff·sum path:
// values, both gradients separately and summed, temperature, padding, bf16,
// finite differences in double, and ComputeTokenTerms on a model.
#include "learner/algo/fused_token_terms.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "learner/algo/hybrid_loss.h"
#include "learner/algo/logprob_losses.h"
#include "learner/algo/losses.h"
#include "learner/algo/mixed_precision.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

struct Terms {
  torch::Tensor token_logprobs, reverse_kl, entropy;
};

// The path ComputeTokenTerms took before the fused node.
Terms Unfused(const torch::Tensor& logits, const torch::Tensor& targets,
              const torch::Tensor& teacher, double temperature) {
  const torch::Tensor scaled = temperature == 1.0 ? logits : logits / temperature;
  const torch::Tensor lp = StableLogSoftmax(scaled);
  torch::Tensor entropy;
  {
    torch::NoGradGuard no_grad;
    entropy = EntropyFromLogProbs(lp.detach());
  }
  return {GatherTokenLogProbs(lp, targets), ReverseKlFromLogProbs(lp, teacher), entropy};
}

Terms Fused(const torch::Tensor& logits, const torch::Tensor& targets,
            const torch::Tensor& teacher, double temperature) {
  const FusedTokenTerms f = ComputeFusedTokenTerms(logits, targets, teacher, temperature);
  return {f.token_logprobs, f.reverse_kl, f.entropy};
}

// A batch with padding: positions past each row's length have mask 0, huge
// logits and an all-zero teacher row (what BuildTrainBatch writes there).
struct Case {
  torch::Tensor logits, targets, teacher, mask, w_r, w_d;
};

Case MakeCase(int64_t B, int64_t L, int64_t V, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  Case c;
  torch::Tensor z = 3 * torch::randn({B, L, V}, torch::kFloat64);
  c.teacher = torch::log_softmax(2 * torch::randn({B, L, V}, torch::kFloat64), -1);
  c.mask = torch::ones({B, L}, torch::kFloat64);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = L - b % 3;
    if (len < L) {
      c.mask[b].narrow(0, len, L - len).zero_();
      z[b].narrow(0, len, L - len).fill_(80.0);
      c.teacher[b].narrow(0, len, L - len).zero_();
    }
  }
  const auto real = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  c.logits = z.to(dtype).requires_grad_(true);
  c.teacher = c.teacher.to(real);
  c.mask = c.mask.to(real);
  c.targets = torch::randint(0, V, {B, L}, torch::kInt64);
  c.w_r = torch::randn({B, L}, real);
  c.w_d = torch::rand({B, L}, real) + 0.5;
  return c;
}

torch::Tensor RewardLossOf(const Terms& t, const Case& c) {
  return Aggregate(t.token_logprobs * c.w_r, c.mask, Aggregation::kTokenMean);
}
torch::Tensor DistillLossOf(const Terms& t, const Case& c) {
  return Aggregate(t.reverse_kl * c.w_d, c.mask, Aggregation::kTokenMean);
}

torch::Tensor GradOf(const torch::Tensor& loss, const torch::Tensor& x, bool retain = false) {
  return torch::autograd::grad({loss}, {x}, {}, retain)[0];
}

double MaxAbs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

// |got − want| ≤ atol + rtol · max|want| elementwise (in float64).
void ExpectClose(const torch::Tensor& got, const torch::Tensor& want, double rtol, double atol,
                 const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const torch::Tensor g = got.detach().to(torch::kFloat64);
  const torch::Tensor w = want.detach().to(torch::kFloat64);
  const double scale = MaxAbs(w);
  EXPECT_LE(MaxAbs(g - w), atol + rtol * scale) << what << " (max |want| " << scale << ")";
}

// Every response position: values and gradients (each signal alone, summed,
// and the two separate passes of the κ monitor through one graph).
void CompareWithUnfused(const Case& c, double temperature, double rtol, double atol) {
  const Terms fused = Fused(c.logits, c.targets, c.teacher, temperature);
  const Terms ref = Unfused(c.logits, c.targets, c.teacher, temperature);
  const torch::Tensor valid = c.mask > 0;
  ExpectClose(fused.token_logprobs.masked_select(valid), ref.token_logprobs.masked_select(valid),
              rtol, atol, "token log-probs");
  ExpectClose(fused.reverse_kl.masked_select(valid), ref.reverse_kl.masked_select(valid), rtol,
              atol, "reverse KL");
  ExpectClose(fused.entropy.masked_select(valid), ref.entropy.masked_select(valid), rtol, atol,
              "entropy");
  EXPECT_TRUE(fused.token_logprobs.requires_grad());
  EXPECT_TRUE(fused.reverse_kl.requires_grad());
  EXPECT_FALSE(fused.entropy.requires_grad());

  const torch::Tensor lr = RewardLossOf(fused, c), ld = DistillLossOf(fused, c);
  const torch::Tensor lr_ref = RewardLossOf(ref, c), ld_ref = DistillLossOf(ref, c);
  EXPECT_NEAR(lr.item<double>(), lr_ref.item<double>(), atol + rtol * std::abs(lr_ref.item<double>()));
  EXPECT_NEAR(ld.item<double>(), ld_ref.item<double>(), atol + rtol * std::abs(ld_ref.item<double>()));

  // The κ monitor: L_R then L_D through the same graph.
  const torch::Tensor g_r = GradOf(lr, c.logits, /*retain=*/true);
  const torch::Tensor g_d = GradOf(ld, c.logits, /*retain=*/true);
  const torch::Tensor g_sum = GradOf(lr + ld, c.logits);
  const torch::Tensor g_r_ref = GradOf(lr_ref, c.logits, true);
  const torch::Tensor g_d_ref = GradOf(ld_ref, c.logits, true);
  const torch::Tensor g_sum_ref = GradOf(lr_ref + ld_ref, c.logits);
  EXPECT_EQ(g_r.scalar_type(), c.logits.scalar_type());
  ExpectClose(g_r, g_r_ref, rtol, atol * 1e-2, "dL_R/dz");
  ExpectClose(g_d, g_d_ref, rtol, atol * 1e-2, "dL_D/dz");
  ExpectClose(g_sum, g_sum_ref, rtol, atol * 1e-2, "d(L_R + L_D)/dz");
  ExpectClose(g_r + g_d, g_sum, rtol, atol * 1e-2, "separate passes sum to the joint one");
  // Padding positions get exactly nothing, whatever their logits.
  const torch::Tensor pad = (c.mask == 0).unsqueeze(-1).expand_as(g_sum);
  EXPECT_EQ(MaxAbs(g_sum.masked_select(pad).to(torch::kFloat64)), 0.0);
  EXPECT_GT(MaxAbs(g_r), 0.0);
  EXPECT_GT(MaxAbs(g_d), 0.0);
}

TEST(FusedTokenTermsTest, MatchesTheUnfusedPathInFloat32) {
  for (double temperature : {1.0, 0.7, 1.6}) {
    SCOPED_TRACE(temperature);
    CompareWithUnfused(MakeCase(3, 5, 37, torch::kFloat32, 1), temperature, 1e-5, 1e-5);
  }
}

TEST(FusedTokenTermsTest, MatchesTheUnfusedPathInFloat64) {
  CompareWithUnfused(MakeCase(2, 4, 19, torch::kFloat64, 2), 0.8, 1e-12, 1e-12);
}

TEST(FusedTokenTermsTest, MatchesTheUnfusedPathOnLargeRowsAcrossChunks) {
  // 2·70 rows of 40000: several chunks of the torch-op path.
  CompareWithUnfused(MakeCase(2, 70, 40000, torch::kFloat32, 3), 1.3, 1e-5, 1e-5);
}

TEST(FusedTokenTermsTest, Bfloat16LogitsMatchWithALooserTolerance) {
  // The unfused path divides by τ in bfloat16 before upcasting; the fused one
  // upcasts first, so the two differ at bfloat16 resolution.
  CompareWithUnfused(MakeCase(3, 6, 53, torch::kBFloat16, 4), 0.7, 2e-2, 5e-2);
  // Against the unfused path on the float32 upcast: the same numbers up to
  // the rounding of the gradient to bfloat16.
  const Case c = MakeCase(3, 6, 53, torch::kBFloat16, 5);
  const Terms fused = Fused(c.logits, c.targets, c.teacher, 0.7);
  const torch::Tensor z32 = c.logits.detach().to(torch::kFloat32).requires_grad_(true);
  const Terms ref = Unfused(z32, c.targets, c.teacher, 0.7);
  const torch::Tensor valid = c.mask > 0;
  ExpectClose(fused.reverse_kl.masked_select(valid), ref.reverse_kl.masked_select(valid), 1e-5,
              1e-5, "reverse KL (bf16 logits)");
  const torch::Tensor g = GradOf(RewardLossOf(fused, c) + DistillLossOf(fused, c), c.logits);
  const torch::Tensor g_ref = GradOf(RewardLossOf(ref, c) + DistillLossOf(ref, c), z32);
  EXPECT_EQ(g.scalar_type(), torch::kBFloat16);
  ExpectClose(g, g_ref, 1e-2, 1e-7, "gradient (bf16 logits)");
}

TEST(FusedTokenTermsTest, LogProbsAreDetachedFloat32) {
  const Case c = MakeCase(2, 3, 11, torch::kBFloat16, 6);
  const FusedTokenTerms f = ComputeFusedTokenTerms(c.logits, c.targets, c.teacher, 1.5);
  EXPECT_FALSE(f.logprobs.requires_grad());
  EXPECT_EQ(f.logprobs.scalar_type(), torch::kFloat32);
  ExpectClose(f.logprobs, torch::log_softmax(c.logits.detach().to(torch::kFloat32) / 1.5, -1),
              1e-6, 1e-6, "log-probs");
  ExpectClose(f.token_logprobs, GatherTokenLogProbs(f.logprobs, c.targets), 0, 0, "gather");
}

TEST(FusedTokenTermsTest, GradientsMatchFiniteDifferencesInFloat64) {
  torch::manual_seed(7);
  const int64_t B = 2, L = 3, V = 5;
  const double temperature = 0.8;
  const torch::Tensor z0 = 2 * torch::randn({B, L, V}, torch::kFloat64);
  const torch::Tensor targets = torch::randint(0, V, {B, L}, torch::kInt64);
  const torch::Tensor teacher = torch::log_softmax(torch::randn({B, L, V}, torch::kFloat64), -1);
  const torch::Tensor a = torch::randn({B, L}, torch::kFloat64);
  const torch::Tensor b = torch::randn({B, L}, torch::kFloat64);
  // f = Σ a·log p(y) + Σ b·KL, with (a, 0), (0, b) and (a, b): each signal
  // alone reaches backward with the other gradient undefined.
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which);
    auto f = [&](const torch::Tensor& z) {
      const FusedTokenTerms t = ComputeFusedTokenTerms(z, targets, teacher, temperature);
      if (which == 0) return (a * t.token_logprobs).sum();
      if (which == 1) return (b * t.reverse_kl).sum();
      return (a * t.token_logprobs).sum() + (b * t.reverse_kl).sum();
    };
    const torch::Tensor z = z0.clone().requires_grad_(true);
    const torch::Tensor analytic = GradOf(f(z), z);
    torch::NoGradGuard no_grad;
    torch::Tensor numeric = torch::zeros_like(z0);
    const double eps = 1e-6;
    auto flat = numeric.view({-1});
    for (int64_t i = 0; i < z0.numel(); ++i) {
      torch::Tensor up = z0.clone(), down = z0.clone();
      up.view({-1})[i] += eps;
      down.view({-1})[i] -= eps;
      flat[i] = (f(up) - f(down)).item<double>() / (2 * eps);
    }
    EXPECT_LE(MaxAbs(analytic - numeric), 1e-7 * std::max(1.0, MaxAbs(numeric)));
  }
}

TEST(FusedTokenTermsTest, RejectsMismatchedShapes) {
  const Case c = MakeCase(2, 3, 11, torch::kFloat32, 8);
  EXPECT_THROW(ComputeFusedTokenTerms(c.logits, c.targets, c.teacher.narrow(-1, 0, 10), 1.0),
               std::invalid_argument);
  EXPECT_THROW(ComputeFusedTokenTerms(c.logits, c.targets.narrow(1, 0, 2), c.teacher, 1.0),
               std::invalid_argument);
  EXPECT_THROW(ComputeFusedTokenTerms(c.logits, c.targets, c.teacher, 0.0),
               std::invalid_argument);
}

// ComputeTokenTerms takes the fused node for reverse_kl with full teacher
// rows: the same terms and parameter gradients as the unfused path on the
// model's own logits.
TEST(FusedTokenTermsTest, ComputeTokenTermsMatchesTheUnfusedPathOnAModel) {
  model::Decoder model = testing::TinyModel(11);
  const TrainBatch batch = BuildTrainBatch(testing::RandomGroups(2, 3, true, 12), true, 0);
  LossConfig config;
  config.temperature = 1.3;
  const TokenTerms tokens = ComputeTokenTerms(model, batch, config);
  ASSERT_TRUE(tokens.distill.defined());
  EXPECT_FALSE(tokens.logprobs.requires_grad());
  const Terms ref = Unfused(tokens.logits, batch.target_tokens, batch.teacher_logprobs, 1.3);
  const torch::Tensor& mask = batch.response_mask;
  const torch::Tensor valid = mask > 0;
  ExpectClose(tokens.logprobs, StableLogSoftmax(tokens.logits.detach() / 1.3), 1e-6, 1e-6,
              "log-probs");
  ExpectClose(tokens.token_logprobs.masked_select(valid),
              ref.token_logprobs.masked_select(valid), 1e-6, 1e-6, "token log-probs");
  ExpectClose(tokens.distill.masked_select(valid), ref.reverse_kl.masked_select(valid), 1e-6,
              1e-6, "reverse KL");
  ExpectClose(tokens.entropy.masked_select(valid), ref.entropy.masked_select(valid), 1e-6, 1e-6,
              "entropy");

  const std::vector<torch::Tensor> params = model->parameters();
  const torch::Tensor reward_ref =
      PpoTokenLoss(ref.token_logprobs, batch.old_logprobs, batch.advantages, config.ppo);
  const auto grads = [&](const torch::Tensor& loss) {
    return torch::autograd::grad({loss}, params, {}, /*retain_graph=*/true, false, true);
  };
  const auto g_r = grads(Aggregate(tokens.reward, mask, config.aggregation));
  const auto g_d = grads(Aggregate(tokens.distill, mask, config.aggregation));
  const auto g_r_ref = grads(Aggregate(reward_ref, mask, config.aggregation));
  const auto g_d_ref = grads(Aggregate(ref.reverse_kl, mask, config.aggregation));
  for (size_t i = 0; i < params.size(); ++i) {
    if (!g_r_ref[i].defined()) continue;
    ExpectClose(g_r[i], g_r_ref[i], 1e-4, 1e-7, "parameter gradient of L_R");
    ExpectClose(g_d[i], g_d_ref[i], 1e-4, 1e-7, "parameter gradient of L_D");
  }
}

// Under bf16 autocast (HybridStepConfig.precision) the logits come out in
// bfloat16: the fused node computes in float32 and returns bf16 gradients,
// like the unfused ops on the same logits.
TEST(FusedTokenTermsTest, ComputeTokenTermsMatchesTheUnfusedPathUnderBf16Autocast) {
  model::Decoder model = testing::TinyModel(13);
  const TrainBatch batch = BuildTrainBatch(testing::RandomGroups(2, 3, true, 14), true, 0);
  LossConfig config;
  TokenTerms tokens;
  Terms ref;
  {
    AutocastGuard autocast(torch::kCPU, Precision::kBFloat16);
    tokens = ComputeTokenTerms(model, batch, config);
    ref = Unfused(tokens.logits, batch.target_tokens, batch.teacher_logprobs, 1.0);
  }
  EXPECT_EQ(tokens.logits.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(tokens.logprobs.scalar_type(), torch::kFloat32);
  const torch::Tensor& mask = batch.response_mask;
  const torch::Tensor valid = mask > 0;
  ExpectClose(tokens.token_logprobs.masked_select(valid),
              ref.token_logprobs.masked_select(valid), 1e-6, 1e-6, "token log-probs");
  ExpectClose(tokens.distill.masked_select(valid), ref.reverse_kl.masked_select(valid), 1e-6,
              1e-6, "reverse KL");
  const std::vector<torch::Tensor> params = model->parameters();
  const auto grads = [&](const torch::Tensor& loss) {
    return torch::autograd::grad({loss}, params, {}, /*retain_graph=*/true, false, true);
  };
  const auto g_d = grads(Aggregate(tokens.distill, mask, config.aggregation));
  const auto g_d_ref = grads(Aggregate(ref.reverse_kl, mask, config.aggregation));
  for (size_t i = 0; i < params.size(); ++i) {
    if (!g_d_ref[i].defined()) continue;
    // The logit gradients agree to bf16 rounding; the bf16 backward of the
    // matmuls carries that into the parameters.
    ExpectClose(g_d[i], g_d_ref[i], 2e-2, 1e-6, "parameter gradient of L_D (bf16 autocast)");
  }
}

// ---- Measurement (run with --gtest_also_run_disabled_tests) ----
//
// Forward + the two backward passes of the κ monitor (L_R, then L_D through
// the retained graph) at B·L = 2048, V = 32000, float32 logits: wall time and
// the heap the graph holds between forward and backward (malloc statistics:
// the saved [B, L, V] tensors), plus the peak during the whole step.

size_t HeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

struct Measured {
  double seconds = 0;
  double held_mb = 0;
  double peak_mb = 0;
};

template <typename F>
Measured Measure(const torch::Tensor& logits, const torch::Tensor& targets,
                 const torch::Tensor& teacher, double temperature, F forward) {
  const size_t base = HeapBytes();
  std::atomic<bool> running{true};
  std::atomic<size_t> peak{base};
  std::thread sampler([&] {
    while (running.load()) {
      const size_t now = HeapBytes();
      if (now > peak.load()) peak.store(now);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  Measured m;
  const auto start = std::chrono::steady_clock::now();
  {
    const Terms t = forward(logits, targets, teacher, temperature);
    m.held_mb = static_cast<double>(HeapBytes() - base) / (1 << 20);
    const torch::Tensor lr = t.token_logprobs.mean();
    const torch::Tensor ld = t.reverse_kl.mean();
    const torch::Tensor g_r = GradOf(lr, logits, /*retain=*/true);
    const torch::Tensor g_d = GradOf(ld, logits);
  }
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  running.store(false);
  sampler.join();
  m.peak_mb = static_cast<double>(peak.load() - base) / (1 << 20);
  return m;
}

TEST(FusedTokenTermsBench, DISABLED_ForwardAndTwoBackwardPasses) {
  const int64_t B = 8, L = 256, V = 32000;
  torch::manual_seed(0);
  const torch::Tensor logits = (3 * torch::randn({B, L, V})).requires_grad_(true);
  const torch::Tensor teacher = torch::log_softmax(2 * torch::randn({B, L, V}), -1);
  const torch::Tensor targets = torch::randint(0, V, {B, L}, torch::kInt64);
  std::printf("one [B, L, V] float32 tensor: %.1f MB\n",
              static_cast<double>(B * L * V * 4) / (1 << 20));
  for (double temperature : {1.0, 0.7}) {
    for (int round = 0; round < 3; ++round) {
      const Measured u = Measure(logits, targets, teacher, temperature, Unfused);
      const Measured f = Measure(logits, targets, teacher, temperature, Fused);
      std::printf(
          "tau %.1f round %d  unfused: %.3f s, graph holds %.0f MB, peak %.0f MB | "
          "fused: %.3f s, holds %.0f MB, peak %.0f MB\n",
          temperature, round, u.seconds, u.held_mb, u.peak_mb, f.seconds, f.held_mb, f.peak_mb);
    }
  }
}

}  // namespace
}  // namespace kappa::learner
