#include "teacher_server/scorer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/transformer.h"

namespace kappa::teacher {
namespace {

model::ModelConfig SmallConfig() {
  model::ModelConfig config;
  config.vocab_size = 21;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.max_position_embeddings = 32;
  return config;
}

class ScorerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(7);
    model_ = model::Decoder(SmallConfig());
    model_->eval();
    // Lengths differ so the batch is padded: totals 5, 9 and 3 tokens.
    sequences_ = {
        {{1, 5, 6}, {7, 2}},
        {{1, 8}, {9, 10, 11, 12, 13, 14, 2}},
        {{1}, {20, 3}},
    };
  }

  // The reference: each sequence alone, unpadded, through the model's own
  // forward; rows at positions len(prompt)-1 .. len(prompt)-2+T.
  torch::Tensor Reference(const TokenSequence& s) {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> ids = s.prompt_tokens;
    ids.insert(ids.end(), s.response_tokens.begin(), s.response_tokens.end());
    torch::Tensor logits = model_->forward(torch::tensor(ids, torch::kLong).unsqueeze(0))[0];
    const int64_t p = static_cast<int64_t>(s.prompt_tokens.size());
    const int64_t t = static_cast<int64_t>(s.response_tokens.size());
    return torch::log_softmax(logits.slice(0, p - 1, p - 1 + t).to(torch::kFloat32), -1);
  }

  std::vector<const TokenSequence*> Pointers() {
    std::vector<const TokenSequence*> out;
    for (const auto& s : sequences_) out.push_back(&s);
    return out;
  }

  model::Decoder model_{nullptr};
  std::vector<TokenSequence> sequences_;
};

TEST_F(ScorerTest, FullMatchesUnpaddedForwardPerSequence) {
  std::vector<ScoredTensors> scored = ScoreSequences(model_, Pointers(), ScoreForm::kFull);
  ASSERT_EQ(scored.size(), sequences_.size());
  for (size_t i = 0; i < sequences_.size(); ++i) {
    const torch::Tensor& got = scored[i].logprobs;
    const int64_t t = static_cast<int64_t>(sequences_[i].response_tokens.size());
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{t, 21})) << "sequence " << i;
    EXPECT_EQ(got.scalar_type(), torch::kFloat32);
    EXPECT_FALSE(scored[i].topk_ids.defined());
    const torch::Tensor want = Reference(sequences_[i]);
    EXPECT_TRUE(torch::allclose(got, want, /*rtol=*/0, /*atol=*/1e-5))
        << "sequence " << i << " max diff " << (got - want).abs().max().item<float>();
    // Proper distributions.
    EXPECT_TRUE(torch::allclose(got.exp().sum(-1), torch::ones({t}), 0, 1e-5));
  }
}

TEST_F(ScorerTest, ResultDoesNotDependOnBatchCompanions) {
  // Scoring a sequence alone or next to longer ones gives the same rows,
  // i.e. padding never leaks into real positions.
  std::vector<const TokenSequence*> alone = {&sequences_[2]};
  const torch::Tensor solo = ResponseLogProbs(model_, alone)[0];
  const torch::Tensor batched = ResponseLogProbs(model_, Pointers())[2];
  EXPECT_TRUE(torch::allclose(solo, batched, 0, 1e-5));
}

TEST_F(ScorerTest, TopKAndSampledAgreeWithFull) {
  const std::vector<ScoredTensors> full = ScoreSequences(model_, Pointers(), ScoreForm::kFull);
  const std::vector<ScoredTensors> topk = ScoreSequences(model_, Pointers(), ScoreForm::kTopK, 4);
  const std::vector<ScoredTensors> sampled =
      ScoreSequences(model_, Pointers(), ScoreForm::kSampled);
  for (size_t i = 0; i < sequences_.size(); ++i) {
    const TokenSequence& s = sequences_[i];
    const int64_t t = static_cast<int64_t>(s.response_tokens.size());
    const torch::Tensor& f = full[i].logprobs;

    ASSERT_EQ(topk[i].logprobs.sizes(), (std::vector<int64_t>{t, 4}));
    ASSERT_EQ(topk[i].topk_ids.sizes(), (std::vector<int64_t>{t, 4}));
    EXPECT_EQ(topk[i].topk_ids.scalar_type(), torch::kInt32);
    auto ids = topk[i].topk_ids.accessor<int32_t, 2>();
    auto vals = topk[i].logprobs.accessor<float, 2>();
    auto fa = f.accessor<float, 2>();
    for (int64_t row = 0; row < t; ++row) {
      const float row_max = f[row].max().item<float>();
      EXPECT_FLOAT_EQ(vals[row][0], row_max);
      for (int64_t j = 0; j < 4; ++j) {
        EXPECT_FLOAT_EQ(vals[row][j], fa[row][ids[row][j]]);
        if (j > 0) {
          EXPECT_GE(vals[row][j - 1], vals[row][j]);
        }
      }
      // The tail: the mass of the row outside the 4 ids, summed over them.
      double outside = 0;
      for (int64_t v = 0; v < f.size(1); ++v) {
        bool in_top = false;
        for (int64_t j = 0; j < 4; ++j) in_top = in_top || ids[row][j] == v;
        if (!in_top) outside += std::exp(static_cast<double>(fa[row][v]));
      }
      EXPECT_NEAR(topk[i].tail_logmass[row].item<float>(), std::log(outside), 1e-5);
      // Nothing outside the top 4 beats the 4th value.
      const float fourth = vals[row][3];
      int64_t above = 0;
      for (int64_t v = 0; v < 21; ++v) above += fa[row][v] > fourth ? 1 : 0;
      EXPECT_LE(above, 3);
    }

    ASSERT_EQ(sampled[i].logprobs.sizes(), (std::vector<int64_t>{t}));
    for (int64_t row = 0; row < t; ++row) {
      EXPECT_FLOAT_EQ(sampled[i].logprobs[row].item<float>(),
                      fa[row][s.response_tokens[row]]);
    }
  }
}

TEST(ScorerVocabLimit, PaddedRowsGetNoMassWhateverTheirLogits) {
  // 40 embedding rows, a 32-id tokenizer: the distributions are over the 32
  // ids, equal to log_softmax of the first 32 logits, and do not move when
  // the padded rows' logits are made arbitrary (here: huge).
  constexpr int64_t kRows = 40, kIds = 32;
  model::ModelConfig config = SmallConfig();
  config.vocab_size = kRows;
  torch::manual_seed(9);
  model::Decoder model(config);
  model->eval();
  const std::vector<TokenSequence> sequences = {{{1, 5, 6}, {7, 31, 2}}, {{1, 30}, {9, 10}}};
  const std::vector<const TokenSequence*> batch = {&sequences[0], &sequences[1]};
  const std::vector<torch::Tensor> before = ResponseLogProbs(model, batch, kIds);
  {
    torch::NoGradGuard no_grad;
    model->lm_head()->weight.narrow(0, kIds, kRows - kIds).normal_(0.0, 50.0);
  }
  const std::vector<torch::Tensor> after = ResponseLogProbs(model, batch, kIds);
  const std::vector<ScoredTensors> topk =
      ScoreSequences(model, batch, ScoreForm::kTopK, kIds, kIds);
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t t = static_cast<int64_t>(sequences[i].response_tokens.size());
    ASSERT_EQ(after[i].sizes(), (std::vector<int64_t>{t, kIds}));
    EXPECT_TRUE(torch::allclose(after[i].exp().sum(-1), torch::ones({t}), 0, 1e-5));
    EXPECT_TRUE(torch::allclose(before[i], after[i], 0, 1e-6)) << "sequence " << i;
    // The unpadded computation on the first 32 rows of a plain forward.
    torch::NoGradGuard no_grad;
    std::vector<int64_t> ids = sequences[i].prompt_tokens;
    ids.insert(ids.end(), sequences[i].response_tokens.begin(), sequences[i].response_tokens.end());
    const int64_t p = static_cast<int64_t>(sequences[i].prompt_tokens.size());
    const torch::Tensor logits = model->forward(torch::tensor(ids).unsqueeze(0))[0];
    const torch::Tensor want =
        torch::log_softmax(logits.slice(0, p - 1, p - 1 + t).narrow(-1, 0, kIds), -1);
    EXPECT_TRUE(torch::allclose(after[i], want, 0, 1e-5));
    // Every id of the full top-k lies below the limit.
    EXPECT_LT(topk[i].topk_ids.max().item<int32_t>(), kIds);
  }
  // Without the limit the padded rows, now huge, take nearly all the mass.
  const torch::Tensor unlimited = ResponseLogProbs(model, batch)[0];
  EXPECT_LT(unlimited.narrow(-1, 0, kIds).exp().sum(-1).max().item<float>(), 0.5f);
  EXPECT_THROW(ResponseLogProbs(model, batch, kRows + 1), std::invalid_argument);
}

TEST_F(ScorerTest, RejectsBadInputWithExceptions) {
  TokenSequence empty_response{{1, 2}, {}};
  std::vector<const TokenSequence*> batch = {&empty_response};
  EXPECT_THROW(ResponseLogProbs(model_, batch), std::invalid_argument);

  TokenSequence bad_id{{1, 2}, {21}};
  batch = {&bad_id};
  EXPECT_THROW(ResponseLogProbs(model_, batch), std::invalid_argument);

  TokenSequence too_long{std::vector<int64_t>(30, 1), std::vector<int64_t>(5, 3)};
  batch = {&too_long};
  EXPECT_THROW(ResponseLogProbs(model_, batch), std::invalid_argument);

  const torch::Tensor lp = ResponseLogProbs(model_, {&sequences_[0]})[0];
  // k = V: every id in the set, an empty tail.
  const ScoredTensors all =
      SelectForm(lp, sequences_[0].response_tokens, ScoreForm::kTopK, lp.size(1));
  EXPECT_TRUE((all.tail_logmass == -std::numeric_limits<float>::infinity()).all().item<bool>());
  EXPECT_THROW(SelectForm(lp, sequences_[0].response_tokens, ScoreForm::kTopK, 0),
               std::invalid_argument);
  EXPECT_THROW(SelectForm(lp, sequences_[0].response_tokens, ScoreForm::kTopK, 22),
               std::invalid_argument);
  EXPECT_TRUE(ResponseLogProbs(model_, {}).empty());
}

// The tail over more rows than one block of TailLogMass: each row's mass
// outside its ids, against a float64 sum over those ids.
TEST(ScorerTail, TailLogMassOfEveryRowAcrossBlocks) {
  torch::manual_seed(3);
  const int64_t rows = 70, vocab = 50, k = 5;
  const torch::Tensor logprobs = torch::log_softmax(3 * torch::randn({rows, vocab}), -1);
  const torch::Tensor ids = std::get<1>(logprobs.topk(k, -1));
  const torch::Tensor tail = TailLogMass(logprobs, ids.to(torch::kInt32));
  ASSERT_EQ(tail.sizes(), (std::vector<int64_t>{rows}));
  const torch::Tensor inside = torch::zeros({rows, vocab}, torch::kBool).scatter_(1, ids, true);
  const torch::Tensor want =
      logprobs.to(torch::kFloat64).exp().masked_fill(inside, 0.0).sum(1).log();
  EXPECT_LT((tail.to(torch::kFloat64) - want).abs().max().item<double>(), 1e-5);
}

// What the service checks before it sends a sequence's rows: the first row
// holding a NaN or an infinity is named, in every form's shape.
TEST(ScorerFinite, CheckFiniteLogProbsNamesTheFirstBadRow) {
  const torch::Tensor full = torch::log_softmax(torch::randn({4, 6}), -1);
  EXPECT_TRUE(CheckFiniteLogProbs(full, "sequences[0].logprobs").ok());
  torch::Tensor bad = full.clone();
  bad[2][5] = std::numeric_limits<float>::infinity();
  bad[3][0] = std::nanf("");
  const absl::Status status = CheckFiniteLogProbs(bad, "sequences[3].logprobs");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find(
                "sequences[3].logprobs: non-finite log-prob inf at response position 2"),
            std::string::npos)
      << status;
  torch::Tensor sampled = full.select(1, 0).clone();  // [T]
  sampled[1] = -std::numeric_limits<float>::infinity();
  EXPECT_NE(CheckFiniteLogProbs(sampled, "s")
                .message()
                .find("s: non-finite log-prob -inf at response position 1"),
            std::string::npos);
}

}  // namespace
}  // namespace kappa::teacher
