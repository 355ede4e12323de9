// What a model's generation may emit and where it ends, from its Hugging Face
// model directory: the stop ids of generation_config.json (falling back to
// config.json's eos_token_id) and the ids a sampler may draw (the tokenizer's,
// which can be fewer than the embedding table's rows). Torch-free.
//
// transformers' GenerationConfig carries much more (sampling defaults,
// repetition penalties, ...). kappa reads only eos_token_id: the run
// configuration owns the sampling settings, and every other field is ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace kappa::model {

struct GenerationConfig {
  // generation_config.json "eos_token_id" (an int or a list), in the file's
  // order; empty when the file names none (absent or null).
  std::vector<int64_t> eos_token_ids;
};

// Parses generation_config.json text. Unknown fields are ignored. Throws
// std::invalid_argument "<source>: ..." naming the key for text that is not a
// JSON object and for an eos_token_id that is neither a non-negative integer
// nor a non-empty list of them.
GenerationConfig ParseGenerationConfig(const std::string& json_text, const std::string& source);

// model_dir/generation_config.json, or nullopt when the directory has none.
// Throws std::runtime_error when the file exists but cannot be read, and
// std::invalid_argument (naming the file) as ParseGenerationConfig.
std::optional<GenerationConfig> LoadGenerationConfig(const std::string& model_dir);

// The ids generation stops at: generation_config.json's eos_token_id when
// config.source_dir (the directory LoadCheckpoint read the model from) has
// that file and it names some, else config.json's eos_token_ids. kappa's own
// toy checkpoints have no generation_config.json: their single config.json
// EOS. Reads the file on every call (callers keep the result). Throws as
// LoadGenerationConfig, and std::invalid_argument naming the file for an id
// outside the model's [0, vocab_size).
std::vector<int64_t> StopTokenIds(const ModelConfig& config);

// The number of token ids a model's distributions are taken over: ids at
// and above it are padded embedding rows that are never sampled or scored
// (Qwen2.5-0.5B has 151,936 rows for a 151,665-id tokenizer, Qwen2.5-7B
// 152,064). Feed it the tokenizer's size: HfTokenizer::vocab_size()
// (model/hf_tokenizer/hf_tokenizer.h, one past the largest id, added tokens
// included), or CharTokenizer::vocab_size() for the demo. 0 means "every
// row" and gives config.vocab_size. The result is what the processes take
// as their vocabulary limit (the learner's TrainerLoop and work items, the
// teacher's TeacherOptions::vocab_limit, SamplingParams::sampleable_vocab_size).
// Throws std::invalid_argument naming both sizes when the tokenizer has more
// ids than the model has rows, or a negative size.
int64_t VocabLimit(const ModelConfig& config, int64_t tokenizer_vocab_size);

}  // namespace kappa::model
