// LoRA adapters as Hugging Face PEFT saves them (peft/utils/save_and_load.py,
// peft/tuners/lora/config.py), so an adapter kappa trains loads in PEFT and
// vLLM's LoRA loader, and one trained there resumes here:
//   <dir>/adapter_config.json        {"peft_type": "LORA", "task_type":
//                                     "CAUSAL_LM", "r", "lora_alpha",
//                                     "lora_dropout", "target_modules",
//                                     "use_rslora", "base_model_name_or_path",
//                                     "bias": "none", ...}
//   <dir>/adapter_model.safetensors  "base_model.model.<HF name>.lora_A.weight"
//                                     [r, in] and "...lora_B.weight" [out, r]
// What kappa does not implement (DoRA, bias training, fan_in_fan_out,
// modules_to_save, per-layer rank or alpha patterns, adapters on lm_head or
// the embeddings, other PEFT types) is refused by name, never approximated.
// Errors are std::runtime_error naming the file and the field or tensor.
#pragma once

#include <torch/types.h>

#include <map>
#include <optional>
#include <string>

#include "model/checkpoint.h"
#include "model/lora.h"
#include "model/transformer.h"

namespace kappa::model {

inline constexpr char kAdapterConfigFile[] = "adapter_config.json";
inline constexpr char kAdapterWeightsFile[] = "adapter_model.safetensors";

// adapter_config.json's text for `config` on the base `base_model_name_or_path`.
std::string AdapterConfigJson(const LoraConfig& config, const std::string& base_model_name_or_path);

struct AdapterConfig {
  LoraConfig lora;
  std::string base_model_name_or_path;
};
// Parses adapter_config.json's text; `file` names it in errors. Throws
// std::runtime_error naming the field for a malformed or unimplemented one.
AdapterConfig ParseAdapterConfig(const std::string& json_text, const std::string& file);

// True when `dir` holds adapter_config.json.
bool AdapterExists(const std::string& dir);

// `dir`'s adapter_config.json, read and parsed: std::runtime_error naming
// the file when it cannot be read, else as ParseAdapterConfig.
AdapterConfig ReadAdapterConfig(const std::string& dir);

// The first of r, lora_alpha, use_rslora and target_modules (PEFT's names)
// on which two adapter configs compute differently, with each side's value
// as adapter_config.json writes it; nullopt when they agree.
struct AdapterConfigDifference {
  std::string field;
  std::string ours;
  std::string theirs;
};
std::optional<AdapterConfigDifference> FirstDifference(const LoraConfig& ours,
                                                       const LoraConfig& theirs);

// Writes `model`'s adapters (REQUIRES: model->has_lora(), enabled with
// `config`) as a PEFT adapter directory, atomically as SaveCheckpoint does,
// in float32.
void SaveAdapter(const std::string& dir, Decoder& model, const LoraConfig& config,
                 const std::string& base_model_name_or_path);

// Reads `dir`'s adapter into `model`: enables LoRA with the directory's
// config when the model has none (else the configs must agree: rank, alpha,
// rsLoRA, targets), then copies every tensor, checking that none is missing
// or unexpected and every shape fits the base's projection. On error the
// model's adapter values are unchanged. Returns the directory's config.
AdapterConfig LoadAdapter(const std::string& dir, Decoder& model);

// A model directory, or an adapter directory on top of its base: the base is
// `base_dir` when given, else the adapter's base_model_name_or_path (a local
// directory). The returned model has the adapter attached, unmerged. For a
// model directory (no adapter_config.json) `base_dir` is not used.
Decoder LoadModelOrAdapter(const std::string& dir, const LoadOptions& options = {},
                           const std::string& base_dir = "");

// Everything a policy version carries: NamedWeights and NamedAdapters.
inline std::map<std::string, torch::Tensor> PolicyTensors(Decoder& model) {
  std::map<std::string, torch::Tensor> all = NamedWeights(model);
  all.merge(NamedAdapters(model));
  return all;
}

// Moves `model`'s adapters to `dtype`. A rollout worker runs them in its
// model's dtype (as vLLM does): float32 adapters on a bfloat16 model send
// their matmuls down another BLAS path that competes with the model's
// threads (bench/README.md, LoRA). The learner keeps them float32.
inline void CastAdapters(Decoder& model, torch::ScalarType dtype) {
  for (const auto& module : model->named_modules()) {
    const std::string& name = module.key();
    const auto ends_with = [&](const std::string& tail) {
      return name.size() > tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends_with(".lora_A") || ends_with(".lora_B")) module.value()->to(dtype);
  }
}

// NamedWeights(model) with every adapted projection's weight replaced by
// W + scaling · B · A (new tensors in W's dtype, computed in float32): the
// weights of the plain model that computes what `model` does.
std::map<std::string, torch::Tensor> MergedWeights(Decoder& model);

// `kappa export --merge`: the adapter directory `adapter_dir` on its base
// (as LoadModelOrAdapter finds it) merged (MergedWeights) and written to
// `out_dir` as a plain Hugging Face model directory by SaveCheckpoint, in the
// base's torch_dtype and with the base's companion (tokenizer) files.
// Returns the base directory used. std::runtime_error naming the file.
std::string ExportMergedAdapter(const std::string& adapter_dir, const std::string& out_dir,
                                const std::string& base_dir = "");

}  // namespace kappa::model
