#include "learner/algo/losses.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "learner/algo/logprob_losses.h"

namespace kappa::learner {
namespace {

torch::Tensor Row(std::vector<double> v) {
  return torch::tensor(v, torch::kFloat64).unsqueeze(0);
}

void ExpectNear(const torch::Tensor& got, const torch::Tensor& want, double tol) {
  ASSERT_EQ(got.sizes(), want.sizes());
  const double err = (got.to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max().item<double>();
  EXPECT_LE(err, tol) << "got " << got << "\nwant " << want;
}

double MaxRelErr(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max()).item<double>();
}

TEST(ParseTest, KnownAndUnknownNames) {
  EXPECT_EQ(ParseAggregation("token-mean"), Aggregation::kTokenMean);
  EXPECT_EQ(ParseAggregation("seq-mean-token-mean"), Aggregation::kSeqMeanTokenMean);
  EXPECT_EQ(ParseAggregation("seq-mean-token-sum"), Aggregation::kSeqMeanTokenSum);
  EXPECT_THROW(ParseAggregation("mean"), std::invalid_argument);
  EXPECT_EQ(ParseDistillLoss("reverse_kl"), DistillLoss::kReverseKl);
  EXPECT_EQ(ParseDistillLoss("forward_kl"), DistillLoss::kForwardKl);
  EXPECT_EQ(ParseDistillLoss("sampled_reverse_kl"), DistillLoss::kSampledReverseKl);
  try {
    ParseDistillLoss("kl");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("reverse_kl"), std::string::npos);
  }
}

TEST(GrpoAdvantagesTest, HandComputedGroups) {
  const torch::Tensor rewards =
      torch::tensor({1.f, 0.f, 0.f, 1.f, 1.f, 1.f, 1.f, 1.f, 0.f, 0.f, 0.f, 1.f}).reshape({3, 4});
  const torch::Tensor a = GrpoAdvantages(rewards, /*norm_std=*/true);
  const double eps = 1e-6;
  const double h = 0.5 / (0.5 + eps);            // group 0: mean 0.5, std 0.5
  const double s2 = std::sqrt(0.25 * 0.75) + eps;  // group 2: mean 0.25
  const torch::Tensor want = torch::tensor({h, -h, -h, h, 0.0, 0.0, 0.0, 0.0, -0.25 / s2,
                                            -0.25 / s2, -0.25 / s2, 0.75 / s2})
                                 .reshape({3, 4});
  ExpectNear(a, want, 1e-6);

  // All-equal group: exactly zero, no division blow-up.
  EXPECT_EQ(a[1].abs().max().item<float>(), 0.0f);

  const torch::Tensor centered = GrpoAdvantages(rewards, /*norm_std=*/false);
  const torch::Tensor want_centered = torch::tensor({0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0,
                                                     -0.25, -0.25, -0.25, 0.75})
                                          .reshape({3, 4});
  ExpectNear(centered, want_centered, 1e-7);
  EXPECT_THROW(GrpoAdvantages(torch::zeros({4}), true), std::invalid_argument);
}

// A group of equal rewards carries no signal whatever their value: its
// advantages are exactly 0. In float32 the mean of 0.7 seven times is off by
// an ulp, and that ulp divided by std + 1e-6 used to come out near 0.06.
TEST(GrpoAdvantagesTest, EqualRewardsOfAnyValueGiveExactlyZero) {
  for (const auto& [value, group] : {std::pair{0.7f, 7}, std::pair{0.1f, 3}}) {
    const torch::Tensor rewards = torch::full({2, group}, value, torch::kFloat32);
    for (bool norm_std : {true, false}) {
      for (AdvantageStd std_kind : {AdvantageStd::kPopulation, AdvantageStd::kSample}) {
        const torch::Tensor a = GrpoAdvantages(rewards, norm_std, std_kind);
        EXPECT_EQ(a.scalar_type(), torch::kFloat32);
        EXPECT_EQ(a.abs().max().item<float>(), 0.0f)
            << value << " x " << group << " norm_std=" << norm_std << ": " << a;
      }
    }
  }
  // A group of one has nothing to compare with, under either std.
  const torch::Tensor single = torch::tensor({{0.7f}});
  EXPECT_EQ(GrpoAdvantages(single, true, AdvantageStd::kSample).item<float>(), 0.0f);
  EXPECT_EQ(GrpoAdvantages(single, true, AdvantageStd::kPopulation).item<float>(), 0.0f);
}

// trainer.advantage_std: sample divides by the ddof-1 std, as verl, TRL and
// OpenRLHF do; population (the default) by the ddof-0 one.
TEST(GrpoAdvantagesTest, SampleStdDividesByGMinusOne) {
  EXPECT_EQ(ParseAdvantageStd("population"), AdvantageStd::kPopulation);
  EXPECT_EQ(ParseAdvantageStd("sample"), AdvantageStd::kSample);
  try {
    ParseAdvantageStd("unbiased");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("population, sample"), std::string::npos) << e.what();
  }
  const torch::Tensor rewards = torch::tensor({1.f, 0.f, 0.f, 0.f}).reshape({1, 4});
  const double eps = 1e-6;
  // mean 0.25, Σ (r − mean)² = 0.75
  const double population = std::sqrt(0.75 / 4) + eps, sample = std::sqrt(0.75 / 3) + eps;
  ExpectNear(GrpoAdvantages(rewards, true, AdvantageStd::kSample),
             torch::tensor({0.75 / sample, -0.25 / sample, -0.25 / sample, -0.25 / sample})
                 .reshape({1, 4}),
             1e-6);
  ExpectNear(
      GrpoAdvantages(rewards, true),
      torch::tensor({0.75 / population, -0.25 / population, -0.25 / population, -0.25 / population})
          .reshape({1, 4}),
      1e-6);
  // Without the division the std does not matter.
  ExpectNear(GrpoAdvantages(rewards, false, AdvantageStd::kSample),
             torch::tensor({0.75, -0.25, -0.25, -0.25}).reshape({1, 4}), 1e-7);
}

TEST(PpoTokenLossTest, HandComputedClipCases) {
  PpoConfig config;  // ε_low 0.2, ε_high 0.28, dual clip 3
  const std::vector<double> ratio = {1.1, 1.5, 0.5, 0.5, 1.1, 2.0, 5.0, 1.5, 0.9};
  const std::vector<double> adv = {1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -2.0, 2.0};
  const std::vector<double> want = {
      -1.1,   // A > 0, inside the clip range
      -1.28,  // A > 0, ρ above 1+ε_high: clipped
      -0.5,   // A > 0, ρ below 1-ε_low: min picks the unclipped ρA
      0.8,    // A < 0, ρ below 1-ε_low: clipped
      1.1,    // A < 0, inside
      2.0,    // A < 0, ρ large: unclipped, below the dual cap 3
      3.0,    // A < 0, ρ = 5: capped at -c·A = 3
      3.0,    // A = -2, ρ = 1.5: 3 is below the cap 6
      -1.8};  // A > 0, inside
  const torch::Tensor logp_old = torch::full({1, 9}, -1.0, torch::kFloat64);
  const torch::Tensor logp_new =
      (logp_old + torch::tensor(ratio, torch::kFloat64).log().unsqueeze(0)).requires_grad_(true);
  const torch::Tensor loss = PpoTokenLoss(logp_new, logp_old, Row(adv), config);
  ExpectNear(loss, Row(want), 1e-12);

  // d loss / d logp_new = -A ρ where the unclipped branch is active, else 0.
  loss.sum().backward();
  const std::vector<double> want_grad = {-1.1, 0, -0.5, 0, 1.1, 2.0, 0, 3.0, -1.8};
  ExpectNear(logp_new.grad(), Row(want_grad), 1e-12);

  PpoConfig no_dual = config;
  no_dual.dual_clip = 0;
  const torch::Tensor uncapped = PpoTokenLoss(logp_new.detach(), logp_old, Row(adv), no_dual);
  EXPECT_NEAR(uncapped[0][6].item<double>(), 5.0, 1e-12);
  EXPECT_NEAR(uncapped[0][7].item<double>(), 3.0, 1e-12);

  PpoConfig bad = config;
  bad.dual_clip = 0.5;
  EXPECT_THROW(PpoTokenLoss(logp_new.detach(), logp_old, Row(adv), bad), std::invalid_argument);
}

TEST(PpoTokenLossTest, LogRatioClampedAtTwenty) {
  PpoConfig wide;
  wide.clip_high = 1e12;  // keep the clip out of the way
  wide.dual_clip = 0;
  const torch::Tensor old = torch::zeros({1, 3}, torch::kFloat64);
  const torch::Tensor fresh = Row({50.0, 1000.0, -50.0});
  const torch::Tensor loss = PpoTokenLoss(fresh, old, Row({1.0, 1.0, 1.0}), wide);
  EXPECT_NEAR(loss[0][0].item<double>() / -std::exp(20.0), 1.0, 1e-12);
  EXPECT_NEAR(loss[0][1].item<double>() / -std::exp(20.0), 1.0, 1e-12);
  EXPECT_NEAR(loss[0][2].item<double>() / -std::exp(-20.0), 1.0, 1e-12);

  // Float32 with a huge log-ratio stays finite.
  const torch::Tensor f32 = PpoTokenLoss(torch::full({1, 1}, 1e4f), torch::zeros({1, 1}),
                                         torch::ones({1, 1}), wide);
  EXPECT_TRUE(std::isfinite(f32.item<float>()));
}

// KL(p‖q) with p = softmax(z), straight from the definition, in double.
double DirectReverseKl(const std::vector<double>& z, const std::vector<double>& logq) {
  double m = z[0];
  for (double v : z) m = std::max(m, v);
  double norm = 0;
  for (double v : z) norm += std::exp(v - m);
  double kl = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    const double logp = z[i] - m - std::log(norm);
    kl += std::exp(logp) * (logp - logq[i]);
  }
  return kl;
}

std::vector<double> ToVector(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous().to(torch::kFloat64);
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

struct KlFixture : ::testing::Test {
  void SetUp() override {
    torch::manual_seed(7);
    logits = (2.0 * torch::randn({2, 3, 6}, torch::kFloat64)).requires_grad_(true);
    teacher = torch::log_softmax(torch::randn({2, 3, 6}, torch::kFloat64), -1);
    p = torch::softmax(logits.detach(), -1);
    logp = torch::log_softmax(logits.detach(), -1);
  }
  torch::Tensor logits, teacher, p, logp;
};

TEST_F(KlFixture, ReverseKlValueAndClosedFormGradient) {
  const torch::Tensor kl = ReverseKlTokenLoss(logits, teacher);
  ASSERT_EQ(kl.sizes(), (torch::IntArrayRef{2, 3}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 3; ++t) {
      const double want = DirectReverseKl(ToVector(logits.detach()[b][t]), ToVector(teacher[b][t]));
      EXPECT_NEAR(kl[b][t].item<double>(), want, 1e-12);
    }
  }
  kl.sum().backward();
  // g_D = p ⊙ (log p − log q − KL)
  const torch::Tensor closed = p * (logp - teacher - kl.detach().unsqueeze(-1));
  EXPECT_LT(MaxRelErr(logits.grad(), closed), 1e-6);
}

TEST_F(KlFixture, ReverseKlGradientMatchesFiniteDifferences) {
  ReverseKlTokenLoss(logits, teacher).sum().backward();
  const torch::Tensor z = logits.detach().clone();
  const double h = 1e-6;
  auto total = [&](const torch::Tensor& zz) { return ReverseKlTokenLoss(zz, teacher).sum().item<double>(); };
  for (int64_t flat : {0, 5, 7, 17, 30, 35}) {
    torch::Tensor plus = z.clone(), minus = z.clone();
    plus.view({-1})[flat] += h;
    minus.view({-1})[flat] -= h;
    const double fd = (total(plus) - total(minus)) / (2 * h);
    EXPECT_NEAR(logits.grad().view({-1})[flat].item<double>(), fd, 1e-7) << "index " << flat;
  }
}

TEST_F(KlFixture, ForwardKlValueAndGradient) {
  const torch::Tensor kl = ForwardKlTokenLoss(logits, teacher);
  const torch::Tensor q = teacher.exp();
  ExpectNear(kl, (q * (teacher - logp)).sum(-1), 1e-12);
  kl.sum().backward();
  EXPECT_LT(MaxRelErr(logits.grad(), p - q), 1e-6);  // g_D = p − q
}

// A teacher log-prob of −inf (an id it gives no mass) contributes 0 to the
// forward KL (0 · log 0 = 0) and nothing to the gradient; 0 · ∞ was NaN.
TEST_F(KlFixture, ForwardKlSkipsIdsTheTeacherGivesNoMass) {
  const double inf = std::numeric_limits<double>::infinity();
  torch::Tensor zero_mass = teacher.clone();
  zero_mass.index_put_({0, 1, 2}, -inf);
  zero_mass.index_put_({1, 2, 0}, -inf);
  zero_mass.index_put_({1, 2, 5}, -inf);
  zero_mass = zero_mass - zero_mass.logsumexp(-1, /*keepdim=*/true);  // q sums to 1 again
  const torch::Tensor kl = ForwardKlTokenLoss(logits, zero_mass);
  EXPECT_TRUE(torch::isfinite(kl).all().item<bool>()) << kl;
  const torch::Tensor q = zero_mass.exp();
  const torch::Tensor terms = torch::where(q > 0, q * (zero_mass - logp), torch::zeros_like(q));
  ExpectNear(kl, terms.sum(-1), 1e-12);
  kl.sum().backward();
  EXPECT_TRUE(torch::isfinite(logits.grad()).all().item<bool>()) << logits.grad();
  EXPECT_LT(MaxRelErr(logits.grad(), p - q), 1e-6);  // g_D = p − q, q = 0 there
  // The log-prob form, in float32 (the learner's), is as finite.
  const torch::Tensor f32 =
      ForwardKlFromLogProbs(logp.to(torch::kFloat32), zero_mass.to(torch::kFloat32));
  EXPECT_TRUE(torch::isfinite(f32).all().item<bool>()) << f32;
}

TEST_F(KlFixture, SampledReverseKlIsK1TimesScoreFunction) {
  const torch::Tensor targets = torch::tensor({0, 3, 5, 2, 2, 1}, torch::kInt64).reshape({2, 3});
  const torch::Tensor student = TokenLogProbs(logits, targets);
  const torch::Tensor teacher_tok = teacher.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  const torch::Tensor loss = SampledReverseKlTokenLoss(student, teacher_tok);
  const torch::Tensor k1 = student.detach() - teacher_tok;
  ExpectNear(loss, k1 * student.detach(), 1e-12);
  loss.sum().backward();
  // ∇_z log p(y) = e_y − p
  const torch::Tensor onehot = torch::one_hot(targets, 6).to(torch::kFloat64);
  EXPECT_LT(MaxRelErr(logits.grad(), k1.unsqueeze(-1) * (onehot - p)), 1e-9);
}

TEST_F(KlFixture, TokenLogProbsAndEntropy) {
  const torch::Tensor targets = torch::tensor({1, 4, 0, 5, 3, 2}, torch::kInt64).reshape({2, 3});
  const torch::Tensor lp = TokenLogProbs(logits.detach(), targets);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_NEAR(lp[b][t].item<double>(), logp[b][t][targets[b][t].item<int64_t>()].item<double>(), 1e-12);
    }
  }
  ExpectNear(TokenEntropy(logits.detach()), -(p * logp).sum(-1), 1e-12);
  // Uniform logits: H = log V.
  EXPECT_NEAR(TokenEntropy(torch::zeros({1, 1, 6})).item<float>(), std::log(6.0), 1e-6);
  EXPECT_THROW(TokenLogProbs(logits.detach(), torch::zeros({2, 4}, torch::kInt64)),
               std::invalid_argument);
}

TEST(AggregateTest, ThreeModesWithMask) {
  torch::Tensor x = torch::tensor({1., 2., 3., 4., 5., 6., 7., 8., 9.}).reshape({3, 3});
  const torch::Tensor mask = torch::tensor({1., 0., 0., 0., 1., 1., 0., 0., 0.}).reshape({3, 3});
  // A NaN at a masked position must not leak into the result.
  x[2][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NEAR(Aggregate(x, mask, Aggregation::kTokenMean).item<float>(), (1 + 5 + 6) / 3.0, 1e-6);
  EXPECT_NEAR(Aggregate(x, mask, Aggregation::kSeqMeanTokenMean).item<float>(), (1 + 5.5) / 2.0,
              1e-6);
  EXPECT_NEAR(Aggregate(x, mask, Aggregation::kSeqMeanTokenSum).item<float>(), (1 + 11) / 2.0,
              1e-6);
  // Empty mask: zero, not NaN.
  EXPECT_EQ(Aggregate(x, torch::zeros({3, 3}), Aggregation::kTokenMean).item<float>(), 0.0f);
  EXPECT_THROW(Aggregate(x, torch::ones({3, 2}), Aggregation::kTokenMean), std::invalid_argument);
}

TEST(AggregateTest, GradientOnlyReachesValidPositions) {
  const torch::Tensor x = torch::ones({2, 2}).requires_grad_(true);
  const torch::Tensor mask = torch::tensor({1., 1., 0., 1.}).reshape({2, 2});
  Aggregate(x, mask, Aggregation::kSeqMeanTokenMean).backward();
  ExpectNear(x.grad(), torch::tensor({0.25, 0.25, 0.0, 0.5}).reshape({2, 2}), 1e-7);
}

}  // namespace
}  // namespace kappa::learner
