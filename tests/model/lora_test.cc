// LoRA adapters on the decoder's projections (model/lora.h), against PEFT's
// definition: y = W x + b + scaling · B A x, scaling = α/r (α/√r rsLoRA).
#include "model/lora.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "model/transformer.h"
#include "tests/model/test_models.h"

namespace kappa::model {
namespace {

using testing::MaxAbsDiff;
using testing::TinyDecoder;

torch::Tensor Logits(Decoder& model, const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  return model->Forward(tokens).logits;
}

torch::Tensor SomeTokens() { return torch::randint(0, 21, {2, 7}, torch::kInt64); }

TEST(LoraTest, FreshAdaptersChangeNothing) {
  Decoder model = TinyDecoder();
  const torch::Tensor tokens = SomeTokens();
  const torch::Tensor before = Logits(model, tokens);
  LoraConfig config;
  config.target_modules = LoraTargetNames();
  model->EnableLora(config);
  EXPECT_TRUE(model->has_lora());
  EXPECT_TRUE(torch::equal(Logits(model, tokens), before));  // lora_B starts at zero
}

TEST(LoraTest, AdaptersAreNamedAndShapedAsPeftSavesThem) {
  Decoder model = TinyDecoder(/*kv_heads=*/2);
  LoraConfig config;
  config.rank = 4;
  config.target_modules = {"k_proj", "down_proj"};
  model->EnableLora(config);
  std::map<std::string, std::vector<int64_t>> adapters;
  for (const auto& p : model->named_parameters()) {
    if (p.key().find("lora_") != std::string::npos) adapters[p.key()] = p.value().sizes().vec();
  }
  // k_proj: 32 -> 2 kv heads × 8 = 16; down_proj: 48 -> 32; two layers.
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"model.layers.0.self_attn.k_proj.lora_A.weight", {4, 32}},
      {"model.layers.0.self_attn.k_proj.lora_B.weight", {16, 4}},
      {"model.layers.0.mlp.down_proj.lora_A.weight", {4, 48}},
      {"model.layers.0.mlp.down_proj.lora_B.weight", {32, 4}},
      {"model.layers.1.self_attn.k_proj.lora_A.weight", {4, 32}},
      {"model.layers.1.self_attn.k_proj.lora_B.weight", {16, 4}},
      {"model.layers.1.mlp.down_proj.lora_A.weight", {4, 48}},
      {"model.layers.1.mlp.down_proj.lora_B.weight", {32, 4}},
  };
  EXPECT_EQ(adapters, expected);
}

// With B ≠ 0 the unmerged forward equals the forward of the base whose
// targeted weights are merged, W + scaling · B A, for α/r and rsLoRA's α/√r.
TEST(LoraTest, UnmergedForwardEqualsTheMergedWeights) {
  for (bool rslora : {false, true}) {
    Decoder model = TinyDecoder();
    Decoder merged = TinyDecoder();  // the same seed: the same base
    LoraConfig config;
    config.rank = 3;
    config.alpha = 6.0;
    config.use_rslora = rslora;
    config.target_modules = {"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj"};
    model->EnableLora(config);
    const double scaling = rslora ? 6.0 / std::sqrt(3.0) : 2.0;
    EXPECT_DOUBLE_EQ(config.Scaling(), scaling);
    torch::manual_seed(11);
    std::map<std::string, torch::Tensor> params;
    for (const auto& p : model->named_parameters()) params[p.key()] = p.value();
    torch::NoGradGuard no_grad;
    for (const auto& p : model->named_parameters()) {
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0.0, 0.5);
    }
    for (const auto& p : merged->named_parameters()) {
      const std::string& name = p.key();
      const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
      if (params.count(stem + ".lora_A.weight") == 0) continue;
      p.value().add_(scaling * torch::matmul(params[stem + ".lora_B.weight"],
                                             params[stem + ".lora_A.weight"]));
    }
    const torch::Tensor tokens = SomeTokens();
    const torch::Tensor unmerged_logits = Logits(model, tokens);
    const double magnitude = unmerged_logits.abs().max().item<double>();
    EXPECT_LT(MaxAbsDiff(unmerged_logits, Logits(merged, tokens)).item<double>(), 1e-5 * magnitude)
        << "rslora " << rslora;
    Decoder base = TinyDecoder();
    EXPECT_GT(MaxAbsDiff(unmerged_logits, Logits(base, tokens)).item<double>(),
              1e-2);  // and the adapters do change the output
  }
}

TEST(LoraTest, BadConfigurationsAreRefusedNamingTheField) {
  const auto refusal = [](const LoraConfig& config) {
    Decoder model = TinyDecoder();
    try {
      model->EnableLora(config);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LoraConfig bad_rank;
  bad_rank.rank = 0;
  EXPECT_NE(refusal(bad_rank).find("lora.rank"), std::string::npos);
  LoraConfig bad_alpha;
  bad_alpha.alpha = 0;
  EXPECT_NE(refusal(bad_alpha).find("lora.alpha"), std::string::npos);
  LoraConfig bad_dropout;
  bad_dropout.dropout = 1.0;
  EXPECT_NE(refusal(bad_dropout).find("lora.dropout"), std::string::npos);
  LoraConfig unknown;
  unknown.target_modules = {"q_proj", "lm_head"};
  EXPECT_NE(refusal(unknown).find("'lm_head' is not one of"), std::string::npos);
  LoraConfig twice;
  twice.target_modules = {"q_proj", "q_proj"};
  EXPECT_NE(refusal(twice).find("listed twice"), std::string::npos);
  Decoder model = TinyDecoder();
  model->EnableLora(LoraConfig());
  EXPECT_THROW(model->EnableLora(LoraConfig()), std::invalid_argument);
}

}  // namespace
}  // namespace kappa::model
