#include "model/sampling.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "tests/model/test_models.h"

namespace kappa::model {
namespace {

using testing::TinyDecoder;

std::vector<std::vector<int64_t>> Prompts() {
  return {{1, 5, 6, 7, 8, 9, 10}, {1, 4}, {1, 12, 13, 3, 3}, {1, 20, 19}};
}

SamplingParams Greedy(int64_t max_new_tokens, int64_t eos_id = -1) {
  SamplingParams p;
  p.max_new_tokens = max_new_tokens;
  p.temperature = 0.0;
  if (eos_id >= 0) p.stop_token_ids = {eos_id};  // -1: never stop early
  return p;
}

// log_softmax(logits / temperature) of a full forward over prompt + response,
// at the positions that predicted each response token.
std::vector<float> TeacherForcedLogprobs(Decoder& model, const std::vector<int64_t>& prompt,
                                         const std::vector<int64_t>& response, double temperature) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> seq = prompt;
  seq.insert(seq.end(), response.begin(), response.end());
  auto logits = model->Forward(torch::tensor(seq).unsqueeze(0)).logits[0];
  auto logp = torch::log_softmax(logits / temperature, -1);
  std::vector<float> out;
  for (size_t k = 0; k < response.size(); ++k) {
    out.push_back(logp[static_cast<int64_t>(prompt.size() + k) - 1][response[k]].item<float>());
  }
  return out;
}

TEST(SampleTest, GreedyBatchedEqualsOneByOne) {
  Decoder model = TinyDecoder(2);
  const auto prompts = Prompts();
  const auto batched = Sample(model, prompts, Greedy(10));
  ASSERT_EQ(batched.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto single = Sample(model, {prompts[i]}, Greedy(10));
    EXPECT_EQ(batched[i].tokens, single[0].tokens) << "row " << i;
    EXPECT_EQ(batched[i].tokens.size(), 10u);
    ASSERT_EQ(batched[i].logprobs.size(), single[0].logprobs.size());
    for (size_t k = 0; k < single[0].logprobs.size(); ++k) {
      EXPECT_NEAR(batched[i].logprobs[k], single[0].logprobs[k], 1e-4);
    }
  }
  // Greedy output is the argmax of the full forward at every step.
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> seq = prompts[i];
    seq.insert(seq.end(), batched[i].tokens.begin(), batched[i].tokens.end());
    torch::NoGradGuard no_grad;
    auto logits = model->Forward(torch::tensor(seq).unsqueeze(0)).logits[0];
    for (size_t k = 0; k < batched[i].tokens.size(); ++k) {
      EXPECT_EQ(logits[static_cast<int64_t>(prompts[i].size() + k) - 1].argmax().item<int64_t>(),
                batched[i].tokens[k]);
    }
  }
}

// A server stops sampling for a caller that went away: should_stop is
// asked before every decode step, and once it says so Sample returns with
// the unfinished rows empty.
TEST(SampleTest, ShouldStopEndsSamplingBeforeTheNextStep) {
  Decoder model = TinyDecoder(2);
  SamplingParams params = Greedy(10);
  int asked = 0;
  params.should_stop = [&] { return ++asked > 3; };
  const auto stopped = Sample(model, Prompts(), params);
  EXPECT_EQ(asked, 4) << "asked once per step until it said stop";
  for (const auto& row : stopped) EXPECT_TRUE(row.tokens.empty());
  params.should_stop = [] { return false; };
  for (const auto& row : Sample(model, Prompts(), params)) EXPECT_EQ(row.tokens.size(), 10u);
}

TEST(SampleTest, LogprobsMatchFullForward) {
  Decoder model = TinyDecoder(2);
  const auto prompts = Prompts();
  for (double temperature : {0.0, 0.7, 1.3}) {
    SamplingParams p;
    p.max_new_tokens = 9;
    p.temperature = temperature;
    auto gen = at::detail::createCPUGenerator(123);
    const auto out = Sample(model, prompts, p, gen);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(out[i].tokens.size(), 9u);
      const auto expected =
          TeacherForcedLogprobs(model, prompts[i], out[i].tokens, temperature == 0 ? 1.0 : temperature);
      for (size_t k = 0; k < expected.size(); ++k) {
        EXPECT_NEAR(out[i].logprobs[k], expected[k], 1e-4)
            << "temperature " << temperature << " row " << i << " token " << k;
      }
    }
  }
}

TEST(SampleTest, SameSeedSameSamples) {
  Decoder model = TinyDecoder(4, false, 7, /*scale=*/2.0);  // flatter: real randomness
  SamplingParams p;
  p.max_new_tokens = 12;
  const auto a = Sample(model, Prompts(), p, at::detail::createCPUGenerator(5));
  const auto b = Sample(model, Prompts(), p, at::detail::createCPUGenerator(5));
  const auto c = Sample(model, Prompts(), p, at::detail::createCPUGenerator(6));
  bool any_difference = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    any_difference |= a[i].tokens != c[i].tokens;
  }
  EXPECT_TRUE(any_difference);
}

TEST(SampleTest, EosStopsARow) {
  Decoder model = TinyDecoder(2);
  const auto prompts = Prompts();
  const auto free_run = Sample(model, prompts, Greedy(10));
  // Declare the token row 0 greedily emits third to be EOS: row 0 must stop
  // right after it, every row must stop at its own first occurrence, and
  // the shared batch must not change what the rows emit before that.
  const int64_t eos = free_run[0].tokens[2];
  const auto stopped = Sample(model, prompts, Greedy(10, eos));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& full = free_run[i].tokens;
    const auto first = std::find(full.begin(), full.end(), eos);
    const std::vector<int64_t> expected(full.begin(),
                                        first == full.end() ? full.end() : first + 1);
    EXPECT_EQ(stopped[i].tokens, expected) << "row " << i;
    EXPECT_EQ(stopped[i].logprobs.size(), expected.size());
  }
  EXPECT_LE(stopped[0].tokens.size(), 3u);
  EXPECT_EQ(stopped[0].tokens.back(), eos);
}

TEST(SampleTest, TinyTopPIsGreedy) {
  Decoder model = TinyDecoder(2);
  const auto prompts = Prompts();
  const auto greedy = Sample(model, prompts, Greedy(10));
  SamplingParams p;
  p.max_new_tokens = 10;
  p.temperature = 1.0;
  p.top_p = 1e-6;
  const auto nucleus = Sample(model, prompts, p, at::detail::createCPUGenerator(3));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(nucleus[i].tokens, greedy[i].tokens) << "row " << i;
    // Logprobs stay those of the full distribution, not the truncated one (0).
    for (float lp : nucleus[i].logprobs) EXPECT_LT(lp, -1e-6);
  }
}

TEST(SampleTest, NeverExceedsMaxPositions) {
  Decoder model = TinyDecoder();
  const int64_t max_pos = model->config().max_position_embeddings;
  std::vector<int64_t> long_prompt(static_cast<size_t>(max_pos - 3), 5);
  std::vector<int64_t> full_prompt(static_cast<size_t>(max_pos), 5);
  const auto out = Sample(model, {long_prompt, {1, 4}, full_prompt}, Greedy(10));
  EXPECT_EQ(out[0].tokens.size(), 3u);
  EXPECT_EQ(out[1].tokens.size(), 10u);
  EXPECT_TRUE(out[2].tokens.empty());
  std::vector<int64_t> too_long(static_cast<size_t>(max_pos + 1), 5);
  EXPECT_THROW(Sample(model, {too_long}, Greedy(1)), std::invalid_argument);
  EXPECT_THROW(Sample(model, {{}}, Greedy(1)), std::invalid_argument);
  EXPECT_THROW(Sample(model, {{1, 99}}, Greedy(1)), std::invalid_argument);
  EXPECT_TRUE(Sample(model, {}, Greedy(1)).empty());
}

}  // namespace
}  // namespace kappa::model
