// The fused head (trainer.fused_head, learner/algo/fused_head.h) against the
// head that recomputes each chunk in backward (vocab_head.h): one whole
// HybridStep each, on copies of one model, over the settings that change
// what the fused forward must know in advance — every distillation loss and
// teacher row form, the three aggregations, m3_mask on either term from
// either estimator (hard and soft), the RSTG gate, micro-batches, a
// temperature, bf16 autocast and a frozen (LoRA) head. The gradient norms
// of both losses (κ), every cheap K_DR value, the masked positions, the
// diagnostics and the updated parameters must agree.
#include "learner/algo/fused_head.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "learner/algo/hybrid_step.h"
#include "learner/algo/optimizer_step.h"
#include "learner/algo/train_batch.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::RandomGroups;
using testing::TinyModel;

constexpr double kLearningRate = 1e-2;

// Each sample's full teacher row as the form `rows` names: full, sampled,
// top-k (k ids, their log-probs and the sent tail) or hidden (a head and
// hidden states standing in for the rows).
TrainBatch BatchOf(const std::string& rows, uint64_t seed, bool all_zero_group = false) {
  std::vector<ScoredGroup> groups = RandomGroups(4, 3, /*with_teacher=*/true, seed);
  if (all_zero_group) {
    for (ScoredSample& s : groups[1].samples) s.reward = 0.0f;
  }
  TeacherHead head;
  if (rows == "hidden") head.weight = torch::randn({16, 6});
  for (ScoredGroup& g : groups) {
    for (ScoredSample& s : g.samples) {
      const torch::Tensor y = torch::tensor(s.response_tokens, torch::kInt64);
      if (rows == "sampled") {
        s.teacher_logprobs = s.teacher_logprobs.gather(1, y.unsqueeze(1)).squeeze(1).contiguous();
      } else if (rows == "topk") {
        const auto [values, ids] = s.teacher_logprobs.topk(5, -1);
        s.teacher_tail_logmass =
            s.teacher_logprobs.scatter(-1, ids, -std::numeric_limits<float>::infinity())
                .logsumexp(-1)
                .contiguous();
        s.teacher_topk_ids = ids.contiguous();
        s.teacher_logprobs = values.contiguous();
      } else if (rows == "hidden") {
        s.teacher_hidden = 2.0 * torch::randn({y.size(0), 6});
        s.teacher_logprobs = torch::Tensor();
      }
    }
  }
  TrainBatch batch = BuildTrainBatch(groups, /*norm_std=*/true, /*pad_id=*/0);
  batch.teacher_head = head;
  return batch;
}

struct Setting {
  std::string name;
  std::string rows = "full";
  DistillLoss loss = DistillLoss::kReverseKl;
  Aggregation aggregation = Aggregation::kTokenMean;
  bool mask = false;
  BalanceConfig::MaskTarget mask_target = BalanceConfig::MaskTarget::kReward;
  KdrEstimator mask_estimator = KdrEstimator::kLogit;
  double mask_temperature = 0.0;
  bool rstg = false;
  int64_t micro = 0;
  double temperature = 1.0;
  bool lora = false;
  Precision precision = Precision::kFloat32;
  // κ off: one combined backward, which the fused head precombines.
  bool plain = false;
};

struct Outcome {
  HybridStepReport report;
  std::vector<torch::Tensor> params;  // after the step
};

Outcome Step(const Setting& s, const TrainBatch& batch, bool fused) {
  model::Decoder m = TinyModel(9);
  if (s.lora) {
    model::LoraConfig lora;
    lora.rank = 2;
    lora.target_modules = {"q_proj", "v_proj", "down_proj"};
    torch::manual_seed(4);
    m->EnableLora(lora);
    torch::NoGradGuard no_grad;
    for (auto& p : m->named_parameters()) {
      const bool adapter = p.key().find(".lora_") != std::string::npos;
      if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0.0, 0.05);
      p.value().set_requires_grad(adapter);
    }
  }
  HybridStepConfig config;
  config.precision = s.precision;
  config.loss.distill = s.loss;
  config.loss.aggregation = s.aggregation;
  config.loss.temperature = s.temperature;
  config.loss.vocab_chunk_positions = 3;
  config.loss.fused_head = fused;
  config.micro_batch_sequences = s.micro;
  config.monitor.kdr_estimator = KdrEstimator::kLogit;
  config.monitor.kappa_every = s.plain ? 0 : 1;
  config.balance.mask = s.mask;
  config.balance.mask_target = s.mask_target;
  config.balance.mask_estimator = s.mask_estimator;
  config.balance.mask_temperature = s.mask_temperature;
  if (s.rstg) {
    config.gate = DistillGate::kRstg;
    config.rstg.confidence =
        s.rows == "topk" ? RstgConfig::Confidence::kMaxProb : RstgConfig::Confidence::kTokenProb;
  }
  auto optimizer = std::make_unique<PolicyOptimizer>(m, kLearningRate, 0.0, /*max_grad_norm=*/0.0);
  HybridStep step(m, std::move(optimizer), config);
  Outcome out;
  out.report = step.Run(batch);
  for (const auto& p : m->parameters()) out.params.push_back(p.detach().clone());
  return out;
}

void ExpectNear(double got, double want, double tol, const std::string& what) {
  EXPECT_NEAR(got, want, tol * std::max(1.0, std::abs(want))) << what;
}

void ExpectSameStep(const Outcome& fused, const Outcome& recomputed, double tol,
                    const std::string& what) {
  const HybridStepReport &a = fused.report, &b = recomputed.report;
  ASSERT_GT(b.stats.grad_norm, 0.0) << what;
  ExpectNear(a.stats.grad_norm, b.stats.grad_norm, tol, what + " ‖g‖");
  ExpectNear(a.stats.reward_loss, b.stats.reward_loss, tol, what + " L_R");
  ExpectNear(a.stats.distill_loss, b.stats.distill_loss, tol, what + " L_D");
  ExpectNear(a.stats.reward_grad_norm, b.stats.reward_grad_norm, tol, what + " ‖∇L_R‖");
  ExpectNear(a.stats.distill_grad_norm, b.stats.distill_grad_norm, tol, what + " ‖∇L_D‖");
  ExpectNear(a.entropy, b.entropy, tol, what + " entropy");
  ExpectNear(a.clip_fraction, b.clip_fraction, tol, what + " clip fraction");
  EXPECT_EQ(a.masked_positions, b.masked_positions) << what;
  ASSERT_EQ(a.kdr_values.size(), b.kdr_values.size()) << what;
  double kdr_scale = 0;
  for (float v : b.kdr_values) kdr_scale = std::max(kdr_scale, static_cast<double>(std::abs(v)));
  for (size_t i = 0; i < b.kdr_values.size(); ++i) {
    EXPECT_NEAR(a.kdr_values[i], b.kdr_values[i], tol * std::max(1e-30, kdr_scale))
        << what << " K_DR at " << i;
  }
  ASSERT_EQ(fused.params.size(), recomputed.params.size());
  for (size_t i = 0; i < fused.params.size(); ++i) {
    const double diff = (fused.params[i] - recomputed.params[i]).abs().max().item<double>();
    // AdamW's first update is lr · g / (|g| + ε) per element: an element
    // whose gradient is of the order of ε moves by a visible fraction of lr
    // for float32 rounding alone. 1 % of lr still tells a wrong gradient
    // (whose elements move by up to lr) from a right one.
    EXPECT_LT(diff, 1e-2 * kLearningRate) << what << " parameter " << i << " after the step";
  }
}

std::vector<Setting> Settings() {
  std::vector<Setting> out;
  auto add = [&](Setting s) { out.push_back(std::move(s)); };
  add({"reverse_kl"});
  add({"forward_kl", "full", DistillLoss::kForwardKl});
  add({"sampled_reverse_kl/sampled", "sampled", DistillLoss::kSampledReverseKl});
  add({"topk_reverse_kl", "topk", DistillLoss::kTopkReverseKl});
  add({"topk_tail_reverse_kl", "topk", DistillLoss::kTopkTailReverseKl});
  add({"hidden reverse_kl", "hidden"});
  {
    Setting s{"seq-mean-token-mean, m3_mask on L_R (logit, hard)"};
    s.aggregation = Aggregation::kSeqMeanTokenMean;
    s.mask = true;
    add(s);
  }
  {
    Setting s{"seq-mean-token-sum, m3_mask on L_D (last_layer, soft), micro-batches"};
    s.aggregation = Aggregation::kSeqMeanTokenSum;
    s.mask = true;
    s.mask_target = BalanceConfig::MaskTarget::kDistill;
    s.mask_estimator = KdrEstimator::kLastLayer;
    s.mask_temperature = 0.5;
    s.micro = 4;
    add(s);
  }
  {
    Setting s{"RSTG gate, top-k tail, τ 0.7", "topk", DistillLoss::kTopkTailReverseKl};
    s.rstg = true;
    s.temperature = 0.7;
    add(s);
  }
  {
    Setting s{"LoRA (frozen head), micro-batches, m3_mask"};
    s.lora = true;
    s.micro = 5;
    s.mask = true;
    add(s);
  }
  // Plain steps: the head folds L_R and L_D into one stored gradient with
  // the optimizer's weights, micro-batch shares included.
  for (Setting s : std::vector<Setting>(out)) {
    s.name = "plain step, " + s.name;
    s.plain = true;
    add(s);
  }
  return out;
}

TEST(FusedHead, TheStepEqualsTheRecomputingHeads) {
  for (const Setting& s : Settings()) {
    const TrainBatch batch = BatchOf(s.rows, 17, /*all_zero_group=*/s.rstg);
    ExpectSameStep(Step(s, batch, /*fused=*/true), Step(s, batch, /*fused=*/false), 1e-5, s.name);
  }
}

// The per-position values and the losses without a stored gradient carry
// no graph: nothing can backpropagate through them (or keep the node's
// stored [V, D] gradients alive).
TEST(FusedHead, OnlyTheLossesWithAStoredGradientHaveAGraph) {
  const TrainBatch batch = BatchOf("full", 23);
  model::Decoder m = TinyModel(9);
  for (const bool combine : {false, true}) {
    FusedHeadInputs in;
    const torch::Tensor positions = batch.response_mask.reshape({-1}).nonzero().squeeze(-1);
    auto at = [&](const torch::Tensor& t) { return t.reshape({-1}).index_select(0, positions); };
    const int64_t n = positions.size(0);
    in.hidden = torch::randn({n, m->config().hidden_size}, torch::requires_grad());
    in.weight = m->OutputWeight();
    in.targets = at(batch.target_tokens);
    in.old_logprobs = at(batch.old_logprobs);
    in.advantages = at(batch.advantages);
    in.reward_weights = torch::full({n}, 1.0 / static_cast<double>(n));
    in.teacher = batch.teacher().Flatten().Select(positions);
    in.distill_weights = in.reward_weights;
    in.chunk_positions = 4;
    in.combine = combine;
    in.combine_reward = 1.0;
    in.combine_distill = 0.5;
    const FusedHeadOutputs out = ComputeFusedHead(in);
    for (const torch::Tensor* value :
         {&out.token_logprobs, &out.reward, &out.distill, &out.entropy, &out.logit_kernel}) {
      EXPECT_FALSE(value->requires_grad()) << (combine ? "combined" : "apart");
    }
    EXPECT_EQ(out.reward_loss.requires_grad(), !combine);
    EXPECT_EQ(out.distill_loss.requires_grad(), !combine);
    EXPECT_EQ(out.combined_loss.defined(), combine);
    if (combine) EXPECT_TRUE(out.combined_loss.requires_grad());
  }
}

TEST(FusedHead, UnderBf16AutocastTheStepEqualsTheRecomputingHeads) {
  for (Setting s : {Setting{"reverse_kl"}, Setting{"hidden", "hidden"},
                    Setting{"topk_tail", "topk", DistillLoss::kTopkTailReverseKl}}) {
    s.precision = Precision::kBFloat16;
    s.mask = true;
    const TrainBatch batch = BatchOf(s.rows, 19);
    const Outcome fused = Step(s, batch, true), recomputed = Step(s, batch, false);
    // Both run their products in bfloat16; the fused forward forms the
    // gradients from the forward's logits, the other from recomputed ones
    // (the same bf16 GEMM): they agree to float32 summation order.
    ExpectNear(fused.report.stats.reward_grad_norm, recomputed.report.stats.reward_grad_norm, 1e-3,
               s.name + " bf16 ‖∇L_R‖");
    ExpectNear(fused.report.stats.distill_grad_norm, recomputed.report.stats.distill_grad_norm,
               1e-3, s.name + " bf16 ‖∇L_D‖");
    EXPECT_EQ(fused.report.masked_positions, recomputed.report.masked_positions) << s.name;
  }
}

}  // namespace
}  // namespace kappa::learner
