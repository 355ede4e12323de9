#include "model/model_config.h"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
void Optional(const Json& j, const std::string& key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  // nlohmann turns a JSON float into an integer with a plain cast, undefined
  // behaviour when it is out of range (2.7e20 as int64_t, found by
  // tests/fuzz/model_config_fuzzer): integer keys take JSON integers only.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!it->is_number_integer()) Fail("key \"" + key + "\" must be an integer");
  }
  try {
    *out = it->get<T>();
  } catch (const Json::exception& e) {
    Fail("key \"" + key + "\" has the wrong type: " + e.what());
  }
}

// bos/pad: HF allows a list there too; its first id is the one we use.
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

// "eos_token_id": an integer or a non-empty list of integers (HF allows both).
void OptionalTokenIds(const Json& j, const char* key, std::vector<int64_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->is_number_integer()) {
    *out = {it->get<int64_t>()};
    return;
  }
  if (!it->is_array() || it->empty()) {
    Fail(std::string("key \"") + key + "\" must be an integer or a non-empty list of integers");
  }
  std::vector<int64_t> ids;
  for (const Json& id : *it) {
    if (!id.is_number_integer()) {
      Fail(std::string("key \"") + key + "\" has a non-integer entry " + id.dump());
    }
    ids.push_back(id.get<int64_t>());
  }
  *out = std::move(ids);
}

struct ArchitectureEntry {
  Architecture architecture;
  const char* class_name;
  const char* model_type;
};
constexpr ArchitectureEntry kArchitectures[] = {
    {Architecture::kLlama, "LlamaForCausalLM", "llama"},
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2"},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3"},
};

const ArchitectureEntry& EntryOf(Architecture a) {
  for (const auto& e : kArchitectures) {
    if (e.architecture == a) return e;
  }
  Fail("unknown architecture enum value");
}

std::string SupportedArchitectures() {
  std::string s;
  for (const auto& e : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(e.class_name);
  return s;
}

// "architectures" (its single entry) and "model_type" must name the same
// supported architecture; either may be absent (kappa's oldest checkpoints
// and hand-written configs), neither means Llama.
Architecture ParseArchitecture(const Json& j) {
  const ArchitectureEntry* by_class = nullptr;
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 1 || !(*it)[0].is_string()) {
      Fail("\"architectures\" must be a list of one class name");
    }
    const std::string name = (*it)[0].get<std::string>();
    for (const auto& e : kArchitectures) {
      if (name == e.class_name) by_class = &e;
    }
    if (by_class == nullptr) {
      Fail("architectures \"" + name + "\" is not supported (supported: " +
           SupportedArchitectures() + ")");
    }
  }
  std::string model_type;
  Optional(j, "model_type", &model_type);
  const ArchitectureEntry* by_type = nullptr;
  for (const auto& e : kArchitectures) {
    if (model_type == e.model_type) by_type = &e;
  }
  if (!model_type.empty() && by_type == nullptr) {
    Fail("model_type \"" + model_type + "\" is not supported (expected llama, qwen2 or qwen3)");
  }
  if (by_class != nullptr && by_type != nullptr && by_class != by_type) {
    Fail(std::string("architectures \"") + by_class->class_name + "\" and model_type \"" +
         model_type + "\" disagree");
  }
  if (by_class != nullptr) return by_class->architecture;
  if (by_type != nullptr) return by_type->architecture;
  return Architecture::kLlama;
}

// rope_scaling (transformers 4.x) or rope_parameters (5.x); "type" is the
// older spelling of "rope_type". HF modeling_rope_utils.py defines each type.
void ParseRope(const Json& j, ModelConfig* c) {
  Optional(j, "rope_theta", &c->rope_theta);
  const char* key = "rope_scaling";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    key = "rope_parameters";
    it = j.find(key);
    if (it == j.end() || it->is_null()) return;
  }
  const std::string where = key;
  if (!it->is_object()) Fail("\"" + where + "\" must be an object or null");
  const Json& r = *it;
  Optional(r, "rope_theta", &c->rope_theta);
  std::string type = "default";
  Optional(r, "type", &type);
  Optional(r, "rope_type", &type);
  if (type == "default") return;
  if (type == "linear") {
    c->rope_scaling.type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    c->rope_scaling.type = RopeScaling::Type::kLlama3;
    Optional(r, "low_freq_factor", &c->rope_scaling.low_freq_factor);
    Optional(r, "high_freq_factor", &c->rope_scaling.high_freq_factor);
    if (r.find("original_max_position_embeddings") == r.end()) {
      Fail(where + ".original_max_position_embeddings is required for rope_type \"llama3\"");
    }
    Optional(r, "original_max_position_embeddings",
             &c->rope_scaling.original_max_position_embeddings);
  } else {
    Fail(where + ".rope_type \"" + type +
         "\" is not implemented (supported: default, linear, llama3)");
  }
  if (r.find("factor") == r.end()) Fail(where + ".factor is required for rope_type \"" + type + "\"");
  Optional(r, "factor", &c->rope_scaling.factor);
}

// Fields that would change the forward pass and that kappa does not
// implement: refused by name rather than silently ignored.
void RefuseUnimplemented(const Json& j) {
  auto truthy = [&](const char* key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return false;
    if (it->is_boolean()) return it->get<bool>();
    if (it->is_number()) return it->get<double>() != 0;
    return true;
  };
  if (truthy("use_sliding_window")) Fail("use_sliding_window=true (sliding-window attention) is not implemented");
  for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts",
                          "moe_intermediate_size", "num_experts_per_tok"}) {
    if (truthy(moe)) Fail(std::string(moe) + " (mixture of experts) is not implemented");
  }
  for (const char* key : {"quantization_config", "final_logit_softcapping", "attn_logit_softcapping"}) {
    if (truthy(key)) Fail(std::string(key) + " is not implemented");
  }
  if (truthy("attention_dropout")) Fail("attention_dropout != 0 is not implemented");
  if (auto it = j.find("partial_rotary_factor"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 1.0) Fail("partial_rotary_factor != 1 is not implemented");
  }
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) Fail("\"layer_types\" must be a list");
    for (const auto& t : *it) {
      if (t != "full_attention") {
        Fail("layer_types entry " + t.dump() + " is not implemented (only \"full_attention\")");
      }
    }
  }
  std::string act = "silu";
  Optional(j, "hidden_act", &act);
  if (act != "silu") Fail("hidden_act \"" + act + "\" is not supported (expected \"silu\")");
}

const char* RopeTypeName(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::kLinear: return "linear";
    case RopeScaling::Type::kLlama3: return "llama3";
    case RopeScaling::Type::kNone: break;
  }
  return "default";
}

// config.json for a model that was not read from one (kappa's own shapes).
Json GeneratedJson(const ModelConfig& c) {
  const ArchitectureEntry& arch = EntryOf(c.architecture);
  Json j;
  j["architectures"] = Json::array({arch.class_name});
  j["model_type"] = arch.model_type;
  j["name"] = c.name;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim();
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == RopeScaling::Type::kNone) {
    j["rope_scaling"] = nullptr;
  } else {
    Json r = {{"rope_type", RopeTypeName(c.rope_scaling.type)}, {"factor", c.rope_scaling.factor}};
    if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
      r["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      r["high_freq_factor"] = c.rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id;
  // One id as HF writes one, a list as a list.
  j["eos_token_id"] =
      c.eos_token_ids.size() == 1 ? Json(c.eos_token_ids[0]) : Json(c.eos_token_ids);
  j["pad_token_id"] = c.pad_token_id;
  // Fixed properties of this implementation, written so HF tooling agrees.
  j["hidden_act"] = "silu";
  if (c.architecture == Architecture::kQwen2) {
    j["use_sliding_window"] = false;
  } else {
    j["attention_bias"] = c.attention_bias;
  }
  if (c.architecture == Architecture::kLlama) j["mlp_bias"] = c.mlp_bias;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  return j;
}

}  // namespace

const char* ArchitectureName(Architecture a) { return EntryOf(a).class_name; }
const char* ModelType(Architecture a) { return EntryOf(a).model_type; }

bool SameNetwork(const ModelConfig& a, const ModelConfig& b) {
  const RopeScaling& ra = a.rope_scaling;
  const RopeScaling& rb = b.rope_scaling;
  return a.architecture == b.architecture && a.vocab_size == b.vocab_size &&
         a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.head_dim() == b.head_dim() &&
         a.max_position_embeddings == b.max_position_embeddings && a.rope_theta == b.rope_theta &&
         ra.type == rb.type && ra.factor == rb.factor && ra.low_freq_factor == rb.low_freq_factor &&
         ra.high_freq_factor == rb.high_freq_factor &&
         ra.original_max_position_embeddings == rb.original_max_position_embeddings &&
         a.rms_norm_eps == b.rms_norm_eps && a.tie_word_embeddings == b.tie_word_embeddings &&
         a.qkv_bias() == b.qkv_bias() && a.o_proj_bias() == b.o_proj_bias() &&
         a.mlp_bias == b.mlp_bias && a.bos_token_id == b.bos_token_id &&
         a.eos_token_ids == b.eos_token_ids && a.pad_token_id == b.pad_token_id;
}

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
  if (explicit_head_dim < 0) Fail("head_dim must be > 0, got " + std::to_string(explicit_head_dim));
  if (explicit_head_dim == 0 && hidden_size % num_attention_heads != 0) {
    Fail("hidden_size " + std::to_string(hidden_size) + " is not divisible by num_attention_heads " +
         std::to_string(num_attention_heads) + " (and config.json gives no head_dim)");
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    Fail("num_attention_heads " + std::to_string(num_attention_heads) +
         " is not divisible by num_key_value_heads " + std::to_string(num_key_value_heads));
  }
  if (head_dim() % 2 != 0) Fail("head_dim " + std::to_string(head_dim()) + " must be even for RoPE");
  if (!(rope_theta > 0)) Fail("rope_theta must be > 0");
  if (!(rms_norm_eps > 0)) Fail("rms_norm_eps must be > 0");
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0)) {
    Fail("rope_scaling.factor must be > 0");
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
        !(rope_scaling.low_freq_factor > 0)) {
      Fail("rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    }
    positive(rope_scaling.original_max_position_embeddings,
             "rope_scaling.original_max_position_embeddings");
  }
  auto token = [this](int64_t id, const char* name) {
    if (id < 0 || id >= vocab_size) {
      Fail(std::string(name) + " " + std::to_string(id) + " is outside the vocabulary [0, " +
           std::to_string(vocab_size) + ")");
    }
  };
  token(bos_token_id, "bos_token_id");
  if (eos_token_ids.empty()) Fail("eos_token_id must name at least one id");
  for (int64_t id : eos_token_ids) token(id, "eos_token_id");
  token(pad_token_id, "pad_token_id");
}

std::string ModelConfig::ToJson() const {
  Validate();
  if (source_json.empty()) {
    Json j = GeneratedJson(*this);
    j["torch_dtype"] = torch_dtype;
    return j.dump(2) + "\n";
  }
  Json j = Json::parse(source_json);
  if (j.contains("dtype")) j["dtype"] = torch_dtype;  // transformers 5.x spelling
  j["torch_dtype"] = torch_dtype;
  const std::string text = j.dump(2) + "\n";
  if (!SameNetwork(FromJson(text), *this)) {
    Fail("the config was changed after it was read from config.json; clear source_json to "
         "write a generated one");
  }
  return text;
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

  ModelConfig c;
  c.architecture = ParseArchitecture(j);
  RefuseUnimplemented(j);
  ParseRope(j, &c);
  Optional(j, "name", &c.name);
  c.vocab_size = RequiredInt(j, "vocab_size");
  c.hidden_size = RequiredInt(j, "hidden_size");
  c.intermediate_size = RequiredInt(j, "intermediate_size");
  c.num_hidden_layers = RequiredInt(j, "num_hidden_layers");
  c.num_attention_heads = RequiredInt(j, "num_attention_heads");
  c.max_position_embeddings = RequiredInt(j, "max_position_embeddings");
  // HF defaults when a key is absent: LlamaConfig means plain multi-head
  // attention; Qwen2Config/Qwen3Config default to 32 KV heads, and
  // Qwen3Config to head_dim 128 (configuration_qwen2.py, configuration_qwen3.py).
  const bool qwen = c.architecture != Architecture::kLlama;
  c.num_key_value_heads = qwen ? 32 : c.num_attention_heads;
  Optional(j, "num_key_value_heads", &c.num_key_value_heads);
  if (c.architecture == Architecture::kQwen3) c.explicit_head_dim = 128;
  Optional(j, "head_dim", &c.explicit_head_dim);
  Optional(j, "rms_norm_eps", &c.rms_norm_eps);
  Optional(j, "tie_word_embeddings", &c.tie_word_embeddings);
  if (c.architecture != Architecture::kQwen2) Optional(j, "attention_bias", &c.attention_bias);
  if (c.architecture == Architecture::kLlama) {
    Optional(j, "mlp_bias", &c.mlp_bias);
  } else if (auto it = j.find("mlp_bias"); it != j.end() && *it == true) {
    Fail(std::string("mlp_bias=true is not part of ") + ArchitectureName(c.architecture));
  }
  OptionalTokenId(j, "bos_token_id", &c.bos_token_id);
  OptionalTokenIds(j, "eos_token_id", &c.eos_token_ids);
  OptionalTokenId(j, "pad_token_id", &c.pad_token_id);
  Optional(j, "dtype", &c.torch_dtype);
  Optional(j, "torch_dtype", &c.torch_dtype);
  if (c.explicit_head_dim > 0 && c.hidden_size > 0 && c.num_attention_heads > 0 &&
      c.hidden_size % c.num_attention_heads == 0 &&
      c.explicit_head_dim == c.hidden_size / c.num_attention_heads) {
    c.explicit_head_dim = 0;  // the default, spelled out
  }
  c.Validate();
  c.source_json = j.dump();
  return c;
}

}  // namespace kappa::model
