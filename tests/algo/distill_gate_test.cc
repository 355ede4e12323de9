// RSTG selection on constructed batches.
#include "learner/algo/distill_gate.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace kappa::learner {
namespace {

// 3 groups of G = 2 → 6 rows, 4 positions each; responses at positions 1..3
// (row 5 only at 1..2).
struct RstgFixture : ::testing::Test {
  torch::Tensor rewards = torch::tensor({{0.f, 0.f}, {1.f, 0.f}, {0.f, 0.f}});
  torch::Tensor mask = torch::tensor({{0.f, 1.f, 1.f, 1.f},
                                      {0.f, 1.f, 1.f, 1.f},
                                      {0.f, 1.f, 1.f, 1.f},
                                      {0.f, 1.f, 1.f, 1.f},
                                      {0.f, 1.f, 1.f, 1.f},
                                      {0.f, 1.f, 1.f, 0.f}});
  // Distinct entropies; the highest ones sit in the non-gated group 1.
  torch::Tensor entropy = torch::tensor({{9.f, 0.1f, 0.7f, 0.3f},
                                         {9.f, 0.2f, 0.9f, 0.4f},
                                         {9.f, 5.0f, 5.1f, 5.2f},
                                         {9.f, 5.3f, 5.4f, 5.5f},
                                         {9.f, 0.6f, 0.5f, 0.8f},
                                         {9.f, 0.05f, 1.0f, 9.0f}});
  torch::Tensor divergence = torch::zeros({6, 4});
  torch::Tensor targets = torch::zeros({6, 4}, torch::kInt64);
  torch::Tensor teacher;  // [6, 4, 3]

  void SetUp() override {
    // Row r's teacher puts max probability 0.1·(r+1)... as log-probs of a
    // 3-token distribution [m, (1-m)/2, (1-m)/2] with m = 0.4 + 0.1 r.
    std::vector<torch::Tensor> rows;
    for (int r = 0; r < 6; ++r) {
      const double m = 0.4 + 0.1 * r;
      rows.push_back(torch::log(torch::tensor({m, (1 - m) / 2, (1 - m) / 2}, torch::kFloat32))
                         .expand({4, 3}));
    }
    teacher = torch::stack(rows);
  }
};

TEST_F(RstgFixture, GatesNegativeZeroVarianceGroupsAndTopEntropyTokens) {
  RstgConfig config;
  config.token_frac = 0.5;
  const DistillSelection s =
      RstgSelect(rewards, mask, {teacher, {}}, targets, entropy, divergence, config);
  EXPECT_EQ(s.gated_groups, 2);
  // Gated rows 0, 1, 4, 5 have 3+3+3+2 = 11 response positions; ceil(5.5) = 6
  // kept by entropy: 1.0 (5,2), 0.9 (1,2), 0.8 (4,3), 0.7 (0,2), 0.6 (4,1), 0.5 (4,2).
  const torch::Tensor want = torch::zeros({6, 4});
  for (auto [b, t] : std::vector<std::pair<int, int>>{{5, 2}, {1, 2}, {4, 3}, {0, 2}, {4, 1}, {4, 2}}) {
    want[b][t] = 1.0;
  }
  EXPECT_TRUE(torch::equal(s.selected, want)) << s.selected;
  EXPECT_EQ(s.selected_positions, 6);
  // Weights: the teacher's confidence mean_t max_v q = 0.4 + 0.1 r on the row.
  for (int b = 0; b < 6; ++b) {
    for (int t = 0; t < 4; ++t) {
      const double w = want[b][t].item<double>() * (0.4 + 0.1 * b);
      EXPECT_NEAR(s.weights[b][t].item<double>(), w, 1e-6) << b << "," << t;
    }
  }
}

TEST_F(RstgFixture, AbsoluteThresholdAndDivergenceScore) {
  RstgConfig config;
  config.token_score = RstgConfig::TokenScore::kDivergence;
  config.threshold = 1.0;
  divergence = entropy.clone();  // same numbers, other score
  const DistillSelection s =
      RstgSelect(rewards, mask, {teacher, {}}, targets, entropy * 0, divergence, config);
  // Gated response positions with score >= 1.0: only (5, 2) (row 5 position 3 is padding).
  EXPECT_EQ(s.selected_positions, 1);
  EXPECT_EQ(s.selected[5][2].item<float>(), 1.0f);
}

TEST_F(RstgFixture, NoGatedGroupSelectsNothingAndTokenProbConfidence) {
  const torch::Tensor mixed = torch::tensor({{1.f, 0.f}, {1.f, 0.f}, {0.f, 1.f}});
  RstgConfig config;
  EXPECT_EQ(RstgSelect(mixed, mask, {teacher, {}}, targets, entropy, divergence, config)
                .selected_positions,
            0);

  config.confidence = RstgConfig::Confidence::kTokenProb;
  config.token_frac = 1.0;
  const DistillSelection s =
      RstgSelect(rewards, mask, {teacher, {}}, targets, entropy, divergence, config);
  EXPECT_EQ(s.selected_positions, 11);
  // Targets are token 0, whose teacher probability is m: exp(mean log m) = m.
  EXPECT_NEAR(s.weights[4][1].item<double>(), 0.8, 1e-6);
  // Sampled-token teacher rows cannot give max_prob confidence.
  config.confidence = RstgConfig::Confidence::kMaxProb;
  EXPECT_THROW(
      RstgSelect(rewards, mask, {teacher.select(2, 0), {}}, targets, entropy, divergence, config),
      std::invalid_argument);
}

// The seed's token gate: high student entropy OR large teacher-student
// divergence. Each score keeps its own top ceil(0.25 · 11) = 3 of the gated
// positions; the selection is exactly their union (one position in both).
TEST_F(RstgFixture, TheUnionSelectorKeepsTheTopOfEitherScoreAndNothingElse) {
  RstgConfig config;
  config.token_score = RstgConfig::TokenScore::kUnion;
  config.token_frac = 0.25;
  // Largest divergences in gated rows: (0,1) 7, (1,2) 6, (5,1) 5; larger ones
  // sit where nothing may be picked: the non-gated rows 2-3, the prompt
  // column 0 and row 5's padding at position 3.
  divergence = torch::zeros({6, 4});
  divergence.index_put_({torch::indexing::Slice(), 0}, 20.0);
  divergence[2][1] = 30.0;
  divergence[3][3] = 30.0;
  divergence[5][3] = 40.0;
  divergence[0][1] = 7.0;
  divergence[1][2] = 6.0;
  divergence[5][1] = 5.0;
  divergence[4][2] = 1.0;
  const DistillSelection s =
      RstgSelect(rewards, mask, {teacher, {}}, targets, entropy, divergence, config);
  // Entropy's top 3 of the gated positions: (5,2) 1.0, (1,2) 0.9, (4,3) 0.8.
  const torch::Tensor want = torch::zeros({6, 4});
  for (auto [b, t] : std::vector<std::pair<int, int>>{{5, 2}, {1, 2}, {4, 3}, {0, 1}, {5, 1}}) {
    want[b][t] = 1.0;
  }
  EXPECT_TRUE(torch::equal(s.selected, want)) << s.selected;
  EXPECT_EQ(s.selected_positions, 5);

  config.threshold = 0.5;  // one score's scale
  EXPECT_THROW(RstgSelect(rewards, mask, {teacher, {}}, targets, entropy, divergence, config),
               std::invalid_argument);
}

TEST(DistillGateParse, Names) {
  EXPECT_EQ(ParseDistillGate("rstg"), DistillGate::kRstg);
  EXPECT_THROW(ParseDistillGate("some"), std::invalid_argument);
  EXPECT_EQ(ParseRstgTokenScore("union"), RstgConfig::TokenScore::kUnion);
  EXPECT_THROW(ParseRstgTokenScore("both"), std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner

namespace kappa::learner {
namespace {

TEST_F(RstgFixture, TopkRowsGiveTheFullRowsMaxProbAndRefuseTokenProb) {
  RstgConfig config;
  config.token_frac = 0.5;
  const auto [values, ids] = teacher.topk(2, -1);
  const TeacherRows topk{values, ids};
  const DistillSelection full =
      RstgSelect(rewards, mask, {teacher, {}}, targets, entropy, divergence, config);
  const DistillSelection compact =
      RstgSelect(rewards, mask, topk, targets, entropy, divergence, config);
  EXPECT_TRUE(torch::allclose(compact.weights, full.weights)) << compact.weights;
  config.confidence = RstgConfig::Confidence::kTokenProb;
  EXPECT_THROW(RstgSelect(rewards, mask, topk, targets, entropy, divergence, config),
               std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner
