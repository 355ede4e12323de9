// Qwen2.5-0.5B's and -1.5B's config.json shapes (real vocabulary, tied
// embeddings), for the benchmarks that time real-size models with random
// weights.
#pragma once

#include <cstdint>

#include "model/model_config.h"

namespace kappa::bench {

// Qwen2.5-0.5B with `layers` decoder layers (24 in the real model).
inline model::ModelConfig Qwen25HalfB(int64_t layers = 24) {
  model::ModelConfig c;
  c.architecture = model::Architecture::kQwen2;
  c.name = "qwen2.5-0.5b-shape";
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32768;
  c.rope_theta = 1000000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151643};
  c.pad_token_id = 151643;
  return c;
}

// Qwen2.5-1.5B: the 0.5B config with its own width, depth and heads.
inline model::ModelConfig Qwen25OneAndHalfB() {
  model::ModelConfig c = Qwen25HalfB(28);
  c.name = "qwen2.5-1.5b-shape";
  c.hidden_size = 1536;
  c.intermediate_size = 8960;
  c.num_attention_heads = 12;
  return c;
}

}  // namespace kappa::bench
