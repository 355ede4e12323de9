// The conflict atlas: the most negative K_DR positions of a step, each with
// its text, the teacher's preferred tokens, the advantage and the reward.
#include "learner/conflict_atlas.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "learner/algo/train_batch.h"
#include "model/text_tokenizer.h"
#include "tasks/vector_dataset.h"

namespace kappa::learner {
namespace {

TEST(MostNegativePositions, KeepsTheMostNegativeResponsePositionsInOrder) {
  const torch::Tensor mask = torch::tensor({{0.f, 1.f, 1.f}, {1.f, 1.f, 0.f}});
  const torch::Tensor kernel = torch::tensor({{-9.f, -1.f, 2.f}, {-3.f, -2.f, -8.f}});
  // -9 and -8 are off the response; 2 is positive.
  const std::vector<KernelPosition> picks = MostNegativePositions(kernel, mask, 2);
  ASSERT_EQ(picks.size(), 2u);
  EXPECT_EQ(picks[0].row, 1);
  EXPECT_EQ(picks[0].column, 0);
  EXPECT_DOUBLE_EQ(picks[0].value, -3.0);
  EXPECT_EQ(picks[1].column, 1);
  EXPECT_EQ(MostNegativePositions(kernel, mask, 10).size(), 3u);
  EXPECT_TRUE(MostNegativePositions(kernel, mask, 0).empty());
}

class ConflictAtlasTest : public ::testing::Test {
 protected:
  // One group of two samples answering "57+68=": "25" (reward 0) and "125"
  // (reward 1), with full teacher rows that prefer "1" first.
  ConflictAtlasTest() : tokenizer_(model::TextTokenizer::Character()) {
    tasks::Example example;
    example.prompt = "57+68=";
    example.answer = "125";
    train_ = std::make_unique<tasks::VectorDataset>(std::vector<tasks::Example>{example});
    const int64_t vocab = tokenizer_.vocab_size();
    ScoredGroup group;
    group.prompt_tokens = tokenizer_.Encode("57+68=", /*add_special_tokens=*/false);
    for (const auto& [text, reward] : {std::pair<std::string, float>{"25", 0.f}, {"125", 1.f}}) {
      ScoredSample sample;
      sample.response_tokens = tokenizer_.Encode(text, false);
      const int64_t length = static_cast<int64_t>(sample.response_tokens.size());
      sample.behavior_logprobs.assign(length, std::log(0.5f));
      sample.reward = reward;
      torch::Tensor logits = torch::zeros({length, vocab});
      logits.index_put_({0, Id("1")}, 6.0);  // the teacher starts every answer with "1"
      sample.teacher_logprobs = torch::log_softmax(logits, -1);
      group.samples.push_back(sample);
    }
    batch_ = BuildTrainBatch({group}, /*norm_std=*/true, /*pad_id=*/0);
  }

  int64_t Id(const std::string& character) const {
    return tokenizer_.Encode(character, false).at(0);
  }

  model::TextTokenizer tokenizer_;
  std::unique_ptr<tasks::VectorDataset> train_;
  TrainBatch batch_;
};

TEST_F(ConflictAtlasTest, EntryCarriesTextTeacherTokensAdvantageAndReward) {
  // K_DR most negative at the first answer token of the wrong sample ("2").
  torch::Tensor kernel = torch::zeros_like(batch_.response_mask);
  const int64_t first = batch_.response_mask[0].nonzero()[0][0].item<int64_t>();
  kernel[0][first] = -5.0;
  kernel[1][first + 1] = -1.0;
  const std::string path = ::testing::TempDir() + "/atlas_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(path.c_str());
  ConflictAtlas atlas(path, /*positions_per_step=*/1, *train_, tokenizer_, /*subset=*/nullptr);
  const std::vector<nlohmann::json> entries = atlas.Entries(7, batch_, kernel, {0});
  ASSERT_EQ(entries.size(), 1u);
  const nlohmann::json& e = entries[0];
  EXPECT_EQ(e["step"], 7);
  EXPECT_DOUBLE_EQ(e["kdr"].get<double>(), -5.0);
  EXPECT_EQ(e["prompt"], "57+68=");
  EXPECT_EQ(e["response"], "25");
  EXPECT_EQ(e["token_index"], 0);
  EXPECT_EQ(e["token"], "2");
  EXPECT_NEAR(e["student_prob"].get<double>(), 0.5, 1e-6);
  EXPECT_EQ(e["teacher_top"][0]["token"], "1");
  const double vocab = static_cast<double>(tokenizer_.vocab_size());
  const double top = std::exp(6.0) / (std::exp(6.0) + vocab - 1);
  EXPECT_NEAR(e["teacher_top"][0]["prob"].get<double>(), top, 1e-5);
  EXPECT_NEAR(e["teacher_prob"].get<double>(), 1.0 / (std::exp(6.0) + vocab - 1), 1e-6);
  EXPECT_EQ(e["teacher_top"].size(), static_cast<size_t>(ConflictAtlas::kTeacherTopTokens));
  EXPECT_LT(e["advantage"].get<double>(), 0.0);  // the wrong sample of a 0/1 group
  EXPECT_EQ(e["reward"], 0.0);
  EXPECT_FALSE(e.contains("subset"));

  // Record appends whole lines.
  ASSERT_TRUE(atlas.Record(7, batch_, kernel, {0}).ok());
  ASSERT_TRUE(atlas.Record(8, batch_, kernel, {0}).ok());
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    EXPECT_EQ(nlohmann::json::parse(line)["response"], "25");
    ++lines;
  }
  EXPECT_EQ(lines, 2);
  std::remove(path.c_str());
}

TEST_F(ConflictAtlasTest, ARepeatedResponseIsShownOnce) {
  // Two samples with the same response "25": one entry for its token 0.
  ScoredGroup group;
  group.prompt_tokens = tokenizer_.Encode("57+68=", false);
  for (float reward : {0.f, 0.f, 1.f}) {
    ScoredSample sample;
    sample.response_tokens = tokenizer_.Encode(reward > 0 ? "125" : "25", false);
    sample.behavior_logprobs.assign(sample.response_tokens.size(), std::log(0.5f));
    sample.reward = reward;
    group.samples.push_back(sample);
  }
  const TrainBatch batch = BuildTrainBatch({group}, true, 0);
  torch::Tensor kernel = torch::zeros_like(batch.response_mask);
  const int64_t first = batch.response_mask[0].nonzero()[0][0].item<int64_t>();
  kernel[0][first] = -5.0;
  kernel[1][first] = -5.0;
  kernel[2][first] = -1.0;
  const std::string path = ::testing::TempDir() + "/atlas_r_" + std::to_string(::getpid());
  ConflictAtlas atlas(path, 2, *train_, tokenizer_, nullptr);
  const std::vector<nlohmann::json> entries = atlas.Entries(1, batch, kernel, {0});
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0]["response"], "25");
  EXPECT_EQ(entries[1]["response"], "125");
  std::remove(path.c_str());
}

TEST_F(ConflictAtlasTest, NoNegativeKernelNoEntryAndSubsetIsNamed) {
  const std::string path = ::testing::TempDir() + "/atlas_s_" + std::to_string(::getpid());
  const CorruptedSubset subset(*tasks::AnswerCorruption::Named("carry_into_hundreds"), *train_,
                               *train_, 1);
  ConflictAtlas atlas(path, 4, *train_, tokenizer_, &subset);
  EXPECT_TRUE(atlas.Entries(1, batch_, torch::ones_like(batch_.response_mask), {0}).empty());
  const std::vector<nlohmann::json> entries =
      atlas.Entries(1, batch_, -torch::ones_like(batch_.response_mask), {0});
  // 2 + 3 response positions, all at -1: each once.
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0]["subset"], "carry_into_hundreds");
  EXPECT_THROW(atlas.Entries(1, batch_, -torch::ones_like(batch_.response_mask), {}),
               std::invalid_argument);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kappa::learner
