// Test helpers: a tiny decoder and its weights cut into PolicyChunks the way
// the learner publishes them.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kappa/v1/learner.pb.h"
#include "model/checkpoint.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "services/torch_tensor_codec.h"

namespace kappa::rollout::testing {

inline model::ModelConfig TinyConfig() {
  model::ModelConfig config;
  config.vocab_size = model::CharTokenizer().vocab_size();
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 2;
  config.max_position_embeddings = 48;
  return config;
}

inline model::Decoder MakeDecoder(const model::ModelConfig& config, uint64_t seed) {
  torch::manual_seed(seed);
  model::Decoder decoder(config);
  decoder->eval();
  return decoder;
}

// Every parameter, split into chunks of at most chunk_bytes (so large ones span several).
inline std::vector<kappa::v1::PolicyChunk> ChunkWeights(int64_t version, model::Decoder& decoder,
                                                        int64_t chunk_bytes = 1000) {
  std::vector<kappa::v1::PolicyChunk> chunks;
  const std::map<std::string, torch::Tensor> weights = model::NamedWeights(decoder);
  for (const auto& [name, parameter] : weights) {
    const torch::Tensor tensor = parameter.detach().to(torch::kCPU).contiguous();
    const char* bytes = static_cast<const char*>(tensor.data_ptr());
    const int64_t total = tensor.numel() * static_cast<int64_t>(tensor.element_size());
    for (int64_t offset = 0; offset < total; offset += chunk_bytes) {
      kappa::v1::PolicyChunk chunk;
      chunk.set_version(version);
      if (chunks.empty()) chunk.set_model_config_json(decoder->config().ToJson());
      chunk.set_name(name);
      chunk.set_dtype(services::ToWireDType(tensor.scalar_type()));
      for (int64_t dim : tensor.sizes()) chunk.add_shape(dim);
      chunk.set_byte_offset(offset);
      chunk.set_data(bytes + offset, static_cast<size_t>(std::min(chunk_bytes, total - offset)));
      chunk.set_num_parameters(static_cast<int32_t>(weights.size()));
      chunks.push_back(std::move(chunk));
    }
  }
  chunks.back().set_last_of_version(true);
  return chunks;
}

// log p(response_t | prefix) under softmax(logits / temperature), by a plain
// full-sequence forward (no KV cache), as the learner would compute it.
inline std::vector<float> ReferenceLogprobs(model::Decoder& decoder,
                                            const std::vector<int64_t>& prompt,
                                            const std::vector<int64_t>& response,
                                            double temperature) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), response.begin(), response.end());
  const torch::Tensor tokens = torch::tensor(all, torch::kInt64).unsqueeze(0);
  const torch::Tensor logits = decoder->forward(tokens)[0];  // [L, V]
  const torch::Tensor logp = torch::log_softmax(logits / temperature, -1);
  std::vector<float> out;
  for (size_t t = 0; t < response.size(); ++t) {
    out.push_back(logp[static_cast<int64_t>(prompt.size() + t - 1)][response[t]].item<float>());
  }
  return out;
}

}  // namespace kappa::rollout::testing
