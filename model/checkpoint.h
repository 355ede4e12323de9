// Checkpoints as a directory holding `model.safetensors` (weights) and
// `config.json` (ModelConfig, Hugging Face Llama style).
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

#include "model/model_config.h"
#include "model/transformer.h"

namespace kappa::model {

// safetensors: 8-byte little-endian header length, JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, raw bytes.
// Supports F32, BF16, F16, I32, I64. Throws std::runtime_error naming the file
// on any malformed input (bad header, offsets out of range, unknown dtype).
void WriteSafetensors(const std::string& path,
                      const std::map<std::string, torch::Tensor>& tensors);
std::map<std::string, torch::Tensor> ReadSafetensors(const std::string& path);

// Writes atomically: files go to `<dir>.tmp-<pid>` first, are fsynced, then
// the directory is renamed over `dir`.
void SaveCheckpoint(const std::string& dir, Decoder& model);
// Builds a Decoder from config.json and loads its weights; every parameter
// must be present with the right shape (std::runtime_error otherwise).
Decoder LoadCheckpoint(const std::string& dir);
bool CheckpointExists(const std::string& dir);

// Named parameters as Hugging Face names (the live parameter tensors, not
// copies; with tied embeddings there is no "lm_head.weight", as in HF), and
// loading from such a map: values are copied (dtype/device converted) into
// the existing parameters after checking that no name is missing or
// unexpected and every shape matches; on error nothing is modified.
// "lm_head.weight" (when tied) and "*.rotary_emb.inv_freq" are ignored.
std::map<std::string, torch::Tensor> NamedWeights(Decoder& model);
void LoadWeights(Decoder& model, const std::map<std::string, torch::Tensor>& weights);

}  // namespace kappa::model
