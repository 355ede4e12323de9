// Small decoders shared by the model tests.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include "model/model_config.h"
#include "model/transformer.h"

namespace kappa::model::testing {

inline ModelConfig TinyConfig(int64_t kv_heads = 4, bool tied = false) {
  ModelConfig c;
  c.vocab_size = 21;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = 48;
  c.tie_word_embeddings = tied;
  return c;
}

// Seeded so every test sees the same weights; the init (std 0.02) gives
// nearly uniform logits, so the weights are scaled up to make the
// distributions peaked enough that argmax ties cannot occur.
inline Decoder TinyDecoder(int64_t kv_heads = 4, bool tied = false, uint64_t seed = 7,
                           double scale = 10.0) {
  torch::manual_seed(seed);
  Decoder model(TinyConfig(kv_heads, tied));
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().mul_(scale);
  }
  return model;
}

inline torch::Tensor MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max();
}

}  // namespace kappa::model::testing
