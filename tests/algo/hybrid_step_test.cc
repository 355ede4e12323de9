// The full learner step: κ is the ratio of separately computed gradient
// norms, the separate gradients sum to the naive one, and every balancing and
// gating mode runs and reports what it did.
#include "learner/algo/hybrid_step.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "learner/algo/logit_gradients.h"
#include "learner/algo/losses.h"
#include "model/lora.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::GlobalNorm;
using testing::Grads;
using testing::RandomGroups;
using testing::TinyModel;
using testing::ZeroGrads;

HybridStep MakeStep(model::Decoder model, HybridStepConfig config) {
  // No clipping, so .grad after the step is exactly the combined gradient.
  auto optimizer = std::make_unique<PolicyOptimizer>(model, 1e-6, 0.0, /*max_grad_norm=*/0.0);
  return HybridStep(model, std::move(optimizer), std::move(config));
}

struct StepFixture : ::testing::Test {
  TrainBatch batch = BuildTrainBatch(RandomGroups(3, 4, true, 17), true, 0);
};

TEST_F(StepFixture, KappaIsTheRatioOfSeparateNormsAndTheSumIsTheNaiveGradient) {
  const double lambda = 0.3;
  model::Decoder reference = TinyModel(2);
  LossConfig loss;
  ComputeLossTerms(reference, batch, loss).reward_loss.backward();
  const double reward_norm = GlobalNorm(Grads(reference));
  ZeroGrads(reference);
  ComputeLossTerms(reference, batch, loss).distill_loss.backward();
  const double distill_norm = GlobalNorm(Grads(reference));
  ZeroGrads(reference);
  LossTerms naive = ComputeLossTerms(reference, batch, loss);
  (naive.reward_loss + lambda * naive.distill_loss).backward();
  const std::vector<torch::Tensor> naive_grad = Grads(reference);

  for (const int64_t kappa_every : {1, 0}) {
    model::Decoder model = TinyModel(2);
    HybridStepConfig config;
    config.loss.lambda = lambda;
    config.monitor.kappa_every = kappa_every;
    HybridStep step = MakeStep(model, config);
    const HybridStepReport report = step.Run(batch);
    if (kappa_every == 1) {
      ASSERT_TRUE(report.stats.kappa().has_value());
      EXPECT_NEAR(*report.stats.kappa(), reward_norm / distill_norm,
                  1e-5 * reward_norm / distill_norm);
    } else {
      EXPECT_FALSE(report.stats.kappa().has_value());  // one backward pass, nothing measured
    }
    const std::vector<torch::Tensor> got = Grads(model);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[i], naive_grad[i], 1e-4, 1e-7))
          << "parameter " << i << " kappa_every " << kappa_every;
    }
  }
}

// A LoRA student (docs/algorithms.md §3.1): only the adapters train, so κ is
// the ratio of the two signals' gradient norms over the adapters' parameters,
// computed here with autograd::grad on a copy, independently of the step.
TEST_F(StepFixture, KappaOfAnAdapterOnlyStepIsTheRatioOfAdapterGradientNorms) {
  model::Decoder model = TinyModel(2);
  model::LoraConfig lora;
  lora.rank = 2;
  lora.alpha = 3.0;
  lora.target_modules = {"q_proj", "v_proj", "gate_proj", "down_proj"};
  torch::manual_seed(11);
  model->EnableLora(lora);
  std::vector<torch::Tensor> adapters, frozen;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      const bool adapter = p.key().find(".lora_") != std::string::npos;
      // B starts at zero in a fresh adapter; a trained one is not.
      if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0.0, 0.05);
      p.value().set_requires_grad(adapter);
      (adapter ? adapters : frozen).push_back(p.value());
    }
  }
  // A and B on four targets in every layer.
  ASSERT_EQ(static_cast<int64_t>(adapters.size()), 2 * 4 * model->config().num_hidden_layers);
  model::Decoder reference = model::CloneDecoder(model);
  std::vector<torch::Tensor> reference_adapters;
  for (auto& p : reference->named_parameters()) {
    if (p.key().find(".lora_") != std::string::npos) reference_adapters.push_back(p.value());
  }
  LossConfig loss;
  auto adapter_norm = [&](const torch::Tensor& term) {
    const std::vector<torch::Tensor> grads =
        torch::autograd::grad({term}, reference_adapters, {}, false, false, true);
    double sq = 0;
    for (const torch::Tensor& g : grads) {
      if (g.defined()) sq += g.to(torch::kFloat64).square().sum().item<double>();
    }
    return std::sqrt(sq);
  };
  const double reward_norm = adapter_norm(ComputeLossTerms(reference, batch, loss).reward_loss);
  const double distill_norm = adapter_norm(ComputeLossTerms(reference, batch, loss).distill_loss);
  ASSERT_GT(reward_norm, 0);
  ASSERT_GT(distill_norm, 0);

  // The whole-vocabulary head, and the chunked one (whose frozen output
  // weight gets no gradient buffer), each on its own copy of the model.
  for (const int64_t chunk : {0, 4}) {
    model::Decoder trained = model::CloneDecoder(model);
    std::vector<torch::Tensor> trained_frozen, trained_adapters;
    for (auto& p : trained->named_parameters()) {
      const bool adapter = p.key().find(".lora_") != std::string::npos;
      p.value().set_requires_grad(adapter);
      (adapter ? trained_adapters : trained_frozen).push_back(p.value());
    }
    HybridStepConfig config;
    config.monitor.kappa_every = 1;
    config.loss.vocab_chunk_positions = chunk;
    auto optimizer = std::make_unique<PolicyOptimizer>(trained, 1e-2, 0.0, /*max_grad_norm=*/0.0);
    ASSERT_EQ(optimizer->parameters().size(), adapters.size());
    HybridStep step(trained, std::move(optimizer), config);
    const HybridStepReport report = step.Run(batch);
    ASSERT_TRUE(report.stats.kappa().has_value()) << "chunk " << chunk;
    EXPECT_NEAR(*report.stats.kappa(), reward_norm / distill_norm,
                1e-5 * reward_norm / distill_norm)
        << "chunk " << chunk;
    EXPECT_NEAR(report.stats.reward_grad_norm, reward_norm, 1e-5 * reward_norm);
    EXPECT_NEAR(report.stats.distill_grad_norm, distill_norm, 1e-5 * distill_norm);
    for (size_t i = 0; i < frozen.size(); ++i) {
      EXPECT_TRUE(torch::equal(trained_frozen[i], frozen[i])) << "frozen parameter " << i;
      EXPECT_FALSE(trained_frozen[i].grad().defined()) << "frozen parameter " << i;
    }
    int64_t moved = 0;
    for (size_t i = 0; i < adapters.size(); ++i) {
      moved += !torch::equal(trained_adapters[i], adapters[i]);
    }
    EXPECT_EQ(moved, static_cast<int64_t>(adapters.size())) << "chunk " << chunk;
  }
}

TEST_F(StepFixture, EveryBalanceAndGateRunsWithFiniteStatistics) {
  const std::vector<std::vector<std::string>> balances = {
      {"naive"}, {"m3_norm"}, {"m3_mask"}, {"m3_project"}, {"m3_adapt"},
      {"m3_norm", "m3_project"}, {"m3_mask", "m3_project", "m3_adapt"}};
  for (const auto& names : balances) {
    for (const DistillGate gate : {DistillGate::kNone, DistillGate::kAll, DistillGate::kRstg}) {
      HybridStepConfig config;
      config.balance = ParseBalance(names);
      config.gate = gate;
      config.loss.lambda = 0.05;
      HybridStep step = MakeStep(TinyModel(3), config);
      for (int i = 0; i < 2; ++i) {
        const HybridStepReport r = step.Run(batch);
        EXPECT_TRUE(std::isfinite(r.stats.grad_norm)) << BalanceName(config.balance);
        EXPECT_TRUE(std::isfinite(r.stats.reward_loss));
        if (gate == DistillGate::kNone) {
          EXPECT_EQ(r.stats.distill_loss, 0.0);
          EXPECT_FALSE(r.kdr.has_value());
        }
        if (gate == DistillGate::kAll) {
          ASSERT_TRUE(r.kdr.has_value());
          EXPECT_EQ(r.kdr->positions, batch.response_mask.sum().item<int64_t>());
        }
        if (config.balance.normalize && gate == DistillGate::kAll) {
          // κ_eff = κ_target / λ = 1 / 0.05
          EXPECT_NEAR(r.stats.balanced_reward_grad_norm /
                          (r.stats.distill_scale * r.stats.distill_grad_norm),
                      1.0 / config.loss.lambda, 1e-5);
        }
      }
    }
  }
}

TEST_F(StepFixture, MaskDropsTheRewardTermExactlyWhereTheLogitKernelIsNegative) {
  model::Decoder model = TinyModel(4);
  model::Decoder reference = model::CloneDecoder(model);
  HybridStepConfig config;
  config.balance = ParseBalance({"m3_mask"});
  config.loss.lambda = 0.0;  // .grad = ∇ of the masked L_R alone
  HybridStep step = MakeStep(model, config);
  const HybridStepReport report = step.Run(batch);

  // Independent: negative K_DR positions from the closed forms, then the
  // reward loss with those positions zeroed by hand.
  const TrainBatch b = batch;
  TokenTerms tokens = ComputeTokenTerms(reference, b, config.loss);
  torch::Tensor kernel;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor lp = tokens.logprobs.detach();
    const torch::Tensor c = RewardLogProbCoefficient(tokens.token_logprobs.detach(),
                                                     b.old_logprobs, b.advantages, config.loss.ppo);
    kernel = LogitCrossKernel(RewardLogitGradient(lp, b.target_tokens, c, 1.0),
                              DistillLogitGradient(lp, b.teacher(), b.target_tokens,
                                                   DistillLoss::kReverseKl, 1.0)) *
             b.response_mask;
  }
  const torch::Tensor conflicting = (kernel < 0) & (b.response_mask > 0);
  EXPECT_EQ(report.masked_positions, conflicting.sum().item<int64_t>());
  EXPECT_GT(report.masked_positions, 0);
  const torch::Tensor keep = (~conflicting).to(torch::kFloat32);
  Aggregate(tokens.reward * keep, b.response_mask, Aggregation::kTokenMean).backward();
  const auto want = Grads(reference);
  const auto got = Grads(model);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-7)) << "parameter " << i;
  }
}

// The per-position terms of `b` under `model`, written out here rather than
// taken from ComputeTokenTerms: ℓ_R(n) (the PPO token loss) and the reverse
// KL ℓ_D(n) of full teacher rows, from logits the caller may detach.
struct ReferenceTerms {
  torch::Tensor reward, distill;  // [B, L]
};
ReferenceTerms TermsFromLogits(const torch::Tensor& logits, const TrainBatch& b,
                               const PpoConfig& ppo) {
  const torch::Tensor lp = torch::log_softmax(logits, -1);
  const torch::Tensor token = lp.gather(-1, b.target_tokens.unsqueeze(-1)).squeeze(-1);
  return {PpoTokenLoss(token, b.old_logprobs, b.advantages, ppo),
          (lp.exp() * (lp - b.teacher_logprobs)).sum(-1)};
}

// K_DR(n) of the `logit` estimator (g_R(n)·g_D(n)) and of `last_layer`
// (‖h_n‖² g_R·g_D), with g_R(n), g_D(n) taken by autograd at the logits
// (ℓ(n) depends on z_n alone, so one backward pass gives every position's),
// not from the closed forms the step uses. 0 outside the response.
std::pair<torch::Tensor, torch::Tensor> KernelsByAutograd(model::Decoder& model,
                                                          const TrainBatch& b,
                                                          const PpoConfig& ppo) {
  const model::ForwardOutput out = model->Forward(b.input_tokens, b.attention_mask);
  const torch::Tensor z = out.logits.detach().requires_grad_(true);
  const ReferenceTerms terms = TermsFromLogits(z, b, ppo);
  const torch::Tensor g_r = torch::autograd::grad({(terms.reward * b.response_mask).sum()}, {z}, {},
                                                  /*retain_graph=*/true)[0];
  const torch::Tensor g_d =
      torch::autograd::grad({(terms.distill * b.response_mask).sum()}, {z})[0];
  const torch::Tensor logit = (g_r * g_d).sum(-1) * b.response_mask;
  return {logit, logit * out.hidden.detach().square().sum(-1)};
}

// m3_mask through a real step for every mask_target × mask_estimator ×
// hard/soft the config reaches: the update equals ∇(w_R agg(m_R ℓ_R) +
// λ agg(m_D ℓ_D)) with the weights m computed here from the kernels above.
TEST_F(StepFixture, MaskTargetEstimatorAndSoftMaskGiveTheExpectedCombination) {
  struct Case {
    BalanceConfig::MaskTarget target;
    KdrEstimator estimator;
    bool soft;
  };
  using Target = BalanceConfig::MaskTarget;
  for (const Case c : {Case{Target::kDistill, KdrEstimator::kLogit, false},
                       Case{Target::kReward, KdrEstimator::kLastLayer, true},
                       Case{Target::kDistill, KdrEstimator::kLastLayer, true},
                       Case{Target::kReward, KdrEstimator::kLogit, true}}) {
    const std::string name = std::string(c.target == Target::kReward ? "reward" : "distill") + "/" +
                             KdrEstimatorName(c.estimator) + (c.soft ? "/soft" : "/hard");
    const double lambda = 0.5;
    model::Decoder model = TinyModel(4);
    model::Decoder reference = model::CloneDecoder(model);
    HybridStepConfig config;
    config.balance = ParseBalance({"m3_mask"});
    config.balance.mask_target = c.target;
    config.balance.mask_estimator = c.estimator;
    config.loss.lambda = lambda;
    const torch::Tensor& mask = batch.response_mask;

    const auto [logit_kernel, last_layer_kernel] =
        KernelsByAutograd(reference, batch, config.loss.ppo);
    const torch::Tensor kernel =
        c.estimator == KdrEstimator::kLogit ? logit_kernel : last_layer_kernel;
    const torch::Tensor conflicting = (kernel < 0) & (mask > 0);
    ASSERT_GT(conflicting.sum().item<int64_t>(), 0) << name;
    // τ: the median |K| of the conflicting positions, so the soft weights
    // spread over (0, ½) instead of sitting at 0.
    const double tau =
        c.soft ? kernel.masked_select(conflicting).abs().median().item<double>() : 0.0;
    config.balance.mask_temperature = tau;
    // m(n): 1 where K ≥ 0; 0 (hard) or 1 / (1 + e^(−K/τ)) (soft) where K < 0.
    const auto weights_of = [&](const torch::Tensor& k) {
      const torch::Tensor kept = c.soft ? 1.0 / (1.0 + torch::exp(-k / tau)) : torch::zeros_like(k);
      return torch::where(conflicting, kept, torch::ones_like(k));
    };
    const torch::Tensor weight = weights_of(kernel);
    if (c.soft) {
      // The other estimator's weights differ: the case tells them apart.
      const torch::Tensor other =
          weights_of(c.estimator == KdrEstimator::kLogit ? last_layer_kernel : logit_kernel);
      EXPECT_GT((other - weight).abs().max().item<double>(), 0.05) << name;
    }

    HybridStep step = MakeStep(model, config);
    const HybridStepReport report = step.Run(batch);
    EXPECT_EQ(report.masked_positions, conflicting.sum().item<int64_t>()) << name;

    const torch::Tensor w_r = c.target == Target::kReward ? weight : torch::ones_like(weight);
    const torch::Tensor w_d = c.target == Target::kDistill ? weight : torch::ones_like(weight);
    const ReferenceTerms terms =
        TermsFromLogits(reference->Forward(batch.input_tokens, batch.attention_mask).logits, batch,
                        config.loss.ppo);
    const torch::Tensor tokens = mask.sum();
    ((terms.reward * w_r * mask).sum() / tokens +
     lambda * (terms.distill * w_d * mask).sum() / tokens)
        .backward();
    const auto want = Grads(reference);
    const auto got = Grads(model);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-7)) << name << " parameter " << i;
    }
  }
}

// trainer.lambda_schedule: each step distils with the schedule's λ for its
// 0-based index (warm-up to the peak, then cosine to min_ratio · peak), and
// loss.lambda is not used; the measured κ_eff sees that λ.
TEST_F(StepFixture, AScheduledLambdaIsTheScheduleAtEachStep) {
  LearningRateSchedule schedule;
  schedule.peak = 2.0;
  schedule.warmup_steps = 2;
  schedule.decay = LearningRateSchedule::Decay::kCosine;
  schedule.total_steps = 5;
  schedule.min_ratio = 0.25;
  HybridStepConfig config;
  config.loss.lambda = 7.0;  // not used under a schedule
  config.lambda_schedule = schedule;
  config.monitor.kappa_every = 1;
  HybridStep step = MakeStep(TinyModel(4), config);
  for (int64_t t = 0; t < 5; ++t) {
    const HybridStepReport report = step.Run(batch);
    EXPECT_DOUBLE_EQ(report.lambda, schedule.At(t)) << "step " << t;
    EXPECT_DOUBLE_EQ(report.stats.distill_scale, schedule.At(t)) << "step " << t;
  }
  EXPECT_DOUBLE_EQ(schedule.At(0), 1.0);  // warm-up: 2 · 1/2
  EXPECT_DOUBLE_EQ(schedule.At(1), 2.0);  // the peak
  EXPECT_DOUBLE_EQ(schedule.At(5), 0.5);  // the floor, 0.25 · 2

  config.balance = ParseBalance({"m3_adapt"});
  EXPECT_THROW(MakeStep(TinyModel(4), config), std::invalid_argument);
}

// m3_norm on a step whose groups all tie (every advantage 0, so g_R = 0):
// no magnitude to match, and s falls back to λ, so the step is λ ∇L_D
// (docs/algorithms.md §4.3), not zero.
TEST_F(StepFixture, NormKeepsLambdaWhenEveryGroupTies) {
  std::vector<ScoredGroup> groups = RandomGroups(3, 4, true, 17);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (ScoredSample& s : groups[g].samples) s.reward = static_cast<float>(g % 2);
  }
  const TrainBatch tied = BuildTrainBatch(groups, true, 0);
  ASSERT_EQ(tied.advantages.abs().max().item<double>(), 0.0);

  const double lambda = 0.3;
  model::Decoder model = TinyModel(5);
  model::Decoder reference = model::CloneDecoder(model);
  HybridStepConfig config;
  config.balance = ParseBalance({"m3_norm"});
  config.balance.kappa_target = 2.0;
  config.loss.lambda = lambda;
  HybridStep step = MakeStep(model, config);
  const HybridStepReport report = step.Run(tied);
  EXPECT_EQ(report.stats.balanced_reward_grad_norm, 0.0);
  EXPECT_GT(report.stats.distill_grad_norm, 0.0);
  EXPECT_EQ(report.stats.distill_scale, lambda);

  const ReferenceTerms terms = TermsFromLogits(
      reference->Forward(tied.input_tokens, tied.attention_mask).logits, tied, config.loss.ppo);
  (lambda * (terms.distill * tied.response_mask).sum() / tied.response_mask.sum()).backward();
  const auto want = Grads(reference);
  const auto got = Grads(model);
  EXPECT_GT(GlobalNorm(got), 0.0);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-7)) << "parameter " << i;
  }

  // A step with reward signal on the same model still normalizes, to
  // κ_target / λ.
  const HybridStepReport mixed = step.Run(batch);
  EXPECT_NEAR(mixed.stats.balanced_reward_grad_norm /
                  (mixed.stats.distill_scale * mixed.stats.distill_grad_norm),
              2.0 / lambda, 1e-5);
}

// Under RSTG the exact K_DR still runs, on the configured number of sampled
// positions; its values and the sign agreement are checked against autograd
// in KdrMonitorTest.ReportedKdrEqualsPerPositionAutogradOfTheDefinition.
TEST_F(StepFixture, RstgTrainsOnDemonstrationsAndSamplesExactKdrPositions) {
  std::vector<ScoredGroup> groups = RandomGroups(3, 4, true, 17);
  for (ScoredSample& s : groups[1].samples) s.reward = 0;  // negative zero-variance
  groups[1].teacher_demonstrations = {{5, 6, 2}, {7, 2}};
  const TrainBatch rstg_batch = BuildTrainBatch(groups, true, 0);
  ASSERT_EQ(rstg_batch.num_demonstrations, 2);

  HybridStepConfig config;
  config.gate = DistillGate::kRstg;
  config.sft_weight = 0.1;
  config.monitor.kdr_exact_every = 1;
  config.monitor.kdr_exact_positions = 8;
  HybridStep step = MakeStep(TinyModel(6), config);
  const HybridStepReport r = step.Run(rstg_batch);
  EXPECT_EQ(r.gated_groups, 1);
  EXPECT_EQ(r.demonstrations, 2);
  EXPECT_GT(r.stats.sft_loss, 0.0);
  EXPECT_GT(r.distill_positions, 0);
  EXPECT_EQ(r.exact_positions, 8);
  ASSERT_TRUE(r.agreement_logit.has_value());
  EXPECT_GE(*r.agreement_logit, 0.0);
  EXPECT_LE(*r.agreement_logit, 1.0);
  EXPECT_EQ(*r.agreement_logit, *r.agreement_last_layer);  // ‖h‖² > 0: same signs
}

}  // namespace
}  // namespace kappa::learner
