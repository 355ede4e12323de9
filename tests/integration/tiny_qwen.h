// The tiny Qwen2 checkpoints the real-vocabulary integration tests
// (qwen_gsm8k_run_test, cli_plan_test) run `kappa run` with: a 1-layer,
// d 32 decoder with the real vocabulary's rows, saved in Hugging Face
// layout next to a real tokenizer's files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "model/checkpoint.h"
#include "model/model_config.h"
#include "model/transformer.h"

namespace kappa::testing {

// A Qwen2 config of `rows` embedding rows, d 32, 1 layer, 2/1 heads, ending
// at `eos` (<|im_end|> in ChatML).
inline model::ModelConfig TinyQwenConfig(int64_t rows, bool tied, int64_t eos) {
  model::ModelConfig config;
  config.architecture = model::Architecture::kQwen2;
  config.vocab_size = rows;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.max_position_embeddings = 512;
  config.tie_word_embeddings = tied;
  config.eos_token_ids = {eos};
  return config;
}

// Saves `decoder` to `dir` (model::SaveCheckpoint) with the tokenizer files
// of `tokenizer_dir` beside it: a directory AutoModelForCausalLM and
// AutoTokenizer both load. Throws what SaveCheckpoint and the copy throw.
inline void SaveWithTokenizer(const std::string& dir, model::Decoder& decoder,
                              const std::string& tokenizer_dir) {
  model::SaveCheckpoint(dir, decoder);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(tokenizer_dir + "/" + file, dir + "/" + file);
  }
}

}  // namespace kappa::testing
