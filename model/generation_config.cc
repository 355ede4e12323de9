#include "model/generation_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

namespace kappa::model {
namespace {

using Json = nlohmann::json;

constexpr char kFileName[] = "generation_config.json";

[[noreturn]] void Fail(const std::string& source, const std::string& what) {
  throw std::invalid_argument(source + ": " + what);
}

// An integer or a non-empty list of integers, each >= 0.
std::vector<int64_t> ParseIds(const Json& value, const std::string& source, const char* key) {
  const std::string where = std::string("key \"") + key + "\"";
  std::vector<int64_t> ids;
  if (value.is_number_integer()) {
    ids.push_back(value.get<int64_t>());
  } else if (value.is_array() && !value.empty()) {
    for (const Json& id : value) {
      if (!id.is_number_integer()) Fail(source, where + " has a non-integer entry " + id.dump());
      ids.push_back(id.get<int64_t>());
    }
  } else {
    Fail(source,
         where + " must be an integer or a non-empty list of integers, got " + value.dump());
  }
  for (int64_t id : ids) {
    if (id < 0) Fail(source, where + " has a negative id " + std::to_string(id));
  }
  return ids;
}

}  // namespace

GenerationConfig ParseGenerationConfig(const std::string& json_text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    Fail(source, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) Fail(source, "must be a JSON object");
  GenerationConfig config;
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    config.eos_token_ids = ParseIds(*it, source, "eos_token_id");
  }
  return config;
}

std::optional<GenerationConfig> LoadGenerationConfig(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / kFileName;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) throw std::runtime_error(path.string() + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error(path.string() + ": cannot read");
  return ParseGenerationConfig(text.str(), path.string());
}

std::vector<int64_t> StopTokenIds(const ModelConfig& config) {
  if (config.source_dir.empty()) return config.eos_token_ids;
  const std::optional<GenerationConfig> generation = LoadGenerationConfig(config.source_dir);
  if (!generation || generation->eos_token_ids.empty()) return config.eos_token_ids;
  for (int64_t id : generation->eos_token_ids) {
    if (id >= config.vocab_size) {
      Fail((std::filesystem::path(config.source_dir) / kFileName).string(),
           "key \"eos_token_id\": id " + std::to_string(id) + " is outside the vocabulary [0, " +
               std::to_string(config.vocab_size) + ") of config.json");
    }
  }
  return generation->eos_token_ids;
}

int64_t VocabLimit(const ModelConfig& config, int64_t tokenizer_vocab_size) {
  if (tokenizer_vocab_size < 0) {
    throw std::invalid_argument("vocabulary limit: tokenizer size " +
                                std::to_string(tokenizer_vocab_size) + " is negative");
  }
  if (tokenizer_vocab_size == 0) return config.vocab_size;
  if (tokenizer_vocab_size > config.vocab_size) {
    throw std::invalid_argument("vocabulary limit: the tokenizer has " +
                                std::to_string(tokenizer_vocab_size) + " ids but model '" +
                                config.name + "' has only " + std::to_string(config.vocab_size) +
                                " embedding rows (vocab_size)");
  }
  return tokenizer_vocab_size;
}

}  // namespace kappa::model
