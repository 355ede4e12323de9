// Hyper-parameters of the decoder, read from and written as a Hugging Face
// config.json. Three architectures share one implementation: Llama, Qwen2 and
// Qwen3 differ only in which projections carry a bias, in Qwen3's per-head
// q/k RMSNorm and in how head_dim and RoPE frequencies are set.
//
// Every config.json field that changes the math is either implemented or
// refused by name (an unknown rope_scaling type, sliding-window attention, MoE
// fields, ...); fields that do not (transformers_version, use_cache, ...) are
// kept verbatim so a checkpoint kappa writes carries the input's fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kappa::model {

enum class Architecture {
  kLlama,  // LlamaForCausalLM: attention_bias on q/k/v/o, mlp_bias on the MLP
  kQwen2,  // Qwen2ForCausalLM: bias on q/k/v always, none on o_proj
  kQwen3,  // Qwen3ForCausalLM: attention_bias on q/k/v/o; RMSNorm q_norm/k_norm per head
};
const char* ArchitectureName(Architecture a);  // "LlamaForCausalLM", ...
const char* ModelType(Architecture a);         // "llama", "qwen2", "qwen3"

// rope_scaling of config.json (HF modeling_rope_utils.py).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  // llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string name = "kappa-decoder";
  int64_t vocab_size = 32;
  int64_t hidden_size = 64;        // d_model
  int64_t intermediate_size = 176; // SwiGLU inner width
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4; // < num_attention_heads: grouped KV heads
  // config.json "head_dim"; 0 = hidden_size / num_attention_heads.
  int64_t explicit_head_dim = 0;
  int64_t max_position_embeddings = 64;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Llama, Qwen3: q/k/v/o_proj.bias (Qwen2 ignores it)
  bool mlp_bias = false;        // Llama: gate/up/down_proj.bias
  // Token ids the tokenizer uses; stored in config.json like HF does.
  int64_t bos_token_id = 1;
  // config.json "eos_token_id": one id or a list (Qwen2.5-Instruct, Llama 3.1),
  // kept whole, in the file's order; never empty. Generation stops at the
  // ids model::StopTokenIds gives (generation_config.json's when the model
  // directory has one, else these).
  std::vector<int64_t> eos_token_ids = {2};
  int64_t pad_token_id = 0;
  // config.json "torch_dtype": the dtype of the weights in the directory.
  std::string torch_dtype = "float32";
  // The config.json object this config was read from ("" for kappa's own
  // models). ToJson writes it back with only torch_dtype updated, so every
  // field the input carried survives a load/save round trip.
  std::string source_json;
  // The directory LoadCheckpoint read this config from ("" otherwise); not
  // part of config.json. SaveCheckpoint copies its tokenizer files and
  // generation_config.json into every checkpoint it writes.
  std::string source_dir;

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  bool qkv_bias() const { return architecture == Architecture::kQwen2 || attention_bias; }
  bool o_proj_bias() const { return architecture != Architecture::kQwen2 && attention_bias; }
  bool qk_norm() const { return architecture == Architecture::kQwen3; }

  // Hugging Face config.json text. Throws std::invalid_argument on
  // inconsistent sizes, or when the fields were changed after FromJson so
  // that source_json no longer describes them.
  std::string ToJson() const;
  // Throws std::invalid_argument naming the key for malformed values and for
  // fields that change the math but are not implemented.
  static ModelConfig FromJson(const std::string& json_text);
  void Validate() const;  // throws std::invalid_argument
};

// True if the two configs describe the same network (every field above but
// name, torch_dtype, source_json and source_dir).
bool SameNetwork(const ModelConfig& a, const ModelConfig& b);

}  // namespace kappa::model
