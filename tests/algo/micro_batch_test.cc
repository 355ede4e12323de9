// Gradient accumulation: micro-batches bucketed by length give the update,
// κ, losses and K_DR statistics of the whole batch in one forward, for every
// gate, aggregation and balancing mode that changes what is averaged.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "learner/algo/hybrid_step.h"
#include "learner/algo/train_batch.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

using testing::Grads;
using testing::RandomGroups;
using testing::TinyModel;

TrainBatch RstgBatch() {
  std::vector<ScoredGroup> groups = RandomGroups(3, 4, true, 17);
  for (ScoredSample& s : groups[1].samples) s.reward = 0;  // negative zero-variance
  groups[1].teacher_demonstrations = {{5, 6, 2}, {7, 2}};
  return BuildTrainBatch(groups, true, 0);
}

TEST(SplitMicroBatches, BucketsRowsByLengthAndCutsEachToItsLongest) {
  const TrainBatch batch = RstgBatch();
  const std::vector<MicroBatch> micro = SplitMicroBatches(batch, 5);
  ASSERT_EQ(micro.size(), 3u);
  const torch::Tensor lengths = batch.attention_mask.sum(1);
  std::vector<int64_t> seen;
  int64_t previous_longest = batch.input_tokens.size(1);
  for (const MicroBatch& part : micro) {
    EXPECT_FALSE(part.whole);
    EXPECT_LE(part.rows.numel(), 5);
    const torch::Tensor own = lengths.index_select(0, part.rows);
    EXPECT_EQ(part.length, own.max().item<int64_t>());
    EXPECT_LE(part.length, previous_longest);  // longest first
    previous_longest = own.min().item<int64_t>();
    EXPECT_EQ(part.batch.input_tokens.size(1), part.length);
    EXPECT_TRUE(part.batch.input_tokens.equal(part.Slice(batch.input_tokens)));
    EXPECT_TRUE(part.batch.teacher_logprobs.equal(part.Slice(batch.teacher_logprobs)));
    // Every response position of the rows is kept.
    EXPECT_EQ(part.batch.response_mask.sum().item<float>(),
              batch.response_mask.index_select(0, part.rows).sum().item<float>());
    for (int64_t i = 0; i < part.rows.numel(); ++i) seen.push_back(part.rows[i].item<int64_t>());
  }
  std::sort(seen.begin(), seen.end());
  ASSERT_EQ(seen.size(), 12u);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i);
  // The SFT rows travel with the first micro-batch only.
  EXPECT_EQ(micro[0].batch.num_demonstrations, 2);
  EXPECT_FALSE(micro[1].batch.sft_input_tokens.defined());
  // Scatter puts a part back where Slice took it from.
  torch::Tensor rebuilt = torch::zeros_like(batch.response_mask);
  for (const MicroBatch& part : micro) part.Scatter(part.Slice(batch.response_mask), rebuilt);
  EXPECT_TRUE(rebuilt.equal(batch.response_mask));
  // No split asked, or too few rows: the batch itself.
  EXPECT_TRUE(SplitMicroBatches(batch, 0).front().whole);
  EXPECT_TRUE(SplitMicroBatches(batch, 12).front().whole);
}

struct Case {
  const char* name;
  DistillGate gate;
  int64_t kappa_every;
  Aggregation aggregation;
  bool mask;
  bool project;
};

class MicroBatchStep : public ::testing::TestWithParam<Case> {};

TEST_P(MicroBatchStep, MatchesTheWholeBatchStep) {
  const Case& c = GetParam();
  const TrainBatch batch = RstgBatch();
  HybridStepReport reports[2];
  std::vector<torch::Tensor> grads[2];
  for (int i = 0; i < 2; ++i) {
    model::Decoder model = TinyModel(6);
    HybridStepConfig config;
    config.gate = c.gate;
    config.sft_weight = 0.1;
    config.loss.lambda = 0.7;
    config.loss.aggregation = c.aggregation;
    config.monitor.kappa_every = c.kappa_every;
    config.balance.mask = c.mask;
    config.balance.project = c.project;
    config.micro_batch_sequences = i == 0 ? 0 : 5;
    // No clipping, so .grad after the step is exactly the combined gradient.
    auto optimizer = std::make_unique<PolicyOptimizer>(model, 1e-6, 0.0, 0.0);
    HybridStep step(model, std::move(optimizer), config);
    reports[i] = step.Run(batch);
    grads[i] = Grads(model);
  }
  const HybridStepReport& whole = reports[0];
  const HybridStepReport& split = reports[1];
  for (size_t k = 0; k < grads[0].size(); ++k) {
    // Float sums in another order: tolerance relative to the largest entry.
    const double scale = grads[0][k].abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(grads[1][k], grads[0][k], 1e-4, 1e-5 * scale))
        << "parameter " << k << ": max difference "
        << (grads[1][k] - grads[0][k]).abs().max().item<float>() << " of "
        << grads[0][k].abs().max().item<float>();
  }
  EXPECT_NEAR(split.stats.reward_loss, whole.stats.reward_loss, 1e-5);
  EXPECT_NEAR(split.stats.distill_loss, whole.stats.distill_loss, 1e-5);
  EXPECT_NEAR(split.stats.sft_loss, whole.stats.sft_loss, 1e-5);
  EXPECT_NEAR(split.stats.grad_norm, whole.stats.grad_norm, 1e-4 * whole.stats.grad_norm);
  EXPECT_EQ(split.stats.measured, whole.stats.measured);
  if (whole.stats.kappa()) {
    ASSERT_TRUE(split.stats.kappa().has_value());
    EXPECT_NEAR(*split.stats.kappa(), *whole.stats.kappa(), 1e-4 * *whole.stats.kappa());
    EXPECT_NEAR(split.stats.grad_cosine, whole.stats.grad_cosine, 1e-4);
  }
  EXPECT_NEAR(split.entropy, whole.entropy, 1e-5);
  EXPECT_NEAR(split.approx_kl, whole.approx_kl, 1e-6);
  EXPECT_EQ(split.distill_positions, whole.distill_positions);
  EXPECT_EQ(split.gated_groups, whole.gated_groups);
  EXPECT_EQ(split.masked_positions, whole.masked_positions);
  EXPECT_EQ(split.demonstrations, whole.demonstrations);
  ASSERT_EQ(split.kdr.has_value(), whole.kdr.has_value());
  if (whole.kdr) {
    ASSERT_EQ(split.kdr_values.size(), whole.kdr_values.size());
    for (size_t k = 0; k < whole.kdr_values.size(); ++k) {
      EXPECT_NEAR(split.kdr_values[k], whole.kdr_values[k], 1e-4 * std::abs(whole.kdr_values[k]) + 1e-7);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, MicroBatchStep,
    ::testing::Values(
        Case{"all_kappa", DistillGate::kAll, 1, Aggregation::kTokenMean, false, false},
        Case{"all_plain", DistillGate::kAll, 0, Aggregation::kTokenMean, false, false},
        Case{"rstg_kappa", DistillGate::kRstg, 1, Aggregation::kTokenMean, false, false},
        Case{"rstg_plain", DistillGate::kRstg, 0, Aggregation::kTokenMean, false, false},
        Case{"none", DistillGate::kNone, 1, Aggregation::kTokenMean, false, false},
        Case{"seq_mean", DistillGate::kAll, 1, Aggregation::kSeqMeanTokenMean, false, false},
        Case{"seq_sum_plain", DistillGate::kAll, 0, Aggregation::kSeqMeanTokenSum, false, false},
        Case{"m3_mask", DistillGate::kAll, 1, Aggregation::kTokenMean, true, false},
        Case{"m3_project", DistillGate::kAll, 0, Aggregation::kTokenMean, false, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kappa::learner
