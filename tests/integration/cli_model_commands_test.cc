// `kappa logits` and `kappa generate` on a Hugging Face checkpoint (the
// hf_checkpoints fixture of tests/model): the printed logits are the model's
// own forward, greedy generation continues with the argmax token by token,
// and bad arguments or a missing directory are refused naming the flag or
// the path.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/generation_config.h"
#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

using Json = nlohmann::json;
using testing::RunKappa;

const std::string kModel = std::string(KAPPA_HF_CHECKPOINTS) + "/qwen3_qknorm_headdim";

TEST(CliModelCommands, LogitsAreTheModelsForward) {
  const testing::CommandResult result = RunKappa({"logits", kModel, "--ids", "3,17,42,5"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const Json printed = Json::parse(result.output);
  EXPECT_EQ(printed["ids"], Json::parse("[3,17,42,5]"));

  model::Decoder decoder = model::LoadCheckpoint(kModel);
  torch::NoGradGuard no_grad;
  const auto expected = decoder->Forward(torch::tensor(std::vector<int64_t>{3, 17, 42, 5}).unsqueeze(0)).logits[0];
  ASSERT_EQ(printed["logits"].size(), 4u);
  for (int64_t t = 0; t < 4; ++t) {
    const auto row = torch::tensor(printed["logits"][t].get<std::vector<float>>());
    ASSERT_EQ(row.size(0), decoder->config().vocab_size);
    EXPECT_LT((row - expected[t]).abs().max().item<float>(), 1e-6) << "position " << t;
  }
}

TEST(CliModelCommands, GreedyGenerationFollowsTheArgmax) {
  const testing::CommandResult result =
      RunKappa({"generate", kModel, "--prompt-ids", "3,17", "--max-new-tokens", "5", "--temperature", "0"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const Json printed = Json::parse(result.output);
  const auto ids = printed["ids"].get<std::vector<int64_t>>();
  ASSERT_FALSE(ids.empty());
  ASSERT_LE(ids.size(), 5u);
  EXPECT_EQ(printed["logprobs"].size(), ids.size());

  model::Decoder decoder = model::LoadCheckpoint(kModel);
  torch::NoGradGuard no_grad;
  std::vector<int64_t> sequence = {3, 17};
  for (int64_t id : ids) {
    const auto logits = decoder->Forward(torch::tensor(sequence).unsqueeze(0)).logits[0][-1];
    EXPECT_EQ(logits.argmax().item<int64_t>(), id);
    sequence.push_back(id);
  }
  // Finished: ended at a stop id of the model, not at --max-new-tokens.
  const std::vector<int64_t> stops = model::StopTokenIds(decoder->config());
  EXPECT_EQ(printed["finished"].get<bool>(),
            std::find(stops.begin(), stops.end(), ids.back()) != stops.end());
}

TEST(CliModelCommands, RefusesBadArgumentsNamingThem) {
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{"logits", kModel, "--ids", "3,x"}, 2, "--ids: 'x' is not a token id"},
      {{"logits", kModel, "--ids", "3,100000"}, 2, "--ids: token id 100000 is outside the vocabulary"},
      {{"logits", kModel}, 2, "--ids"},
      {{"logits", kModel, "--ids", "1", "--dtype", "fp8"}, 2, "--dtype: 'fp8'"},
      {{"logits", "/nonexistent/model", "--ids", "1"}, 1, "/nonexistent/model"},
      {{"generate", kModel, "--prompt", "hello"}, 2, "--prompt-ids"},
      {{"generate", kModel, "--prompt-ids", "1", "--max-new-tokens", "0"}, 2, "--max-new-tokens >= 1"},
      {{"generate", kModel, "--prompt-ids", "1", "--max-new-tokens", "64"}, 2, "max_position_embeddings 64"},
  };
  for (const Case& c : cases) {
    const testing::CommandResult result = RunKappa(c.args);
    EXPECT_EQ(result.exit_code, c.exit_code) << c.args[0] << " " << c.args.back() << ": " << result.output;
    EXPECT_NE(result.output.find(c.fragment), std::string::npos) << result.output;
  }
}

}  // namespace
}  // namespace kappa::cli
