#include "learner/algo/sft.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "learner/algo/evaluate.h"
#include "tests/algo/tiny_model.h"

namespace kappa::learner {
namespace {

TEST(SftNllTest, MaskedMeanOfNegativeLogLikelihood) {
  torch::Tensor logits = torch::zeros({1, 3, 4});
  logits[0][1][2] = 100.0;  // position 1 is certain of token 2
  logits[0][2][0] = 100.0;  // position 2 is masked: its wrong guess must not count
  const torch::Tensor targets = torch::tensor({1, 2, 3}, torch::kInt64).reshape({1, 3});
  const torch::Tensor mask = torch::tensor({1.f, 1.f, 0.f}).reshape({1, 3});
  EXPECT_NEAR(SftNll(logits, targets, mask).item<double>(), std::log(4.0) / 2, 1e-5);
  EXPECT_THROW(SftNll(logits, targets, torch::ones({1, 2})), std::invalid_argument);
}

TEST(WarmupCosineLrTest, RampsThenDecays) {
  EXPECT_DOUBLE_EQ(WarmupCosineLr(1.0, 0, 4, 14), 0.25);
  EXPECT_DOUBLE_EQ(WarmupCosineLr(1.0, 3, 4, 14), 1.0);
  EXPECT_DOUBLE_EQ(WarmupCosineLr(1.0, 4, 4, 14), 1.0);
  EXPECT_NEAR(WarmupCosineLr(1.0, 9, 4, 14), 0.5, 1e-12);
  EXPECT_NEAR(WarmupCosineLr(1.0, 14, 4, 14), 0.0, 1e-12);
}

// Prompt [BOS, x] -> answer [f(x), EOS] with f a fixed permutation of 3..12.
int64_t Target(int64_t x) { return 3 + (7 * (x - 3) + 2) % 10; }

TEST(SftTrainTest, LearnsATrivialMappingAndGreedyDecodingGetsItRight) {
  torch::manual_seed(0);
  model::Decoder model(testing::TinyConfig());
  std::vector<SftExample> examples;
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t x = 3; x <= 12; ++x) {
    examples.push_back({{1, x}, {Target(x), 2}});
    prompts.push_back({1, x});
  }
  auto correct = [&](size_t i, const std::vector<int64_t>& response) {
    return response == std::vector<int64_t>{Target(prompts[i][1]), 2};
  };
  const double before = GreedyAccuracy(model, prompts, 3, correct, 4);

  SftOptions options;
  options.steps = 150;
  options.batch_size = 16;
  options.lr = 1e-2;
  options.warmup_steps = 10;
  options.seed = 3;
  double first_loss = -1;
  int64_t calls = 0;
  options.on_step = [&](int64_t step, double loss) {
    if (step == 0) first_loss = loss;
    ++calls;
  };
  const double final_loss = SftTrain(model, examples, options);
  EXPECT_EQ(calls, 150);
  EXPECT_GT(first_loss, 1.5);  // about log(16)/2 + log(16)/2 at the start
  EXPECT_LT(final_loss, 0.05 * first_loss);

  EXPECT_LE(before, 0.3);
  EXPECT_EQ(GreedyAccuracy(model, prompts, 3, correct, 4), 1.0);
}

TEST(SftTrainTest, StopAfterEndsTrainingAtTheStepItSaysSo) {
  torch::manual_seed(0);
  model::Decoder model(testing::TinyConfig());
  const std::vector<SftExample> examples = {{{1, 3}, {Target(3), 2}}, {{1, 4}, {Target(4), 2}}};
  SftOptions options;
  options.steps = 50;
  options.batch_size = 4;
  int64_t steps_seen = 0;
  std::vector<int64_t> asked;
  options.on_step = [&](int64_t, double) { ++steps_seen; };
  options.stop_after = [&](int64_t done) {
    asked.push_back(done);
    return done == 7;
  };
  SftTrain(model, examples, options);
  EXPECT_EQ(steps_seen, 7);
  EXPECT_EQ(asked, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
}

// Two answers for one prompt, drawn with weights 0.8 and 0.2: the model
// learns that mixture (bootstrap.corrupt_fraction's student, right in some
// samples), not the majority answer alone, and a third prompt's answer
// beside them.
TEST(SftTrainTest, WeightedExamplesTeachTheirMixture) {
  torch::manual_seed(0);
  model::Decoder model(testing::TinyConfig());
  const std::vector<SftExample> examples = {
      {{1, 3}, {5, 2}, 0.8}, {{1, 3}, {6, 2}, 0.2}, {{1, 4}, {7, 2}, 1.0}};
  SftOptions options;
  options.steps = 300;
  options.batch_size = 32;
  options.lr = 1e-2;
  options.warmup_steps = 10;
  options.seed = 5;
  SftTrain(model, examples, options);

  torch::NoGradGuard no_grad;
  model->eval();
  const torch::Tensor input = torch::tensor({1, 3, 1, 4}, torch::kInt64).reshape({2, 2});
  const torch::Tensor p =
      torch::softmax(model->Forward(input, torch::ones({2, 2}, torch::kBool)).logits, -1);
  EXPECT_NEAR(p[0][1][5].item<double>(), 0.8, 0.08);
  EXPECT_NEAR(p[0][1][6].item<double>(), 0.2, 0.08);
  EXPECT_GT(p[1][1][7].item<double>(), 0.9);
}

TEST(SftTrainTest, RejectsBadInput) {
  model::Decoder model(testing::TinyConfig());
  SftOptions options;
  EXPECT_THROW(SftTrain(model, {}, options), std::invalid_argument);
  EXPECT_THROW(SftTrain(model, {{{1}, {}}}, options), std::invalid_argument);
  EXPECT_THROW(SftTrain(model, {{std::vector<int64_t>(20, 3), {2}}}, options),
               std::invalid_argument);
  EXPECT_THROW(SftTrain(model, {{{1, 3}, {5, 2}, 0.0}}, options), std::invalid_argument);
  EXPECT_THROW(
      GreedyAccuracy(model, {}, 3, [](size_t, const std::vector<int64_t>&) { return true; }),
      std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner
