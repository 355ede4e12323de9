// The learner's distributions over a vocabulary limit below the embedding
// rows (Qwen-style padding): no mass on the padded rows in any loss term,
// and every term equal to that of the same model without the padded rows.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "learner/algo/hybrid_loss.h"
#include "learner/algo/train_batch.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

constexpr int64_t kRows = 40, kIds = 32;

model::ModelConfig Config(int64_t vocab_size) {
  model::ModelConfig c = testing::TinyConfig();
  c.vocab_size = vocab_size;
  return c;
}

// `padded` with its embedding and output rows cut to the first kIds.
model::Decoder Unpadded(model::Decoder& padded) {
  model::Decoder out(Config(kIds));
  torch::NoGradGuard no_grad;
  auto source = padded->named_parameters();
  for (auto& p : out->named_parameters()) {
    const torch::Tensor& from = source[p.key()];
    p.value().copy_(from.size(0) == kRows ? from.narrow(0, 0, kIds) : from);
  }
  return out;
}

// Two groups of two, ids below kIds, full teacher rows over the kIds ids.
std::vector<ScoredGroup> Groups() {
  torch::manual_seed(21);
  std::vector<ScoredGroup> groups(2);
  for (int64_t g = 0; g < 2; ++g) {
    groups[g].prompt_tokens = {1, 3 + g, 30};
    for (int64_t i = 0; i < 2; ++i) {
      ScoredSample s;
      const int64_t len = 3 + i;
      for (int64_t k = 0; k < len; ++k) s.response_tokens.push_back((7 * g + 5 * i + 9 * k) % kIds);
      s.behavior_logprobs.assign(len, -2.0f - 0.2f * static_cast<float>(i));
      s.reward = static_cast<float>((g + i) % 2);
      s.teacher_logprobs = torch::log_softmax(2 * torch::randn({len, kIds}), -1);
      groups[g].samples.push_back(std::move(s));
    }
  }
  return groups;
}

TEST(VocabLimit, LossTermsPutNoMassOnPaddedRowsAndEqualTheUnpaddedModel) {
  torch::manual_seed(5);
  model::Decoder padded(Config(kRows));
  {
    // Arbitrary, large logits on the padded rows: they must change nothing.
    torch::NoGradGuard no_grad;
    padded->lm_head()->weight.narrow(0, kIds, kRows - kIds).normal_(0.0, 30.0);
  }
  model::Decoder unpadded = Unpadded(padded);
  const TrainBatch full_rows = BuildTrainBatch(Groups(), true, 0);
  // The top-k losses read compact rows: each full row's top 5.
  std::vector<ScoredGroup> topk_groups = Groups();
  for (ScoredGroup& group : topk_groups) {
    for (ScoredSample& s : group.samples) {
      auto [values, ids] = s.teacher_logprobs.topk(5, -1);
      s.teacher_logprobs = values.contiguous();
      s.teacher_topk_ids = ids.contiguous();
    }
  }
  const TrainBatch topk_rows = BuildTrainBatch(topk_groups, true, 0);
  for (DistillLoss loss :
       {DistillLoss::kReverseKl, DistillLoss::kForwardKl, DistillLoss::kTopkReverseKl,
        DistillLoss::kTopkTailReverseKl, DistillLoss::kSampledReverseKl}) {
    for (const int64_t chunk : {int64_t{0}, int64_t{4}}) {
      const TrainBatch& batch = IsTopkLoss(loss) ? topk_rows : full_rows;
      LossConfig config;
      config.distill = loss;
      config.temperature = 0.8;
      config.vocab_chunk_positions = chunk;
      config.vocab_limit = kIds;
      const TokenTerms limited = ComputeTokenTerms(padded, batch, config);
      config.vocab_limit = 0;
      config.vocab_chunk_positions = 0;
      const TokenTerms reference = ComputeTokenTerms(unpadded, batch, config);
      const std::string what =
          std::to_string(static_cast<int>(loss)) + " chunk " + std::to_string(chunk);
      // The chunked head computes response positions only.
      const torch::Tensor at = batch.response_mask > 0;
      const auto close = [&](const torch::Tensor& a, const torch::Tensor& b) {
        return torch::allclose(a.detach().masked_select(at), b.detach().masked_select(at), 1e-4,
                               1e-5);
      };
      if (chunk == 0) {
        ASSERT_EQ(limited.logprobs.size(-1), kIds);
        EXPECT_TRUE(torch::allclose(limited.logprobs.exp().sum(-1),
                                    torch::ones_like(batch.response_mask), 0, 1e-5));
        EXPECT_TRUE(torch::allclose(limited.logprobs, reference.logprobs, 1e-4, 1e-5)) << what;
      } else {
        EXPECT_EQ(limited.output_weight.size(0), kIds) << what;
      }
      EXPECT_TRUE(close(limited.token_logprobs, reference.token_logprobs)) << what;
      EXPECT_TRUE(close(limited.reward, reference.reward)) << what;
      EXPECT_TRUE(close(limited.distill, reference.distill)) << what;
      EXPECT_TRUE(close(limited.entropy, reference.entropy)) << what;
      // And the padded rows take no gradient.
      padded->zero_grad();
      const LossTerms terms = AggregateTerms(limited, batch, LossConfig{});
      (terms.reward_loss + terms.distill_loss).backward();
      EXPECT_EQ(
          padded->lm_head()->weight.grad().narrow(0, kIds, kRows - kIds).abs().max().item<float>(),
          0.0f)
          << what;
    }
  }
  // Without the limit the teacher rows (32 wide) no longer fit the logits.
  EXPECT_THROW(ComputeTokenTerms(padded, full_rows, LossConfig{}), std::invalid_argument);
  LossConfig too_wide;
  too_wide.vocab_limit = kRows + 1;
  EXPECT_THROW(ComputeTokenTerms(padded, full_rows, too_wide), std::invalid_argument);
  too_wide.vocab_chunk_positions = 4;
  EXPECT_THROW(ComputeTokenTerms(padded, full_rows, too_wide), std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner
