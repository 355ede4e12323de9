#include "model/hf_tokenizer/hf_tokenizer.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "base/stable_hash.h"
#include "base/utf8.h"
#include "model/hf_tokenizer/added_vocabulary.h"
#include "model/hf_tokenizer/bpe_model.h"
#include "model/hf_tokenizer/decoder.h"
#include "model/hf_tokenizer/json_path.h"
#include "model/hf_tokenizer/normalizer.h"
#include "model/hf_tokenizer/post_processor.h"
#include "model/hf_tokenizer/pre_tokenizer.h"

namespace kappa::model {
namespace {

using hf::JsonNode;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json ParseJson(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, out_of_range (huge numbers)
    throw std::runtime_error(source + ": not valid JSON: " + e.what());
  }
}

std::string Hex64(uint64_t value) {
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx", static_cast<unsigned long long>(value));
  return buffer;
}

// The content of a tokenizer_config.json special token: a string, an
// AddedToken object {"content": ...}, or null/absent.
std::optional<std::string> SpecialTokenContent(const nlohmann::json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const nlohmann::json& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    return value.at("content").get<std::string>();
  }
  return std::nullopt;
}

// transformers' clean_up_tokenization: no space before punctuation and
// English contractions.
std::string CleanUpTokenizationSpaces(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},   {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    const std::string_view f(from), t(to);
    std::string out;
    size_t copied = 0, at;
    while ((at = text.find(f, copied)) != std::string::npos) {
      out.append(text, copied, at - copied);
      out.append(t);
      copied = at + f.size();
    }
    out.append(text, copied, std::string::npos);
    text = std::move(out);
  }
  return text;
}

}  // namespace

struct HfTokenizer::Impl {
  std::string source;
  std::unique_ptr<hf::Normalizer> normalizer;
  hf::PreTokenizerSpec pre_tokenizer;
  std::optional<hf::BpeModel> model;
  std::unique_ptr<hf::AddedVocabulary> added;
  hf::PostProcessor post_processor;
  std::unique_ptr<hf::Decoder> decoder;
  bool clean_up_tokenization_spaces = true;
  SpecialTokenIds special_ids;
  std::string fingerprint;
  int64_t vocab_size = 0;
};

bool HfTokenizer::Exists(const std::string& model_dir) {
  return std::filesystem::is_regular_file(std::filesystem::path(model_dir) / "tokenizer.json");
}

HfTokenizer HfTokenizer::Load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::filesystem::path json_path = dir / "tokenizer.json";
  if (!std::filesystem::is_regular_file(json_path)) {
    std::string hint;
    for (const char* other : {"tokenizer.model", "vocab.json", "merges.txt"}) {
      if (std::filesystem::exists(dir / other)) {
        hint = std::string(" (it has ") + other +
               ": kappa reads only tokenizer.json; transformers' save_pretrained of the fast "
               "tokenizer writes one)";
        break;
      }
    }
    throw std::runtime_error(json_path.string() + ": no such file" + hint);
  }
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  const std::string config =
      std::filesystem::is_regular_file(config_path) ? ReadFile(config_path) : "";
  return FromJson(ReadFile(json_path), config, json_path.string());
}

HfTokenizer HfTokenizer::FromJson(const std::string& tokenizer_json,
                                  const std::string& tokenizer_config_json,
                                  const std::string& source) {
  const nlohmann::json root = ParseJson(tokenizer_json, source);
  const nlohmann::json config =
      tokenizer_config_json.empty() ? nlohmann::json::object()
                                    : ParseJson(tokenizer_config_json, source + " (tokenizer_config.json)");
  static const nlohmann::json kNull;
  auto section = [&](const char* key) {
    return JsonNode{root.contains(key) ? root.at(key) : kNull, source + ": " + key};
  };
  auto impl = std::make_shared<Impl>();
  impl->source = source;
  try {
    if (!root.is_object()) JsonNode{root, source}.Fail("must be a JSON object");
    impl->normalizer = hf::NormalizerFromJson(section("normalizer"));
    impl->pre_tokenizer = hf::PreTokenizerFromJson(section("pre_tokenizer"));
    impl->model = hf::BpeModel::FromJson(section("model"), impl->pre_tokenizer.byte_level);
    impl->added = std::make_unique<hf::AddedVocabulary>(section("added_tokens"),
                                                        impl->normalizer.get());
    impl->post_processor = hf::PostProcessor::FromJson(section("post_processor"));
    impl->decoder = hf::DecoderFromJson(section("decoder"));
    if (impl->pre_tokenizer.byte_level && impl->decoder == nullptr) {
      section("decoder").Fail("a byte-level tokenizer needs a ByteLevel decoder");
    }
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  } catch (const nlohmann::json::exception& e) {
    // A field of an unexpected JSON type that no check above caught.
    throw std::runtime_error(source + ": " + e.what());
  }

  impl->vocab_size = impl->model->id_limit();
  for (const hf::AddedToken& token : impl->added->tokens()) {
    impl->vocab_size = std::max(impl->vocab_size, token.id + 1);
  }
  if (config.contains("clean_up_tokenization_spaces") &&
      config.at("clean_up_tokenization_spaces").is_boolean()) {
    impl->clean_up_tokenization_spaces = config.at("clean_up_tokenization_spaces").get<bool>();
  }
  HfTokenizer tokenizer(impl);
  auto id_of = [&](const char* key) -> std::optional<int64_t> {
    const auto content = SpecialTokenContent(config, key);
    if (!content) return std::nullopt;
    const auto id = tokenizer.TokenToId(*content);
    if (!id) {
      throw std::runtime_error(source + " (tokenizer_config.json): " + key + " \"" + *content +
                               "\" is not a token of tokenizer.json");
    }
    return id;
  };
  impl->special_ids = {id_of("bos_token"), id_of("eos_token"), id_of("pad_token"),
                       id_of("unk_token")};
  const nlohmann::json& model = root.at("model");  // BpeModel::FromJson checked it
  uint64_t hash = base::StableHash(model.at("vocab").dump());
  hash = base::StableHash(model.at("merges").dump(), hash);
  hash = base::StableHash(section("added_tokens").value.dump(), hash);
  impl->fingerprint = Hex64(hash);
  return tokenizer;
}

std::vector<int64_t> HfTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  const size_t invalid = base::FirstInvalidUtf8(text);
  if (invalid != std::string_view::npos) {
    throw std::invalid_argument("tokenizer: the text is not valid UTF-8 at byte " +
                                std::to_string(invalid));
  }
  std::vector<int64_t> ids;
  std::vector<std::string> words;
  for (hf::TextSegment& segment : impl_->added->Split(text)) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
      continue;
    }
    words.clear();
    words.push_back(std::move(segment.text));
    if (impl_->pre_tokenizer.pre_tokenizer) impl_->pre_tokenizer.pre_tokenizer->Split(&words);
    for (const std::string& word : words) impl_->model->EncodeWord(word, &ids);
  }
  return add_special_tokens ? impl_->post_processor.AddSpecialTokens(ids) : ids;
}

std::string HfTokenizer::Decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    if (const hf::AddedToken* added = impl_->added->Find(id)) {
      if (!(skip_special_tokens && added->special)) tokens.push_back(added->content);
      continue;
    }
    const std::string* token = impl_->model->IdToToken(id);
    if (token == nullptr) {
      throw std::out_of_range("tokenizer: id " + std::to_string(id) + " is not in " +
                              impl_->source + " (vocab_size " + std::to_string(vocab_size()) +
                              ")");
    }
    tokens.push_back(*token);
  }
  std::string text;
  if (impl_->decoder) {
    impl_->decoder->DecodeChain(&tokens);
    for (const std::string& piece : tokens) text += piece;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return impl_->clean_up_tokenization_spaces ? CleanUpTokenizationSpaces(std::move(text)) : text;
}

int64_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int64_t> HfTokenizer::TokenToId(std::string_view token) const {
  if (const hf::AddedToken* added = impl_->added->Find(token)) return added->id;
  return impl_->model->FileTokenToId(token);
}

std::optional<std::string> HfTokenizer::IdToToken(int64_t id) const {
  if (const hf::AddedToken* added = impl_->added->Find(id)) return added->content;
  return impl_->model->IdToFileToken(id);
}

bool HfTokenizer::IsSpecial(int64_t id) const {
  const hf::AddedToken* added = impl_->added->Find(id);
  return added != nullptr && added->special;
}

const SpecialTokenIds& HfTokenizer::special_ids() const { return impl_->special_ids; }
const std::string& HfTokenizer::fingerprint() const { return impl_->fingerprint; }
const std::string& HfTokenizer::source() const { return impl_->source; }

}  // namespace kappa::model
