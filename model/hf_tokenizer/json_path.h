// Reading tokenizer.json components: every error names the file and the JSON
// path of the offending field ("tokenizer.json: pre_tokenizer.pretokenizers[0]
// .type \"Whitespace\" is not implemented ..."), so a refused file says where.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace kappa::model::hf {

// A JSON value together with where it is in the file.
struct JsonNode {
  const nlohmann::json& value;
  std::string path;  // "tokenizer.json: model.merges", ...

  JsonNode Field(const std::string& key) const;  // throws when missing
  bool Has(const std::string& key) const;        // present and not null
  JsonNode At(size_t index) const;

  std::string String(const std::string& key) const;
  std::string StringOr(const std::string& key, const std::string& fallback) const;
  bool BoolOr(const std::string& key, bool fallback) const;
  std::vector<JsonNode> Items() const;  // throws unless an array

  [[noreturn]] void Fail(const std::string& what) const;
  // "<path>.type \"<type>\" is not implemented by kappa (<implemented>)".
  [[noreturn]] void Unsupported(const std::string& type, const std::string& implemented) const;
};

}  // namespace kappa::model::hf
