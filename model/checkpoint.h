// Model checkpoints as Hugging Face model directories: `config.json`, the
// weights as `model.safetensors` or shards + `model.safetensors.index.json`,
// and the source model's tokenizer files and generation_config.json. What
// kappa writes loads in transformers' AutoModelForCausalLM.from_pretrained
// and vLLM as it is; what they write (Llama, Qwen2, Qwen3) loads here.
#pragma once

#include <torch/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/transformer.h"

namespace kappa::model {

struct LoadOptions {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;  // of the parameters, whatever is on disk
};

struct SaveOptions {
  // Weights are written in the parameters' dtype unless this is set
  // (config.json's torch_dtype says which).
  std::optional<torch::ScalarType> dtype;
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
};

// Writes atomically: files go to `<dir>.tmp-<pid>` first, are fsynced, then
// the directory is renamed over `dir`. Copies the companion files
// (CompanionFiles()) of model->config().source_dir when it is set.
void SaveCheckpoint(const std::string& dir, Decoder& model, const SaveOptions& options = {});
// Builds a Decoder from config.json and copies every tensor once from the
// memory-mapped safetensors into its parameter (converted to options.dtype on
// options.device); config().source_dir is `dir`. Errors (std::runtime_error)
// name the file and, for weights, the tensor and both shapes: missing,
// unexpected or mis-shaped tensors, a shard the index names but that is
// absent, unimplemented config fields.
Decoder LoadCheckpoint(const std::string& dir, const LoadOptions& options = {});
// config.json plus model.safetensors or model.safetensors.index.json.
bool CheckpointExists(const std::string& dir);
// The config alone (std::runtime_error naming the file).
ModelConfig ReadModelConfig(const std::string& dir);

// Files of a HF model directory that travel with its weights, when present:
// tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.json,
// merges.txt, tokenizer.model, added_tokens.json, chat_template.jinja,
// generation_config.json.
const std::vector<std::string>& CompanionFiles();

// Named parameters as Hugging Face names (the live parameter tensors, not
// copies; with tied embeddings there is no "lm_head.weight", as in HF), and
// loading from such a map: values are copied (dtype/device converted) into
// the existing parameters after checking that no name is missing or
// unexpected and every shape matches; on error nothing is modified.
// "lm_head.weight" (when tied) and "*.rotary_emb.inv_freq" are ignored.
// LoRA adapters (model/lora.h) are not weights: NamedWeights and LoadWeights
// leave them out, NamedAdapters and LoadAdapters carry them.
std::map<std::string, torch::Tensor> NamedWeights(Decoder& model);
void LoadWeights(Decoder& model, const std::map<std::string, torch::Tensor>& weights);

// The adapters' parameters (live tensors) by kappa's names,
// "model.layers.N.<module>.<proj>.lora_A.weight" and "...lora_B.weight";
// empty without adapters.
std::map<std::string, torch::Tensor> NamedAdapters(Decoder& model);
// True for an adapter's parameter name.
bool IsAdapterName(const std::string& name);
// Copies `adapters` into the model's adapters (dtype/device converted) after
// checking that none is missing or unexpected and every shape matches
// (std::runtime_error naming the tensor and both shapes; nothing modified).
// REQUIRES: model->has_lora().
void LoadAdapters(Decoder& model, const std::map<std::string, torch::Tensor>& adapters);

}  // namespace kappa::model
