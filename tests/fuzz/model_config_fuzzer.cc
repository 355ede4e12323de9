// Fuzzes the config.json reader (model/model_config.h), which is where a
// checkpoint's architecture (Llama, Qwen2, Qwen3), RoPE scaling, biases,
// head_dim, tokenizer ids (bos/eos/pad) and shape come from. The input is
// the JSON text. Bad configs are std::invalid_argument (the documented
// contract); any other exception, a crash, or an accepted config that does
// not survive ToJson -> FromJson is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "model/model_config.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kappa::model::ModelConfig;
  const std::string text(reinterpret_cast<const char*>(data), size);
  ModelConfig config;
  try {
    config = ModelConfig::FromJson(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  // Accepted means valid: the special ids index the vocabulary.
  Check(config.bos_token_id >= 0 && config.bos_token_id < config.vocab_size);
  Check(!config.eos_token_ids.empty());
  for (int64_t id : config.eos_token_ids) Check(id >= 0 && id < config.vocab_size);
  Check(config.pad_token_id >= 0 && config.pad_token_id < config.vocab_size);

  // The shape the decoder builds from it is consistent.
  Check(config.head_dim() > 0 && config.head_dim() % 2 == 0);
  Check(config.num_attention_heads % config.num_key_value_heads == 0);
  Check(!config.qk_norm() || config.architecture == kappa::model::Architecture::kQwen3);

  // What is written reads back as the same network, and is a fixed point.
  const ModelConfig again = ModelConfig::FromJson(config.ToJson());
  Check(kappa::model::SameNetwork(again, config));
  Check(again.ToJson() == config.ToJson());
  return 0;
}
