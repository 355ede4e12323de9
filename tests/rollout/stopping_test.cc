// Where a sampled response ends, on tiny models: at any id of a stop list,
// at its token budget (and only then marked truncated), never on a padded
// vocabulary row, and at a stop string found by a decoder (the character
// tokenizer here, as the worker uses it).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/generation_config.h"
#include "model/sampling.h"
#include "model/tokenizer.h"
#include "rollout_worker/stop_strings.h"
#include "tests/rollout/test_policy.h"

namespace kappa::rollout {
namespace {

// Peaked weights (so greedy argmax has no near-ties) on the worker tests' shape.
model::Decoder PeakedDecoder(int64_t vocab_size, uint64_t seed) {
  model::ModelConfig config = testing::TinyConfig();
  config.vocab_size = vocab_size;
  model::Decoder decoder = testing::MakeDecoder(config, seed);
  torch::NoGradGuard no_grad;
  for (auto& p : decoder->named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().mul_(10.0);
  }
  return decoder;
}

std::vector<std::vector<int64_t>> Prompts() {
  return {{1, 5, 6, 7}, {1, 4}, {1, 12, 13, 9, 9}, {1, 20, 19}};
}

model::SamplingParams Greedy(int64_t max_new_tokens, std::vector<int64_t> stops) {
  model::SamplingParams p;
  p.max_new_tokens = max_new_tokens;
  p.temperature = 0.0;
  p.stop_token_ids = std::move(stops);
  return p;
}

// The free run cut after its first token in `stops` (or whole).
std::vector<int64_t> CutAtFirst(const std::vector<int64_t>& run, const std::set<int64_t>& stops) {
  auto it = std::find_if(run.begin(), run.end(), [&](int64_t t) { return stops.count(t) > 0; });
  return std::vector<int64_t>(run.begin(), it == run.end() ? run.end() : it + 1);
}

TEST(Stopping, StopIdsComeFromGenerationConfigElseConfigJson) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kappa_stop_ids_" + std::to_string(getpid()));
  model::ModelConfig config = testing::TinyConfig();
  config.eos_token_ids = {2, 5};  // a config.json list, kept whole
  model::Decoder saved = testing::MakeDecoder(config, 1);
  model::SaveCheckpoint(dir.string(), saved);
  model::Decoder loaded = model::LoadCheckpoint(dir.string());
  EXPECT_EQ(loaded->config().eos_token_ids, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(model::StopTokenIds(loaded->config()), (std::vector<int64_t>{2, 5}));
  // Written back as read: the list survives a load/save round trip.
  EXPECT_EQ(model::ModelConfig::FromJson(loaded->config().ToJson()).eos_token_ids,
            (std::vector<int64_t>{2, 5}));

  const auto write = [&](const std::string& text) {
    std::ofstream(dir / "generation_config.json") << text;
  };
  write(R"({"eos_token_id": [7, 3], "temperature": 0.6, "top_k": 20})");  // others ignored
  EXPECT_EQ(model::StopTokenIds(loaded->config()), (std::vector<int64_t>{7, 3}));
  write(R"({"eos_token_id": 9})");
  EXPECT_EQ(model::StopTokenIds(loaded->config()), (std::vector<int64_t>{9}));
  write(R"({"eos_token_id": null, "bos_token_id": 1})");  // names none: config.json's
  EXPECT_EQ(model::StopTokenIds(loaded->config()), (std::vector<int64_t>{2, 5}));
  for (const char* bad : {R"({"eos_token_id": [7, "x"]})", R"({"eos_token_id": []})",
                          R"({"eos_token_id": -1})", R"({"eos_token_id": 999})", "[1]"}) {
    write(bad);
    try {
      model::StopTokenIds(loaded->config());
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("generation_config.json"), std::string::npos) << message;
      if (std::string(bad) != "[1]") {
        EXPECT_NE(message.find("eos_token_id"), std::string::npos) << message;
      }
    }
  }
  std::filesystem::remove_all(dir);
  // A model built in memory (kappa's toy checkpoints before their first save).
  EXPECT_EQ(model::StopTokenIds(testing::TinyConfig()), (std::vector<int64_t>{2}));
}

TEST(Stopping, EndsAtEitherOfTwoStopIdsAndIsTruncatedOnlyAtTheBudget) {
  model::Decoder model = PeakedDecoder(testing::TinyConfig().vocab_size, 3);
  const auto prompts = Prompts();
  const auto free_run = model::Sample(model, prompts, Greedy(10, {}));
  for (const auto& row : free_run) {
    ASSERT_EQ(row.tokens.size(), 10u);
    EXPECT_TRUE(row.truncated);  // no stop id: every row ran to its budget
  }
  // Two stop ids such that some row ends at the first and another at the
  // second: a list that only honoured one id fails this.
  std::optional<std::pair<int64_t, int64_t>> pair;
  std::set<int64_t> seen;
  for (const auto& row : free_run) seen.insert(row.tokens.begin(), row.tokens.end());
  for (int64_t a : seen) {
    for (int64_t b : seen) {
      if (a >= b || pair) continue;
      std::set<int64_t> ends;
      for (const auto& row : free_run) {
        const auto cut = CutAtFirst(row.tokens, {a, b});
        if (cut.back() == a || cut.back() == b) ends.insert(cut.back());
      }
      if (ends.count(a) && ends.count(b)) pair = {{a, b}};
    }
  }
  ASSERT_TRUE(pair.has_value());
  const auto [a, b] = *pair;
  const auto stopped = model::Sample(model, prompts, Greedy(10, {a, b}));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto expected = CutAtFirst(free_run[i].tokens, {a, b});
    EXPECT_EQ(stopped[i].tokens, expected) << "row " << i;
    EXPECT_EQ(stopped[i].logprobs.size(), expected.size());
    const bool ends_at_stop = expected.back() == a || expected.back() == b;
    EXPECT_EQ(stopped[i].truncated, !ends_at_stop) << "row " << i;
  }

  // A stop id sampled as the very last token of the budget: stopped, not
  // truncated, though the row has max_new_tokens tokens.
  const auto once = std::find_if(free_run.begin(), free_run.end(), [](const auto& row) {
    return std::count(row.tokens.begin(), row.tokens.end(), row.tokens.back()) == 1;
  });
  ASSERT_NE(once, free_run.end());
  const size_t r = static_cast<size_t>(once - free_run.begin());
  const auto at_budget = model::Sample(model, {prompts[r]}, Greedy(10, {once->tokens.back()}));
  EXPECT_EQ(at_budget[0].tokens, once->tokens);
  EXPECT_FALSE(at_budget[0].truncated);

  // The position table is a budget too: 3 tokens fit after this prompt.
  const int64_t max_pos = model->config().max_position_embeddings;
  const std::vector<int64_t> long_prompt(static_cast<size_t>(max_pos - 3), 5);
  const auto squeezed = model::Sample(model, {long_prompt, prompts[1]}, Greedy(10, {}));
  EXPECT_EQ(squeezed[0].tokens.size(), 3u);
  EXPECT_TRUE(squeezed[0].truncated);
  EXPECT_THROW(model::Sample(model, prompts, Greedy(4, {-1})), std::invalid_argument);
}

TEST(Stopping, NeverSamplesAPaddedVocabularyRow) {
  // 40 embedding rows, 32 ids: with near-uniform logits a fifth of the mass
  // would be on the padded rows.
  constexpr int64_t kRows = 40, kIds = 32;
  model::ModelConfig config = testing::TinyConfig();
  config.vocab_size = kRows;
  model::Decoder model = testing::MakeDecoder(config, 11);
  const std::vector<std::vector<int64_t>> prompts(64, {1, 7, 8});
  model::SamplingParams p;
  p.max_new_tokens = 16;
  p.temperature = 1.5;
  // What the tokenizer's size (here 32) gives; 0 means every row, and a
  // tokenizer larger than the table is refused naming both sizes.
  p.sampleable_vocab_size = model::VocabLimit(config, kIds);
  EXPECT_EQ(p.sampleable_vocab_size, kIds);
  EXPECT_EQ(model::VocabLimit(config, 0), kRows);
  try {
    model::VocabLimit(config, kRows + 1);
    ADD_FAILURE() << "a tokenizer larger than the embedding table was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("41 ids"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("40 embedding rows"), std::string::npos) << e.what();
  }
  const auto limited = model::Sample(model, prompts, p, at::detail::createCPUGenerator(5));
  int64_t tokens = 0;
  for (const auto& row : limited) {
    for (int64_t t : row.tokens) EXPECT_LT(t, kIds);
    tokens += static_cast<int64_t>(row.tokens.size());
  }
  EXPECT_EQ(tokens, 64 * 16);  // no stop ids: every row ran to its budget
  // Without the limit the same draws do reach the padded rows.
  p.sampleable_vocab_size = 0;
  bool padded = false;
  for (const auto& row : model::Sample(model, prompts, p, at::detail::createCPUGenerator(5))) {
    for (int64_t t : row.tokens) padded |= t >= kIds;
  }
  EXPECT_TRUE(padded);
  // The behaviour log-probs are over the 32 ids only: log_softmax of the
  // first 32 logits of a plain forward, at temperature 1.5.
  torch::NoGradGuard no_grad;
  const auto& row = limited[0];
  std::vector<int64_t> seq = prompts[0];
  seq.insert(seq.end(), row.tokens.begin(), row.tokens.end());
  const torch::Tensor logits =
      model->Forward(torch::tensor(seq).unsqueeze(0)).logits[0].narrow(-1, 0, kIds);
  const torch::Tensor logp = torch::log_softmax(logits / 1.5, -1);
  for (size_t k = 0; k < row.tokens.size(); ++k) {
    EXPECT_NEAR(row.logprobs[k],
                logp[static_cast<int64_t>(prompts[0].size() + k) - 1][row.tokens[k]].item<float>(),
                1e-4);
  }
  p.sampleable_vocab_size = kRows + 1;
  EXPECT_THROW(model::Sample(model, prompts, p), std::invalid_argument);
}

TEST(Stopping, StopStringsCutRightAfterTheCompletingToken) {
  const model::CharTokenizer tokenizer;
  int decodes = 0;
  const TokenDecoder decode = [&](const std::vector<int64_t>& ids) {
    ++decodes;
    return tokenizer.Decode(ids);
  };
  const std::vector<int64_t> ids = tokenizer.Encode("12+34=46");
  EXPECT_EQ(StopStringPrefix(ids, {"+3"}, decode), 4u);        // "12+3"
  EXPECT_EQ(StopStringPrefix(ids, {"=4", "34"}, decode), 5u);  // "12+34": the earlier completion
  EXPECT_EQ(StopStringPrefix(ids, {"6"}, decode), 8u);         // at the last token
  EXPECT_EQ(StopStringPrefix(ids, {"7", ""}, decode), std::nullopt);
  EXPECT_EQ(StopStringPrefix(ids, {}, decode), std::nullopt);

  // Truncated responses that contain a stop string are cut and count as
  // stopped; the log-probs go with the tokens.
  model::SampledSequence sequence;
  sequence.tokens = ids;
  sequence.logprobs = {-1, -2, -3, -4, -5, -6, -7, -8};
  sequence.truncated = true;
  EXPECT_TRUE(CutAtStopString(sequence, {"+"}, decode));
  EXPECT_EQ(tokenizer.Decode(sequence.tokens), "12+");
  EXPECT_EQ(sequence.logprobs, (std::vector<float>{-1, -2, -3}));
  EXPECT_FALSE(sequence.truncated);
  model::SampledSequence untouched;
  untouched.tokens = ids;
  untouched.logprobs.assign(ids.size(), -1.0f);
  untouched.truncated = true;
  EXPECT_FALSE(CutAtStopString(untouched, {"99"}, decode));
  EXPECT_EQ(untouched.tokens, ids);
  EXPECT_TRUE(untouched.truncated);

  // Bisection: a 200-token response costs one decode plus about log2(200).
  std::string text(199, '1');
  text += "5";
  decodes = 0;
  EXPECT_EQ(StopStringPrefix(tokenizer.Encode(text), {"15"}, decode), 200u);
  EXPECT_LE(decodes, 10);
}

// The engine's per-token check: it fires on the token that completes a stop
// string, decodes only a short tail while there is none, and confirms a
// tail's match on the whole response.
TEST(Stopping, StopStringCheckFiresFromTheCompletingTokenAndDecodesATail) {
  const model::CharTokenizer tokenizer;
  std::vector<size_t> decoded;
  const TokenDecoder decode = [&](const std::vector<int64_t>& ids) {
    decoded.push_back(ids.size());
    return tokenizer.Decode(ids);
  };
  EXPECT_FALSE(StopStringCheck({}, decode));
  EXPECT_FALSE(StopStringCheck({"", ""}, decode));
  const StopCheck check = StopStringCheck({"+3", ""}, decode);
  ASSERT_TRUE(check);
  const std::vector<int64_t> ids = tokenizer.Encode("12+34=46");
  // Asked after every token, it first fires on the 4th, "12+3".
  for (size_t k = 1; k <= 4; ++k) {
    const std::vector<int64_t> prefix(ids.begin(), ids.begin() + static_cast<long>(k));
    EXPECT_EQ(check(prefix), k == 4) << tokenizer.Decode(prefix);
  }
  // A 300-token response without the stop string: each call decodes at most
  // the longest stop string + 2 tokens.
  const std::vector<int64_t> ones = tokenizer.Encode(std::string(300, '1'));
  decoded.clear();
  for (size_t k = 1; k <= ones.size(); ++k) {
    EXPECT_FALSE(check(std::vector<int64_t>(ones.begin(), ones.begin() + static_cast<long>(k))));
  }
  EXPECT_EQ(decoded.size(), ones.size());
  EXPECT_EQ(*std::max_element(decoded.begin(), decoded.end()), 4u);
  std::vector<int64_t> completed = ones;
  for (int64_t id : tokenizer.Encode("+3")) completed.push_back(id);
  EXPECT_TRUE(check(completed));
  // A decoder whose text of a tail is not a piece of the whole text (a
  // tail-only match): the whole response's decode has the last word.
  const TokenDecoder tail_lies = [&](const std::vector<int64_t>& ids) {
    return ids.size() <= 4 ? std::string("+3") : tokenizer.Decode(ids);
  };
  EXPECT_FALSE(StopStringCheck({"+3"}, tail_lies)(ones));
  EXPECT_TRUE(StopStringCheck({"+3"}, tail_lies)(completed));
}

}  // namespace
}  // namespace kappa::rollout
