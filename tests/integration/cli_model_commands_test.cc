// `kappa logits` and `kappa generate` on a Hugging Face checkpoint (the
// hf_checkpoints fixture of tests/model): the printed logits are the model's
// own forward, greedy generation continues with the argmax token by token,
// `kappa export --merge` writes the merged model of a LoRA adapter, and bad
// arguments or a missing directory are refused naming the flag or the path.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/generation_config.h"
#include "model/peft_adapter.h"
#include "model/text_tokenizer.h"
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

// A text prompt through the model directory's tokenizer.json: a tiny random
// Qwen2-shaped model whose embedding has Qwen2.5-0.5B's 151,936 rows for the
// real Qwen2.5 tokenizer's 151,665 ids. Sampled at temperature 1 from a random
// model, the response never holds a padded row, and "text" is its decode.
TEST(CliModelCommands, GenerateFromTextWithTheDirectorysTokenizer) {
  model::ModelConfig config;
  config.architecture = model::Architecture::kQwen2;
  config.vocab_size = 151936;
  config.hidden_size = 16;
  config.intermediate_size = 32;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.max_position_embeddings = 128;
  config.tie_word_embeddings = true;
  config.eos_token_ids = {151645};
  const std::string dir = testing::MakeTempDir("kappa_cli_generate_text");
  {
    torch::manual_seed(3);
    model::Decoder decoder(config);
    model::SaveCheckpoint(dir, decoder);
  }
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(std::string(KAPPA_HF_TOKENIZERS) + "/qwen2_5/" + file,
                               dir + "/" + file);
  }
  const testing::CommandResult result = RunKappa(
      {"generate", dir, "--prompt", "What is 2+3?", "--max-new-tokens", "48", "--seed", "7"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const Json printed = Json::parse(result.output);
  // "What is 2+3?" in Qwen2.5's tokenizer (no special tokens to add).
  EXPECT_EQ(printed["prompt_ids"], Json::parse("[3838,374,220,17,10,18,30]"));
  const auto ids = printed["ids"].get<std::vector<int64_t>>();
  ASSERT_FALSE(ids.empty());
  for (int64_t id : ids) EXPECT_LT(id, 151665) << "sampled a padded embedding row";
  const model::TextTokenizer tokenizer = model::TextTokenizer::ForModel(dir);
  EXPECT_EQ(printed["text"].get<std::string>(),
            tokenizer.Decode(ids, /*skip_special_tokens=*/true));
  std::filesystem::remove_all(dir);
}

TEST(CliModelCommands, RefusesBadArgumentsNamingThem) {
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{"logits", kModel, "--ids", "3,x"}, 2, "--ids: 'x' is not a token id"},
      {{"logits", kModel, "--ids", "3,100000"},
       2,
       "--ids: token id 100000 is outside the vocabulary"},
      {{"logits", kModel}, 2, "--ids"},
      {{"logits", kModel, "--ids", "1", "--dtype", "fp8"}, 2, "--dtype: 'fp8'"},
      {{"logits", "/nonexistent/model", "--ids", "1"}, 1, "/nonexistent/model"},
      {{"generate", kModel, "--prompt", "hello"},
       2,
       "--prompt: " + kModel + "/tokenizer.json: no such file"},
      {{"generate", kModel, "--prompt", "hello", "--prompt-ids", "1"},
       2,
       "one of --prompt-ids or --prompt"},
      {{"generate", kModel, "--prompt-ids", "1", "--max-new-tokens", "0"},
       2,
       "--max-new-tokens >= 1"},
      {{"generate", kModel, "--prompt-ids", "1", "--max-new-tokens", "64"},
       2,
       "max_position_embeddings 64"},
      {{"export", "/tmp/out"}, 2, "--merge ADAPTER_DIR is required"},
      {{"export", "--merge", kModel}, 2, "missing OUT_DIR"},
      {{"export", "--merge", kModel, "/tmp/kappa_never_written"},
       1,
       kModel + "/adapter_config.json"},
  };
  for (const Case& c : cases) {
    const testing::CommandResult result = RunKappa(c.args);
    EXPECT_EQ(result.exit_code, c.exit_code) << c.args[0] << " " << c.args.back() << ": " << result.output;
    EXPECT_NE(result.output.find(c.fragment), std::string::npos) << result.output;
  }
}

// An adapter with random nonzero A and B on an fp32 fixture: the exported
// model is a plain checkpoint that computes what the unmerged adapter does
// (float32 rounding aside), in the base's dtype and with its companion files.
const std::string kFp32Model = std::string(KAPPA_HF_CHECKPOINTS) + "/qwen3_tied_fp32";

TEST(CliModelCommands, ExportMergeWritesTheMergedModel) {
  const std::string dir = testing::MakeTempDir("kappa_cli_export");
  model::Decoder adapted = model::LoadCheckpoint(kFp32Model);
  model::LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  adapted->EnableLora(lora);
  torch::NoGradGuard no_grad;
  torch::manual_seed(9);
  for (auto& [name, tensor] : model::NamedAdapters(adapted)) {
    torch::Tensor t = tensor;
    t.copy_(torch::randn_like(t) * 0.1);
  }
  model::SaveAdapter(dir + "/adapter", adapted, lora, "not/a/local/dir");

  const testing::CommandResult result =
      RunKappa({"export", "--merge", dir + "/adapter", dir + "/merged", "--base", kFp32Model});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("wrote " + dir + "/merged"), std::string::npos) << result.output;
  model::Decoder merged = model::LoadCheckpoint(dir + "/merged");
  EXPECT_FALSE(merged->has_lora());
  EXPECT_EQ(merged->config().torch_dtype, model::ReadModelConfig(kFp32Model).torch_dtype);
  EXPECT_TRUE(std::filesystem::exists(dir + "/merged/tokenizer_config.json"));
  const auto tokens = torch::tensor(std::vector<int64_t>{3, 17, 42, 5, 9}).unsqueeze(0);
  const auto expected = adapted->Forward(tokens).logits;
  const auto base = model::LoadCheckpoint(kFp32Model)->Forward(tokens).logits;
  EXPECT_LT((merged->Forward(tokens).logits - expected).abs().max().item<float>(), 1e-5);
  EXPECT_GT((base - expected).abs().max().item<float>(), 1e-2);  // the adapter matters

  // `kappa logits` and `generate` take the adapter directory as a model: the
  // base from base_model_name_or_path, the adapters on it (and the base's
  // tokenizer for --prompt).
  model::SaveAdapter(dir + "/local", adapted, lora, kFp32Model);
  const testing::CommandResult logits =
      RunKappa({"logits", dir + "/local", "--ids", "3,17,42,5,9"});
  ASSERT_EQ(logits.exit_code, 0) << logits.output;
  const nlohmann::json printed = nlohmann::json::parse(logits.output);
  const auto last = expected[0][4];
  for (int64_t v = 0; v < last.size(0); v += 7) {
    EXPECT_NEAR(printed["logits"][4][v].get<double>(), last[v].item<double>(), 1e-4) << v;
  }
  const testing::CommandResult generated = RunKappa(
      {"generate", dir + "/local", "--prompt-ids", "3,17", "--max-new-tokens", "2", "--seed", "1"});
  EXPECT_EQ(generated.exit_code, 0) << generated.output;
  // This base has no tokenizer.json: --prompt looks for the base's, by name.
  const testing::CommandResult text =
      RunKappa({"generate", dir + "/local", "--prompt", "hello", "--max-new-tokens", "2"});
  EXPECT_EQ(text.exit_code, 2) << text.output;
  EXPECT_NE(text.output.find(kFp32Model + "/tokenizer.json"), std::string::npos) << text.output;

  // Without --base, the adapter's base_model_name_or_path is named.
  const testing::CommandResult no_base =
      RunKappa({"export", "--merge", dir + "/adapter", dir + "/other"});
  EXPECT_EQ(no_base.exit_code, 1) << no_base.output;
  EXPECT_NE(no_base.output.find("\"base_model_name_or_path\" is \"not/a/local/dir\""),
            std::string::npos)
      << no_base.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kappa::cli
