#include "model/hf_tokenizer/json_path.h"

namespace kappa::model::hf {

JsonNode JsonNode::Field(const std::string& key) const {
  if (!value.is_object() || !value.contains(key)) Fail("missing field \"" + key + "\"");
  return {value.at(key), path + "." + key};
}

bool JsonNode::Has(const std::string& key) const {
  return value.is_object() && value.contains(key) && !value.at(key).is_null();
}

JsonNode JsonNode::At(size_t index) const {
  return {value.at(index), path + "[" + std::to_string(index) + "]"};
}

std::string JsonNode::String(const std::string& key) const {
  JsonNode field = Field(key);
  if (!field.value.is_string()) field.Fail("must be a string");
  return field.value.get<std::string>();
}

std::string JsonNode::StringOr(const std::string& key, const std::string& fallback) const {
  return Has(key) ? String(key) : fallback;
}

bool JsonNode::BoolOr(const std::string& key, bool fallback) const {
  if (!Has(key)) return fallback;
  JsonNode field = Field(key);
  if (!field.value.is_boolean()) field.Fail("must be true or false");
  return field.value.get<bool>();
}

std::vector<JsonNode> JsonNode::Items() const {
  if (!value.is_array()) Fail("must be an array");
  std::vector<JsonNode> items;
  for (size_t i = 0; i < value.size(); ++i) items.push_back(At(i));
  return items;
}

void JsonNode::Fail(const std::string& what) const {
  throw std::invalid_argument(path + ": " + what);
}

void JsonNode::Unsupported(const std::string& type, const std::string& implemented) const {
  Fail("type \"" + type + "\" is not implemented by kappa (implemented: " + implemented +
       "); refusing rather than tokenizing differently");
}

}  // namespace kappa::model::hf
