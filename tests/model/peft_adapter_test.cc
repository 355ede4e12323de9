// PEFT adapter directories (model/peft_adapter.h): what kappa writes is what
// PEFT writes (adapter_config.json's fields, "base_model.model." keys, F32,
// {"format": "pt"}), what PEFT and vLLM write loads, what kappa does not
// implement is refused by name, and merged weights compute what the
// unmerged adapters do.
#include "model/peft_adapter.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "tests/model/test_models.h"

namespace kappa::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::MaxAbsDiff;
using testing::TinyDecoder;

constexpr char kQProjA[] = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";

LoraConfig AllTargets(int64_t rank = 4, double alpha = 8.0, bool rslora = false) {
  LoraConfig config;
  config.rank = rank;
  config.alpha = alpha;
  config.use_rslora = rslora;
  config.target_modules = LoraTargetNames();
  return config;
}

// Adapters with random A and B (B nonzero: the adapters change the logits).
void RandomizeAdapters(Decoder& model, uint64_t seed = 3) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : NamedAdapters(model)) {
    torch::Tensor t = tensor;
    t.copy_(torch::randn_like(t) * 0.1);
  }
}

// TinyDecoder (the same base every call) with random adapters `config`.
Decoder AdaptedDecoder(const LoraConfig& config, int64_t kv_heads = 4) {
  Decoder model = TinyDecoder(kv_heads);
  model->EnableLora(config);
  RandomizeAdapters(model);
  return model;
}

torch::Tensor Logits(Decoder& model) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  return model->Forward(torch::randint(0, 21, {2, 9}, torch::kInt64)).logits;
}

// The logits' scale: float32 rounding of the merge is relative to it
// (TinyDecoder's weights are scaled up, so activations are large).
double Magnitude(const torch::Tensor& logits) { return logits.abs().max().item<double>(); }

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The message of what `load` throws (a runtime_error), or a failure.
std::string ErrorOf(const std::function<void()>& load) {
  try {
    load();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

class PeftAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kappa_peft_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An adapter of AdaptedDecoder(config) saved under `name`.
  std::string SavedAdapter(const LoraConfig& config, const std::string& name = "adapter") {
    Decoder model = AdaptedDecoder(config);
    const std::string dir = Path(name);
    SaveAdapter(dir, model, config, "some/base");
    return dir;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string ConfigFile(const std::string& adapter) const {
    return adapter + "/" + kAdapterConfigFile;
  }
  std::string WeightsFile(const std::string& adapter) const {
    return adapter + "/" + kAdapterWeightsFile;
  }

  // adapter_config.json of `adapter` with `patch` merged in (null deletes).
  void PatchConfig(const std::string& adapter, const Json& patch) {
    Json j = Json::parse(ReadText(ConfigFile(adapter)));
    j.merge_patch(patch);
    WriteText(ConfigFile(adapter), j.dump(2));
  }
  // adapter_model.safetensors of `adapter` rewritten by `edit`.
  void EditTensors(const std::string& adapter,
                   const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
    std::map<std::string, torch::Tensor> tensors = ReadSafetensors(WeightsFile(adapter));
    edit(tensors);
    WriteSafetensors(WeightsFile(adapter), tensors);
  }
  // LoadAdapter(adapter) onto a fresh TinyDecoder: the error's message.
  std::string LoadError(const std::string& adapter, int64_t kv_heads = 4) {
    Decoder model = TinyDecoder(kv_heads);
    const std::string message = ErrorOf([&] { LoadAdapter(adapter, model); });
    EXPECT_FALSE(model->has_lora()) << "a failed load left adapters on the model";
    return message;
  }

  fs::path dir_;
};

// adapter_config.json has every field PEFT's LoraConfig writes that says what
// the adapter computes, under PEFT's names and with its values.
TEST_F(PeftAdapterTest, ConfigHasPeftsFieldsAndValues) {
  LoraConfig config = AllTargets(16, 32.0, true);
  config.dropout = 0.05;
  config.target_modules = {"v_proj", "q_proj", "down_proj"};
  const Json expected = Json::parse(R"({
    "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32,
    "lora_dropout": 0.05, "target_modules": ["down_proj", "q_proj", "v_proj"],
    "use_rslora": true, "bias": "none", "lora_bias": false, "use_dora": false,
    "fan_in_fan_out": false, "init_lora_weights": true, "modules_to_save": null,
    "layers_to_transform": null, "layers_pattern": null, "rank_pattern": {},
    "alpha_pattern": {}, "inference_mode": true,
    "base_model_name_or_path": "Qwen/Qwen2.5-0.5B", "revision": null})");
  const std::string text = AdapterConfigJson(config, "Qwen/Qwen2.5-0.5B");
  EXPECT_EQ(Json::parse(text), expected);
  EXPECT_TRUE(Json::parse(text)["lora_alpha"].is_number_integer());  // PEFT's int

  const AdapterConfig parsed = ParseAdapterConfig(text, "adapter_config.json");
  EXPECT_EQ(parsed.lora.rank, 16);
  EXPECT_EQ(parsed.lora.alpha, 32.0);
  EXPECT_EQ(parsed.lora.dropout, 0.05);
  EXPECT_TRUE(parsed.lora.use_rslora);
  EXPECT_EQ(parsed.lora.target_modules,
            (std::vector<std::string>{"down_proj", "q_proj", "v_proj"}));
  EXPECT_EQ(parsed.base_model_name_or_path, "Qwen/Qwen2.5-0.5B");
}

// The directory: PEFT's tensor names, float32, {"format": "pt"}; loading it
// onto the same base gives back every value and the same logits.
TEST_F(PeftAdapterTest, SaveLoadRoundTrip) {
  const LoraConfig config = AllTargets(4, 8.0);
  Decoder model = AdaptedDecoder(config);
  const std::string dir = Path("adapter");
  SaveAdapter(dir, model, config, "some/base");

  const std::unique_ptr<SafetensorsFile> file = SafetensorsFile::Open(WeightsFile(dir));
  EXPECT_EQ(file->entries().size(), 2u * 7u * 2u);  // A and B, 7 projections, 2 layers
  ASSERT_EQ(file->entries().count(kQProjA), 1u);
  EXPECT_EQ(file->entries().at(kQProjA).shape, (std::vector<int64_t>{4, 32}));
  for (const auto& [key, entry] : file->entries()) EXPECT_EQ(entry.dtype, torch::kFloat32) << key;
  const std::string bytes = ReadText(WeightsFile(dir));
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(Json::parse(bytes.substr(8, header_size))["__metadata__"], Json({{"format", "pt"}}));

  Decoder loaded = TinyDecoder();
  const AdapterConfig read = LoadAdapter(dir, loaded);
  EXPECT_EQ(read.base_model_name_or_path, "some/base");
  ASSERT_TRUE(loaded->has_lora());
  EXPECT_EQ(loaded->lora_config().rank, 4);
  const auto saved_adapters = NamedAdapters(model);
  const auto loaded_adapters = NamedAdapters(loaded);
  ASSERT_EQ(loaded_adapters.size(), saved_adapters.size());
  for (const auto& [name, tensor] : saved_adapters) {
    EXPECT_TRUE(torch::equal(loaded_adapters.at(name), tensor)) << name;
  }
  EXPECT_TRUE(torch::equal(Logits(loaded), Logits(model)));

  // Onto a model whose adapters were enabled with the same config.
  Decoder enabled = TinyDecoder();
  enabled->EnableLora(config);
  LoadAdapter(dir, enabled);
  EXPECT_TRUE(torch::equal(Logits(enabled), Logits(model)));
}

// What PEFT and vLLM also write: keys without "base_model.model.", BF16
// tensors, a config with only some fields (PEFT's defaults for the rest) or
// with PEFT's many other fields.
TEST_F(PeftAdapterTest, LoadsPeftsVariants) {
  const LoraConfig config = AllTargets(4, 8.0);
  const std::string dir = SavedAdapter(config);
  EditTensors(dir, [](std::map<std::string, torch::Tensor>& tensors) {
    std::map<std::string, torch::Tensor> renamed;
    for (auto& [key, t] : tensors)
      renamed[key.substr(std::strlen("base_model.model."))] = t.to(torch::kBFloat16);
    tensors = renamed;
  });
  Decoder model = TinyDecoder();
  LoadAdapter(dir, model);
  const auto expected =
      ReadSafetensors(WeightsFile(dir)).at("model.layers.1.mlp.up_proj.lora_B.weight");
  EXPECT_TRUE(torch::equal(NamedAdapters(model).at("model.layers.1.mlp.up_proj.lora_B.weight"),
                           expected.to(torch::kFloat32)));

  const AdapterConfig sparse = ParseAdapterConfig(R"({"peft_type": "LORA"})", "a.json");
  EXPECT_EQ(sparse.lora.rank, 8);
  EXPECT_EQ(sparse.lora.alpha, 8.0);
  EXPECT_EQ(sparse.lora.dropout, 0.0);
  EXPECT_FALSE(sparse.lora.use_rslora);
  EXPECT_EQ(sparse.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  // PEFT 0.13's adapter_config.json for a Qwen2.5 adapter, as written.
  const AdapterConfig peft = ParseAdapterConfig(R"({
    "alpha_pattern": {}, "auto_mapping": null, "base_model_name_or_path": "Qwen/Qwen2.5-0.5B",
    "bias": "none", "fan_in_fan_out": false, "inference_mode": true, "init_lora_weights": true,
    "layer_replication": null, "layers_pattern": null, "layers_to_transform": null,
    "loftq_config": {}, "lora_alpha": 32, "lora_dropout": 0.05, "megatron_config": null,
    "megatron_core": "megatron.core", "modules_to_save": null, "peft_type": "LORA", "r": 16,
    "rank_pattern": {}, "revision": null, "target_modules": ["up_proj", "q_proj", "v_proj",
    "o_proj", "gate_proj", "k_proj", "down_proj"], "task_type": "CAUSAL_LM", "use_dora": false,
    "use_rslora": false})",
                                                "a.json");
  EXPECT_EQ(peft.lora.rank, 16);
  EXPECT_EQ(peft.lora.target_modules.size(), 7u);
}

// Adapters are not weights: NamedWeights and SaveCheckpoint leave them out,
// LoadWeights neither misses nor expects them.
TEST_F(PeftAdapterTest, CheckpointsLeaveAdaptersOut) {
  Decoder model = AdaptedDecoder(AllTargets());
  const auto weights = NamedWeights(model);
  const auto adapters = NamedAdapters(model);
  EXPECT_EQ(adapters.size(), 28u);
  for (const auto& [name, t] : weights) EXPECT_FALSE(IsAdapterName(name)) << name;
  for (const auto& [name, t] : adapters) EXPECT_TRUE(IsAdapterName(name)) << name;
  EXPECT_EQ(weights.size() + adapters.size(), model->named_parameters().size());
  EXPECT_FALSE(IsAdapterName("model.layers.0.self_attn.q_proj.weight"));

  SaveCheckpoint(Path("ckpt"), model);
  Decoder plain = LoadCheckpoint(Path("ckpt"));
  EXPECT_FALSE(plain->has_lora());
  Decoder base = TinyDecoder();
  EXPECT_TRUE(torch::equal(Logits(plain), Logits(base)));

  LoadWeights(model, NamedWeights(base));  // the adapters are not missing
  auto with_adapter = NamedWeights(base);
  with_adapter.emplace("model.layers.0.self_attn.q_proj.lora_A.weight", torch::zeros({4, 32}));
  const std::string message = ErrorOf([&] { LoadWeights(plain, with_adapter); });
  EXPECT_NE(message.find("unexpected [model.layers.0.self_attn.q_proj.lora_A.weight]"),
            std::string::npos)
      << message;
}

// LoadAdapters: strict by name and shape, and nothing changes on error.
TEST_F(PeftAdapterTest, LoadAdaptersIsStrict) {
  Decoder model = AdaptedDecoder(AllTargets());
  Decoder other = AdaptedDecoder(AllTargets());
  auto adapters = NamedAdapters(other);
  for (auto& [name, t] : adapters) t = t.detach().clone() + 1;
  const auto before = NamedAdapters(model).at("model.layers.0.mlp.up_proj.lora_B.weight").clone();
  auto broken = adapters;
  broken.erase("model.layers.1.mlp.down_proj.lora_A.weight");
  broken["model.layers.0.self_attn.k_proj.lora_B.weight"] = torch::zeros({16, 4});
  const std::string message = ErrorOf([&] { LoadAdapters(model, broken); });
  EXPECT_NE(message.find("missing [model.layers.1.mlp.down_proj.lora_A.weight]"), std::string::npos)
      << message;
  EXPECT_NE(
      message.find("model.layers.0.self_attn.k_proj.lora_B.weight (expected [32, 4], got [16, 4])"),
      std::string::npos)
      << message;
  EXPECT_TRUE(
      torch::equal(NamedAdapters(model).at("model.layers.0.mlp.up_proj.lora_B.weight"), before));
  LoadAdapters(model, adapters);
  EXPECT_TRUE(torch::equal(NamedAdapters(model).at("model.layers.0.mlp.up_proj.lora_B.weight"),
                           adapters.at("model.layers.0.mlp.up_proj.lora_B.weight")));
}

// A rank other than the config's: the tensor, both shapes and r are named.
TEST_F(PeftAdapterTest, RefusesRankMismatch) {
  const std::string dir = SavedAdapter(AllTargets(4));
  PatchConfig(dir, {{"r", 8}});
  const std::string message = LoadError(dir);
  EXPECT_NE(message.find(WeightsFile(dir)), std::string::npos) << message;
  EXPECT_NE(message.find(std::string(kQProjA) + " (expected [8, 32] for r 8"), std::string::npos)
      << message;
  EXPECT_NE(message.find("got [4, 32]"), std::string::npos) << message;

  // A model with adapters of another rank: the field is named.
  Decoder model = TinyDecoder();
  model->EnableLora(AllTargets(2));
  const std::string disagree = ErrorOf([&] { LoadAdapter(dir, model); });
  EXPECT_NE(disagree.find(ConfigFile(dir) + ": \"r\" is 8 but the model's adapters have 2"),
            std::string::npos)
      << disagree;
}

// An adapter saved on another base (2 kv heads: k_proj and v_proj are
// [16, 32], not [32, 32]) does not fit: tensor, base weight, both shapes.
TEST_F(PeftAdapterTest, RefusesAnotherBase) {
  const std::string dir = SavedAdapter(AllTargets(4));
  const std::string message = LoadError(dir, /*kv_heads=*/2);
  EXPECT_NE(
      message.find(
          "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight (expected [16, 4] for "
          "r 4 on the base's model.layers.0.self_attn.k_proj.weight [16, 32], got [32, 4])"),
      std::string::npos)
      << message;
}

TEST_F(PeftAdapterTest, RefusesMissingAndUnexpectedTensors) {
  const std::string dir = SavedAdapter(AllTargets(4));
  EditTensors(dir, [](std::map<std::string, torch::Tensor>& tensors) {
    tensors.erase("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  });
  std::string message = LoadError(dir);
  EXPECT_NE(message.find(WeightsFile(dir) +
                         ": missing [base_model.model.model.layers.1.mlp.down_proj.lora_B.weight]"),
            std::string::npos)
      << message;

  const std::string other = SavedAdapter(AllTargets(4), "other");
  EditTensors(other, [](std::map<std::string, torch::Tensor>& tensors) {
    tensors["base_model.model.lm_head.lora_A.weight"] = torch::zeros({4, 32});
  });
  message = LoadError(other);
  EXPECT_NE(message.find("unexpected [base_model.model.lm_head.lora_A.weight (adapters on lm_head "
                         "are not supported)]"),
            std::string::npos)
      << message;

  // Tensors of PEFT features kappa lacks are named.
  for (const char* key : {"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
                          "base_model.model.model.embed_tokens.lora_embedding_A",
                          "base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias",
                          "base_model.model.model.layers.0.self_attn.q_proj.weight"}) {
    const std::string extra = SavedAdapter(AllTargets(4), "extra");
    EditTensors(extra, [&](std::map<std::string, torch::Tensor>& tensors) {
      tensors[key] = torch::zeros({4});
    });
    message = LoadError(extra);
    EXPECT_NE(message.find(std::string("tensor \"") + key + "\""), std::string::npos) << message;
  }
}

// Fields of adapter_config.json kappa does not implement, each named.
TEST_F(PeftAdapterTest, RefusesUnimplementedConfigFields) {
  const Json base = Json::parse(AdapterConfigJson(AllTargets(), "b"));
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"use_dora", true}}, "\"use_dora\" is true: DoRA"},
      {{{"peft_type", "IA3"}}, "\"peft_type\" is \"IA3\""},
      {{{"peft_type", nullptr}}, "\"peft_type\" is missing"},
      {{{"task_type", "SEQ_CLS"}}, "\"task_type\" is \"SEQ_CLS\""},
      {{{"target_modules", {"q_proj", "lm_head"}}},
       "\"target_modules\" 'lm_head' adapters on lm_head are not supported"},
      {{{"target_modules", {"embed_tokens"}}},
       "\"target_modules\" 'embed_tokens' adapters on embed_tokens"},
      {{{"target_modules", {"q_proj", "c_attn"}}}, "\"target_modules\" 'c_attn' is not one of"},
      {{{"target_modules", ".*(q_proj|v_proj)$"}}, "\"target_modules\" is the string"},
      {{{"bias", "all"}}, "\"bias\" is \"all\""},
      {{{"lora_bias", true}}, "\"lora_bias\" is true"},
      {{{"fan_in_fan_out", true}}, "\"fan_in_fan_out\" is true"},
      {{{"modules_to_save", {"lm_head"}}}, "\"modules_to_save\" is [\"lm_head\"]"},
      {{{"layers_to_transform", {0}}}, "\"layers_to_transform\" is [0]"},
      {{{"layers_pattern", "layers"}}, "\"layers_pattern\" is \"layers\""},
      {{{"rank_pattern", {{"q_proj", 4}}}}, "\"rank_pattern\" is"},
      {{{"alpha_pattern", {{"q_proj", 4}}}}, "\"alpha_pattern\" is"},
      {{{"init_lora_weights", "pissa"}}, "\"init_lora_weights\" is \"pissa\""},
      {{{"r", 0}}, "\"r\" must be an integer >= 1"},
      {{{"lora_alpha", -1}}, "\"lora_alpha\" must be > 0"},
      {{{"lora_dropout", 1.5}}, "\"lora_dropout\" must be in [0, 1)"},
  };
  for (const auto& [patch, fragment] : cases) {
    Json j = base;
    j.merge_patch(patch);  // null deletes
    const std::string message =
        ErrorOf([&] { ParseAdapterConfig(j.dump(), "dir/adapter_config.json"); });
    EXPECT_NE(message.find("dir/adapter_config.json: " + fragment), std::string::npos)
        << patch.dump() << " gave: " << message;
  }
  // Through LoadAdapter, the file is named.
  const std::string dir = SavedAdapter(AllTargets(4));
  PatchConfig(dir, {{"use_dora", true}});
  EXPECT_NE(LoadError(dir).find(ConfigFile(dir) + ": \"use_dora\""), std::string::npos);
}

// W + scaling · B · A computes what the unmerged adapters do, for α/r and
// α/√r: within float32 rounding (1e-5 of the logits' scale).
TEST_F(PeftAdapterTest, MergedWeightsForwardEqualsTheAdapters) {
  for (bool rslora : {false, true}) {
    Decoder adapted = AdaptedDecoder(AllTargets(4, 12.0, rslora));
    const std::map<std::string, torch::Tensor> merged = MergedWeights(adapted);
    EXPECT_EQ(merged.size(), NamedWeights(adapted).size());
    Decoder plain = TinyDecoder(4, false, /*seed=*/99);
    LoadWeights(plain, merged);
    const torch::Tensor expected = Logits(adapted);
    EXPECT_LT(MaxAbsDiff(Logits(plain), expected).item<double>(), 1e-5 * Magnitude(expected))
        << "rslora " << rslora;
    Decoder base = TinyDecoder();
    EXPECT_GT(MaxAbsDiff(Logits(base), expected).item<double>(), 1e-2)
        << "the adapters change nothing";
  }
}

// `kappa export --merge`: a plain checkpoint of the merged model with the
// base's companion files, in the base's dtype.
TEST_F(PeftAdapterTest, ExportMergedWritesAPlainCheckpoint) {
  Decoder base = TinyDecoder();
  SaveCheckpoint(Path("base"), base, {torch::kFloat32});
  WriteText(Path("base") + "/tokenizer_config.json", "{\"model_max_length\": 48}");
  Decoder base_loaded = LoadCheckpoint(Path("base"));
  const LoraConfig config = AllTargets(4, 8.0, true);
  base_loaded->EnableLora(config);
  RandomizeAdapters(base_loaded);
  SaveAdapter(Path("adapter"), base_loaded, config, Path("base"));

  EXPECT_EQ(ExportMergedAdapter(Path("adapter"), Path("merged")), Path("base"));
  Decoder merged = LoadCheckpoint(Path("merged"));
  EXPECT_FALSE(merged->has_lora());
  const torch::Tensor expected = Logits(base_loaded);
  EXPECT_LT(MaxAbsDiff(Logits(merged), expected).item<double>(), 1e-5 * Magnitude(expected));
  EXPECT_EQ(ReadText(Path("merged") + "/tokenizer_config.json"), "{\"model_max_length\": 48}");

  // The base named explicitly; without it a base_model_name_or_path that is
  // no directory is named.
  PatchConfig(Path("adapter"), {{"base_model_name_or_path", "Qwen/Qwen2.5-0.5B"}});
  ExportMergedAdapter(Path("adapter"), Path("merged2"), Path("base"));
  EXPECT_TRUE(CheckpointExists(Path("merged2")));
  const std::string message =
      ErrorOf([&] { ExportMergedAdapter(Path("adapter"), Path("merged3")); });
  EXPECT_NE(message.find("\"base_model_name_or_path\" is \"Qwen/Qwen2.5-0.5B\""), std::string::npos)
      << message;
  EXPECT_NE(ErrorOf([&] {
              ExportMergedAdapter(Path("base"), Path("merged4"));
            }).find("not a PEFT adapter"),
            std::string::npos);
}

}  // namespace
}  // namespace kappa::model
