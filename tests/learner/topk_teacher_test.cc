// topk_reverse_kl end to end on the TOPK wire form: the teacher's top-k ids
// and log-probs, decoded by the group decoder (densified with kTopkFill),
// give the same loss, logit gradient, RSTG selection and learner step as the
// full teacher rows they were cut from, and stay finite everywhere.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <memory>
#include <vector>

#include "kappa/v1/teacher.pb.h"
#include "learner/algo/distill_gate.h"
#include "learner/algo/hybrid_step.h"
#include "learner/algo/logit_gradients.h"
#include "learner/algo/logprob_losses.h"
#include "learner/group_decoder.h"
#include "services/torch_tensor_codec.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

constexpr int64_t kK = 4;
constexpr int64_t kVocab = 16;  // testing::TinyConfig()
constexpr int64_t kGroupSize = 4;

// `groups` as a worker sends them under SCORE_FORM_TOPK: each full teacher
// row cut to its top-k ids and log-probs.
kappa::v1::ScoredGroup ToTopkWire(const ScoredGroup& group) {
  kappa::v1::ScoredGroup wire;
  for (int64_t token : group.prompt_tokens) wire.add_prompt_tokens(static_cast<int32_t>(token));
  wire.set_policy_version(group.policy_version);
  for (const ScoredSample& sample : group.samples) {
    kappa::v1::ScoredSample* out = wire.add_samples();
    for (int64_t token : sample.response_tokens) {
      out->add_response_tokens(static_cast<int32_t>(token));
    }
    services::EncodeTensor(torch::tensor(sample.behavior_logprobs),
                           out->mutable_behavior_logprobs());
    out->set_reward(sample.reward);
    auto [values, ids] = sample.teacher_logprobs.topk(kK, -1);
    services::EncodeTensor(values, out->mutable_teacher_logprobs());
    services::EncodeTensor(ids.to(torch::kInt32), out->mutable_teacher_topk_ids());
  }
  return wire;
}

GroupExpectations TopkExpectations() {
  GroupExpectations expect;
  expect.group_size = kGroupSize;
  expect.vocab_size = kVocab;
  expect.max_new_tokens = 8;
  expect.teacher_form = kappa::v1::SCORE_FORM_TOPK;
  expect.teacher_top_k = kK;
  return expect;
}

struct TopkFixture : ::testing::Test {
  void SetUp() override {
    full_groups = testing::RandomGroups(3, kGroupSize, /*with_teacher=*/true, 23);
    // One negative zero-variance group, so RSTG gates something.
    for (ScoredSample& sample : full_groups[1].samples) sample.reward = 0.0f;
    for (const ScoredGroup& group : full_groups) {
      absl::StatusOr<ScoredGroup> decoded = DecodeScoredGroup(ToTopkWire(group),
                                                              TopkExpectations());
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      topk_groups.push_back(*std::move(decoded));
    }
    full = BuildTrainBatch(full_groups, true, 0);
    topk = BuildTrainBatch(topk_groups, true, 0);
  }

  std::vector<ScoredGroup> full_groups, topk_groups;
  TrainBatch full, topk;
};

TEST_F(TopkFixture, DensifiedRowsAreFiniteAndKeepTheTopk) {
  ASSERT_EQ(topk.teacher_logprobs.sizes(), full.teacher_logprobs.sizes());
  EXPECT_TRUE(torch::isfinite(topk.teacher_logprobs).all().item<bool>());
  const torch::Tensor mask = full.response_mask.to(torch::kBool);
  const torch::Tensor full_ids = TopkIndices(full.teacher_logprobs, kK).index({mask});
  const torch::Tensor topk_ids = TopkIndices(topk.teacher_logprobs, kK).index({mask});
  EXPECT_TRUE(torch::equal(std::get<0>(full_ids.sort(-1)), std::get<0>(topk_ids.sort(-1))));
  // The row's max (RSTG max_prob) is the teacher's top-1.
  EXPECT_TRUE(torch::equal(full.teacher_logprobs.amax(-1).index({mask}),
                           topk.teacher_logprobs.amax(-1).index({mask})));
}

TEST_F(TopkFixture, LossAndLogitGradientEqualTheFullRowsRestrictedToTheTopk) {
  torch::manual_seed(5);
  const torch::Tensor student =
      torch::log_softmax(3 * torch::randn(full.teacher_logprobs.sizes()), -1);
  const torch::Tensor mask = full.response_mask.to(torch::kBool);
  const torch::Tensor loss_full = TopkReverseKlFromLogProbs(student, full.teacher_logprobs, kK);
  const torch::Tensor loss_topk = TopkReverseKlFromLogProbs(student, topk.teacher_logprobs, kK);
  EXPECT_TRUE(torch::isfinite(loss_topk).all().item<bool>());
  EXPECT_TRUE(torch::allclose(loss_full.index({mask}), loss_topk.index({mask}), 1e-6, 1e-6));

  const torch::Tensor grad_full = DistillLogitGradient(
      student, full.teacher_logprobs, full.target_tokens, DistillLoss::kTopkReverseKl, kK, 1.0);
  const torch::Tensor grad_topk = DistillLogitGradient(
      student, topk.teacher_logprobs, topk.target_tokens, DistillLoss::kTopkReverseKl, kK, 1.0);
  EXPECT_TRUE(torch::isfinite(grad_topk).all().item<bool>());
  EXPECT_TRUE(torch::allclose(grad_full.index({mask}), grad_topk.index({mask}), 1e-6, 1e-6));
}

TEST_F(TopkFixture, RstgMaxProbSelectsAndWeighsTheSame) {
  torch::manual_seed(6);
  const torch::Tensor entropy = torch::rand(full.response_mask.sizes());
  RstgConfig config;
  config.confidence = RstgConfig::Confidence::kMaxProb;
  const DistillSelection a = RstgSelect(full.rewards, full.response_mask, full.teacher_logprobs,
                                        full.target_tokens, entropy, entropy, config);
  const DistillSelection b = RstgSelect(topk.rewards, topk.response_mask, topk.teacher_logprobs,
                                        topk.target_tokens, entropy, entropy, config);
  EXPECT_EQ(a.gated_groups, 1);
  EXPECT_GT(b.selected_positions, 0);
  EXPECT_TRUE(torch::equal(a.selected, b.selected));
  EXPECT_TRUE(torch::isfinite(b.weights).all().item<bool>());
  EXPECT_TRUE(torch::allclose(a.weights, b.weights, 1e-6, 1e-7));
}

TEST_F(TopkFixture, OneLearnerStepEqualsTheStepOnFullRows) {
  for (const DistillGate gate : {DistillGate::kAll, DistillGate::kRstg}) {
    HybridStepConfig config;
    config.loss.distill = DistillLoss::kTopkReverseKl;
    config.loss.distill_topk = kK;
    config.loss.lambda = 0.5;
    config.gate = gate;
    config.rstg.confidence = RstgConfig::Confidence::kMaxProb;
    config.monitor.kdr_every = 1;  // the K_DR closed form reads the teacher rows too
    std::vector<model::Decoder> models;
    std::vector<HybridStepReport> reports;
    for (const TrainBatch* batch : {&full, &topk}) {
      model::Decoder model = testing::TinyModel(11);
      auto optimizer =
          std::make_unique<PolicyOptimizer>(model, 1e-3, 0.0, /*max_grad_norm=*/0.0);
      HybridStep step(model, std::move(optimizer), config);
      reports.push_back(step.Run(*batch));
      models.push_back(model);
    }
    const char* name = DistillGateName(gate);
    EXPECT_GT(reports[0].stats.distill_loss, 0.0) << name;
    EXPECT_NEAR(reports[0].stats.distill_loss, reports[1].stats.distill_loss, 1e-6) << name;
    EXPECT_NEAR(reports[0].stats.reward_loss, reports[1].stats.reward_loss, 1e-6) << name;
    EXPECT_NEAR(reports[0].stats.grad_norm, reports[1].stats.grad_norm,
                1e-5 * reports[0].stats.grad_norm)
        << name;
    EXPECT_EQ(reports[0].distill_positions, reports[1].distill_positions) << name;
    ASSERT_TRUE(reports[1].kdr.has_value()) << name;
    ASSERT_EQ(reports[0].kdr_values.size(), reports[1].kdr_values.size()) << name;
    for (size_t i = 0; i < reports[0].kdr_values.size(); ++i) {
      ASSERT_TRUE(std::isfinite(reports[1].kdr_values[i])) << name << " " << i;
      EXPECT_NEAR(reports[0].kdr_values[i], reports[1].kdr_values[i],
                  1e-5 * (1.0 + std::abs(reports[0].kdr_values[i])))
          << name << " " << i;
    }
    const auto a = models[0]->parameters();
    const auto b = models[1]->parameters();
    for (size_t p = 0; p < a.size(); ++p) {
      EXPECT_TRUE(torch::allclose(a[p], b[p], 1e-5, 1e-6)) << name << " parameter " << p;
    }
  }
}

TEST_F(TopkFixture, MinusInfinityWouldNotReachTheLoss) {
  // Why the fill is finite: the trainer's batch refuses non-finite teacher
  // rows, so -inf outside the top-k would fail every step.
  std::vector<ScoredGroup> groups = topk_groups;
  torch::Tensor& row = groups[0].samples[0].teacher_logprobs;
  row = row.masked_fill(row == kTopkFill, -std::numeric_limits<float>::infinity());
  EXPECT_THROW(BuildTrainBatch(groups, true, 0), std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner
