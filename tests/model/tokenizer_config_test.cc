#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "model/model_config.h"
#include "model/tokenizer.h"

namespace kappa::model {
namespace {

TEST(CharTokenizerTest, RoundTripsArithmetic) {
  CharTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 3 + static_cast<int64_t>(tok.alphabet().size()));
  for (const std::string text : {"12+34=", "-46", "(7*8)/2 = 28", "0123456789", ""}) {
    const auto ids = tok.Encode(text);
    EXPECT_EQ(ids.size(), text.size());
    for (int64_t id : ids) {
      EXPECT_GE(id, 3);
      EXPECT_LT(id, tok.vocab_size());
    }
    EXPECT_EQ(tok.Decode(ids), text);
  }
}

TEST(CharTokenizerTest, BosEosAndPadHandling) {
  CharTokenizer tok;
  auto ids = tok.Encode("1+1=", /*add_bos=*/true, /*add_eos=*/true);
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(ids.front(), CharTokenizer::kBos);
  EXPECT_EQ(ids.back(), CharTokenizer::kEos);
  EXPECT_EQ(tok.Decode(ids), "1+1=");
  // Decoding stops at the first EOS and skips padding.
  auto more = tok.Encode("2");
  ids.insert(ids.begin(), CharTokenizer::kPad);
  ids.insert(ids.end(), more.begin(), more.end());
  EXPECT_EQ(tok.Decode(ids), "1+1=");
}

TEST(CharTokenizerTest, DistinctIdsPerCharacter) {
  CharTokenizer tok("ab");
  EXPECT_EQ(tok.vocab_size(), 5);
  EXPECT_EQ(tok.Encode("ba"), (std::vector<int64_t>{4, 3}));
  EXPECT_THROW(CharTokenizer("aa"), std::invalid_argument);
}

TEST(CharTokenizerTest, UnknownCharacterNamesOffset) {
  CharTokenizer tok;
  try {
    tok.Encode("12+3#4");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'#'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset 4"), std::string::npos) << msg;
  }
  EXPECT_THROW(tok.Encode("\xff"), std::invalid_argument);
  EXPECT_THROW(tok.Decode({tok.vocab_size()}), std::invalid_argument);
  EXPECT_THROW(tok.Decode({-1}), std::invalid_argument);
}

TEST(ModelConfigTest, JsonRoundTrip) {
  ModelConfig c;
  c.name = "student";
  c.vocab_size = 51;
  c.hidden_size = 96;
  c.intermediate_size = 256;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 128;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.eos_token_ids = {2};
  const std::string json = c.ToJson();
  EXPECT_NE(json.find("\"LlamaForCausalLM\""), std::string::npos);
  EXPECT_NE(json.find("\"model_type\": \"llama\""), std::string::npos);
  const ModelConfig d = ModelConfig::FromJson(json);
  EXPECT_EQ(d.name, c.name);
  EXPECT_EQ(d.vocab_size, c.vocab_size);
  EXPECT_EQ(d.hidden_size, c.hidden_size);
  EXPECT_EQ(d.intermediate_size, c.intermediate_size);
  EXPECT_EQ(d.num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(d.num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(d.num_key_value_heads, c.num_key_value_heads);
  EXPECT_EQ(d.max_position_embeddings, c.max_position_embeddings);
  EXPECT_DOUBLE_EQ(d.rope_theta, c.rope_theta);
  EXPECT_DOUBLE_EQ(d.rms_norm_eps, c.rms_norm_eps);
  EXPECT_EQ(d.tie_word_embeddings, c.tie_word_embeddings);
  EXPECT_EQ(d.head_dim(), 16);
}

TEST(ModelConfigTest, AcceptsHuggingFaceExtras) {
  const ModelConfig c = ModelConfig::FromJson(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 256, "vocab_size": 100,
    "eos_token_id": [5, 6], "pad_token_id": null, "transformers_version": "4.44.0",
    "use_cache": true, "pretraining_tp": 1})");
  EXPECT_EQ(c.num_key_value_heads, 4);  // HF default: MHA
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{5, 6}));  // the whole list
  EXPECT_EQ(c.pad_token_id, 0);
}

TEST(ModelConfigTest, RejectsBadConfigs) {
  EXPECT_THROW(ModelConfig::FromJson("{not json"), std::invalid_argument);
  EXPECT_THROW(ModelConfig::FromJson("[]"), std::invalid_argument);
  try {
    ModelConfig::FromJson(R"({"hidden_size": 64, "intermediate_size": 1, "num_hidden_layers": 1,
                              "num_attention_heads": 4, "max_position_embeddings": 8})");
    FAIL() << "missing vocab_size accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
  }
  ModelConfig c;
  c.num_attention_heads = 5;  // 64 % 5 != 0
  EXPECT_THROW(c.Validate(), std::invalid_argument);
  c = ModelConfig();
  c.num_key_value_heads = 3;  // 4 % 3 != 0
  EXPECT_THROW(c.Validate(), std::invalid_argument);
  c = ModelConfig();
  c.eos_token_ids = {2, c.vocab_size};
  EXPECT_THROW(c.ToJson(), std::invalid_argument);
  EXPECT_THROW(ModelConfig::FromJson(R"({"model_type": "gpt2", "hidden_size": 64,
      "intermediate_size": 1, "num_hidden_layers": 1, "num_attention_heads": 4,
      "max_position_embeddings": 8, "vocab_size": 10})"),
               std::invalid_argument);
}

}  // namespace
}  // namespace kappa::model
