#include "model/model_config.h"

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace kappa::model {
namespace {

using Json = nlohmann::json;

[[noreturn]] void Fail(const std::string& what) {
  throw std::invalid_argument("ModelConfig: " + what);
}

int64_t RequiredInt(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) Fail(std::string("missing required key \"") + key + "\"");
  if (!it->is_number_integer()) Fail(std::string("key \"") + key + "\" must be an integer");
  return it->get<int64_t>();
}

template <typename T>
void Optional(const Json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  // nlohmann turns a JSON float into an integer with a plain cast, undefined
  // behaviour when it is out of range (2.7e20 as int64_t, found by
  // tests/fuzz/model_config_fuzzer): integer keys take JSON integers only.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!it->is_number_integer()) Fail(std::string("key \"") + key + "\" must be an integer");
  }
  try {
    *out = it->get<T>();
  } catch (const Json::exception& e) {
    Fail(std::string("key \"") + key + "\" has the wrong type: " + e.what());
  }
}

// HF allows a list of EOS ids; the first one is the one we emit.
void OptionalTokenId(const Json& j, const char* key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->is_array()) {
    if (it->empty() || !(*it)[0].is_number_integer()) Fail(std::string("bad \"") + key + "\"");
    *out = (*it)[0].get<int64_t>();
    return;
  }
  if (!it->is_number_integer()) Fail(std::string("key \"") + key + "\" must be an integer");
  *out = it->get<int64_t>();
}

}  // namespace

void ModelConfig::Validate() const {
  auto positive = [](int64_t v, const char* name) {
    if (v <= 0) Fail(std::string(name) + " must be > 0, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(max_position_embeddings, "max_position_embeddings");
  if (hidden_size % num_attention_heads != 0) {
    Fail("hidden_size " + std::to_string(hidden_size) + " is not divisible by num_attention_heads " +
         std::to_string(num_attention_heads));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    Fail("num_attention_heads " + std::to_string(num_attention_heads) +
         " is not divisible by num_key_value_heads " + std::to_string(num_key_value_heads));
  }
  if (head_dim() % 2 != 0) Fail("head_dim " + std::to_string(head_dim()) + " must be even for RoPE");
  if (!(rope_theta > 0)) Fail("rope_theta must be > 0");
  if (!(rms_norm_eps > 0)) Fail("rms_norm_eps must be > 0");
  auto token = [this](int64_t id, const char* name) {
    if (id < 0 || id >= vocab_size) {
      Fail(std::string(name) + " " + std::to_string(id) + " is outside the vocabulary [0, " +
           std::to_string(vocab_size) + ")");
    }
  };
  token(bos_token_id, "bos_token_id");
  token(eos_token_id, "eos_token_id");
  token(pad_token_id, "pad_token_id");
}

std::string ModelConfig::ToJson() const {
  Validate();
  Json j;
  j["architectures"] = Json::array({"LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["name"] = name;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim();
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["pad_token_id"] = pad_token_id;
  // Fixed properties of this implementation, written so HF tooling agrees.
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

ModelConfig ModelConfig::FromJson(const std::string& json_text) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    // Not only parse_error: a number too large for a double is out_of_range
    // (found by tests/fuzz/model_config_fuzzer).
    Fail(std::string("config is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) Fail("config must be a JSON object");

  std::string model_type;
  Optional(j, "model_type", &model_type);
  if (!model_type.empty() && model_type != "llama") {
    Fail("model_type \"" + model_type + "\" is not supported (expected \"llama\")");
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    Fail("rope_scaling is not supported");
  }
  std::string act = "silu";
  Optional(j, "hidden_act", &act);
  if (act != "silu") Fail("hidden_act \"" + act + "\" is not supported (expected \"silu\")");
  for (const char* bias_key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    Optional(j, bias_key, &bias);
    if (bias) Fail(std::string(bias_key) + "=true is not supported");
  }

  ModelConfig c;
  Optional(j, "name", &c.name);
  c.vocab_size = RequiredInt(j, "vocab_size");
  c.hidden_size = RequiredInt(j, "hidden_size");
  c.intermediate_size = RequiredInt(j, "intermediate_size");
  c.num_hidden_layers = RequiredInt(j, "num_hidden_layers");
  c.num_attention_heads = RequiredInt(j, "num_attention_heads");
  c.max_position_embeddings = RequiredInt(j, "max_position_embeddings");
  // HF semantics: absent means plain multi-head attention.
  c.num_key_value_heads = c.num_attention_heads;
  Optional(j, "num_key_value_heads", &c.num_key_value_heads);
  Optional(j, "rope_theta", &c.rope_theta);
  Optional(j, "rms_norm_eps", &c.rms_norm_eps);
  Optional(j, "tie_word_embeddings", &c.tie_word_embeddings);
  OptionalTokenId(j, "bos_token_id", &c.bos_token_id);
  OptionalTokenId(j, "eos_token_id", &c.eos_token_id);
  OptionalTokenId(j, "pad_token_id", &c.pad_token_id);
  // Validate first: head_dim() divides by num_attention_heads, which may be 0
  // here (found by tests/fuzz/model_config_fuzzer).
  c.Validate();
  if (auto it = j.find("head_dim"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != c.head_dim()) {
      Fail("head_dim must equal hidden_size / num_attention_heads = " + std::to_string(c.head_dim()));
    }
  }
  return c;
}

}  // namespace kappa::model
