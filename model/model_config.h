// Hyper-parameters of the Llama-style decoder, stored as a Hugging Face
// compatible config.json next to the safetensors weights.
#pragma once

#include <cstdint>
#include <string>

namespace kappa::model {

struct ModelConfig {
  std::string name = "kappa-decoder";
  int64_t vocab_size = 32;
  int64_t hidden_size = 64;        // d_model
  int64_t intermediate_size = 176; // SwiGLU inner width
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4; // < num_attention_heads: grouped KV heads
  int64_t max_position_embeddings = 64;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  // Token ids the tokenizer uses; stored in config.json like HF does.
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 0;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // Hugging Face "LlamaForCausalLM" config.json text. Throws
  // std::invalid_argument on inconsistent sizes (heads not dividing, ...).
  std::string ToJson() const;
  static ModelConfig FromJson(const std::string& json_text);  // throws std::invalid_argument
  void Validate() const;                                       // throws std::invalid_argument
};

}  // namespace kappa::model
