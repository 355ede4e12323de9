#include "cli/tokenizer_commands.h"

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/status.h"
#include "cli/line_commands.h"
#include "model/hf_tokenizer/hf_tokenizer.h"

namespace kappa::cli {
namespace {

constexpr const char* kTokenizeUsage = "usage: kappa tokenize MODEL_DIR [--add-special-tokens] < strings.jsonl\n";
constexpr const char* kDetokenizeUsage =
    "usage: kappa detokenize MODEL_DIR [--skip-special-tokens] < ids.jsonl\n";

std::optional<model::HfTokenizer> LoadTokenizer(const char* command, const std::string& dir) {
  absl::StatusOr<model::HfTokenizer> tokenizer =
      base::CaptureExceptions("", [&] { return model::HfTokenizer::Load(dir); });
  if (!tokenizer.ok()) {
    std::cerr << "kappa " << command << ": " << tokenizer.status().message() << "\n";
    return std::nullopt;
  }
  return *std::move(tokenizer);
}

}  // namespace

int TokenizeCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out) {
  const auto line =
      ParseModelDirCommand("tokenize", args, {}, {"--add-special-tokens"}, kTokenizeUsage);
  if (!line) return 2;
  const auto tokenizer = LoadTokenizer("tokenize", line->config_path);
  if (!tokenizer) return 1;
  const bool add_special = line->Has("--add-special-tokens");
  return ForEachJsonLine("tokenize", in, out, [&](const nlohmann::json& value) {
    if (!value.is_string()) throw std::invalid_argument("expected a JSON string");
    return nlohmann::json(tokenizer->Encode(value.get<std::string>(), add_special)).dump();
  });
}

int DetokenizeCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out) {
  const auto line =
      ParseModelDirCommand("detokenize", args, {}, {"--skip-special-tokens"}, kDetokenizeUsage);
  if (!line) return 2;
  const auto tokenizer = LoadTokenizer("detokenize", line->config_path);
  if (!tokenizer) return 1;
  const bool skip_special = line->Has("--skip-special-tokens");
  return ForEachJsonLine("detokenize", in, out, [&](const nlohmann::json& value) {
    if (!value.is_array()) throw std::invalid_argument("expected a JSON array of token ids");
    std::vector<int64_t> ids;
    for (const nlohmann::json& id : value) {
      if (!id.is_number_integer()) throw std::invalid_argument("token ids must be integers");
      ids.push_back(id.get<int64_t>());
    }
    // Invalid UTF-8 became U+FFFD in Decode, so this dump cannot throw.
    return nlohmann::json(tokenizer->Decode(ids, skip_special)).dump();
  });
}

}  // namespace kappa::cli
