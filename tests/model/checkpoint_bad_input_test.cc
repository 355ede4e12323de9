// Bad model directories, one table row each: LoadCheckpoint refuses every one
// with a std::runtime_error that names the file and, where there is one, the
// tensor or the config.json field (and both shapes for a mis-shaped tensor).
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

#include "model/checkpoint.h"
#include "tests/model/test_models.h"

namespace kappa::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}
void EditJson(const fs::path& path, const std::function<void(Json&)>& edit) {
  Json j = Json::parse(ReadText(path));
  edit(j);
  WriteText(path, j.dump(2));
}
void EditWeights(const fs::path& path, const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
  auto tensors = ReadSafetensors(path.string());
  edit(tensors);
  WriteSafetensors(path.string(), tensors);
}

struct BadCheckpoint {
  const char* name;
  bool sharded;  // start from a checkpoint in shards + index
  std::function<void(const fs::path& dir)> damage;
  std::vector<std::string> fragments;  // each must appear in the error ("{dir}" = the directory)
};

const char kQ[] = "model.layers.0.self_attn.q_proj.weight";

std::vector<BadCheckpoint> Table() {
  return {
      {"truncated weights", false,
       [](const fs::path& d) {
         const std::string bytes = ReadText(d / "model.safetensors");
         WriteText(d / "model.safetensors", bytes.substr(0, bytes.size() - 100));
       },
       {"{dir}/model.safetensors", "outside", "truncated"}},
      {"header longer than the file", false,
       [](const fs::path& d) {
         std::string bytes = ReadText(d / "model.safetensors");
         const uint64_t n = bytes.size();
         std::memcpy(bytes.data(), &n, 8);
         WriteText(d / "model.safetensors", bytes);
       },
       {"{dir}/model.safetensors", "exceeds the file size"}},
      {"unsupported dtype on disk", false,
       [](const fs::path& d) {
         EditWeights(d / "model.safetensors", [](auto& t) { t["extra.f64"] = torch::zeros({2}); });
         std::string bytes = ReadText(d / "model.safetensors");
         const size_t at = bytes.find("\"F32\"", bytes.find("\"extra.f64\""));
         ASSERT_NE(at, std::string::npos);
         bytes.replace(at + 1, 3, "F64");
         WriteText(d / "model.safetensors", bytes);
       },
       {"{dir}/model.safetensors", "extra.f64", "unsupported dtype \"F64\""}},
      {"tensor of the wrong shape", false,
       [](const fs::path& d) {
         EditWeights(d / "model.safetensors", [](auto& t) { t[kQ] = torch::zeros({32, 16}); });
       },
       {"{dir}/model.safetensors", kQ, "expected [32, 32], got [32, 16]"}},
      {"missing tensor", false,
       [](const fs::path& d) {
         EditWeights(d / "model.safetensors", [](auto& t) { t.erase("model.norm.weight"); });
       },
       {"{dir}/model.safetensors", "missing [model.norm.weight]"}},
      {"unexpected tensor", false,
       [](const fs::path& d) {
         EditWeights(d / "model.safetensors",
                     [](auto& t) { t["model.layers.0.self_attn.q_proj.bias"] = torch::zeros({32}); });
       },
       {"{dir}/model.safetensors", "unexpected [model.layers.0.self_attn.q_proj.bias]"}},
      {"unknown architecture", false,
       [](const fs::path& d) {
         EditJson(d / "config.json", [](Json& j) {
           j["architectures"] = {"GPT2LMHeadModel"};
           j.erase("model_type");
         });
       },
       {"{dir}/config.json", "architectures \"GPT2LMHeadModel\" is not supported"}},
      {"architecture and model_type disagree", false,
       [](const fs::path& d) { EditJson(d / "config.json", [](Json& j) { j["model_type"] = "qwen2"; }); },
       {"{dir}/config.json", "LlamaForCausalLM", "qwen2", "disagree"}},
      {"unknown rope_scaling type", false,
       [](const fs::path& d) {
         EditJson(d / "config.json", [](Json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; });
       },
       {"{dir}/config.json", "rope_scaling.rope_type \"yarn\" is not implemented"}},
      {"sliding-window attention", false,
       [](const fs::path& d) { EditJson(d / "config.json", [](Json& j) { j["use_sliding_window"] = true; }); },
       {"{dir}/config.json", "use_sliding_window"}},
      {"sliding layer types", false,
       [](const fs::path& d) {
         EditJson(d / "config.json", [](Json& j) { j["layer_types"] = {"full_attention", "sliding_attention"}; });
       },
       {"{dir}/config.json", "layer_types", "sliding_attention"}},
      {"mixture of experts", false,
       [](const fs::path& d) { EditJson(d / "config.json", [](Json& j) { j["num_experts"] = 8; }); },
       {"{dir}/config.json", "num_experts"}},
      {"llama3 rope without original length", false,
       [](const fs::path& d) {
         EditJson(d / "config.json", [](Json& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; });
       },
       {"{dir}/config.json", "rope_scaling.original_max_position_embeddings"}},
      {"index names a missing shard", true,
       [](const fs::path& d) {
         const Json index = Json::parse(ReadText(d / "model.safetensors.index.json"));
         fs::remove(d / index["weight_map"]["model.norm.weight"].get<std::string>());
       },
       {"{dir}/model.safetensors.index.json", "is in shard model-0000", "does not exist"}},
      {"index maps a tensor to a shard without it", true,
       [](const fs::path& d) {
         EditJson(d / "model.safetensors.index.json", [](Json& j) {
           j["weight_map"]["model.norm.weight"] = j["weight_map"]["lm_head.weight"];  // the first shard
         });
       },
       {"{dir}/model.safetensors.index.json", "model.norm.weight", "does not hold it"}},
      {"index lacks a tensor a shard holds", true,
       [](const fs::path& d) {
         EditJson(d / "model.safetensors.index.json", [](Json& j) { j["weight_map"].erase(kQ); });
       },
       {"{dir}/model.safetensors.index.json", kQ, "does not map"}},
      {"index without weight_map", true,
       [](const fs::path& d) { WriteText(d / "model.safetensors.index.json", "{\"metadata\": {}}"); },
       {"{dir}/model.safetensors.index.json", "weight_map"}},
  };
}

TEST(CheckpointBadInput, EachIsRefusedNamingFileAndTensorOrField) {
  const fs::path root = fs::temp_directory_path() / ("kappa_bad_ckpt_" + std::to_string(::getpid()));
  Decoder model = testing::TinyDecoder();
  int row = 0;
  for (const BadCheckpoint& bad : Table()) {
    SCOPED_TRACE(bad.name);
    const fs::path dir = root / ("row" + std::to_string(row++));
    SaveOptions options;
    if (bad.sharded) options.max_shard_bytes = 30'000;  // three shards of the tiny model
    SaveCheckpoint(dir.string(), model, options);
    ASSERT_NO_THROW(LoadCheckpoint(dir.string())) << "the undamaged checkpoint must load";
    bad.damage(dir);
    try {
      LoadCheckpoint(dir.string());
      ADD_FAILURE() << "accepted";
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      for (std::string fragment : bad.fragments) {
        if (auto at = fragment.find("{dir}"); at != std::string::npos) fragment.replace(at, 5, dir.string());
        EXPECT_NE(message.find(fragment), std::string::npos) << "missing \"" << fragment << "\" in: " << message;
      }
    }
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace kappa::model
