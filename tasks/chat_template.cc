// ChatTemplate: transformers' render variables around tasks/jinja, and the
// model-directory loader.
#include "tasks/chat_template.h"

#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks {
namespace {

using jinja::Dict;
using jinja::Value;
using OrderedJson = nlohmann::ordered_json;

Value MessagesValue(const std::vector<ChatMessage>& messages) {
  std::vector<Value> list;
  list.reserve(messages.size());
  for (const ChatMessage& message : messages) {
    Dict dict;
    dict.Set(Value::String("role"), Value::String(message.role));
    dict.Set(Value::String("content"), Value::String(message.content));
    list.push_back(Value::MakeDict(std::move(dict)));
  }
  return Value::List(std::move(list));
}

// special_tokens_map: only the tokens that are set and non-empty.
void AddSpecialTokens(const ChatSpecialTokens& tokens, Dict* variables) {
  const std::pair<const char*, const std::optional<std::string>*> named[] = {
      {"bos_token", &tokens.bos_token}, {"eos_token", &tokens.eos_token},
      {"unk_token", &tokens.unk_token}, {"sep_token", &tokens.sep_token},
      {"pad_token", &tokens.pad_token}, {"cls_token", &tokens.cls_token},
      {"mask_token", &tokens.mask_token}};
  for (const auto& [name, token] : named) {
    if (*token && !(*token)->empty()) variables->Set(Value::String(name), Value::String(**token));
  }
  if (!tokens.additional_special_tokens.empty()) {
    std::vector<Value> list;
    for (const std::string& token : tokens.additional_special_tokens) {
      list.push_back(Value::String(token));
    }
    variables->Set(Value::String("additional_special_tokens"), Value::List(std::move(list)));
  }
}

absl::Status AddExtraContext(const std::string& json_text, Dict* variables) {
  if (json_text.empty()) return absl::OkStatus();
  if (!jinja::IsValidUtf8(json_text)) {
    return absl::InvalidArgumentError("extra_context_json is not valid UTF-8");
  }
  absl::StatusOr<Value> extra = jinja::ValueFromJsonText(json_text);
  if (!extra.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("extra_context_json: ", extra.status().message()));
  }
  if (extra->kind() != jinja::Kind::kDict) {
    return absl::InvalidArgumentError("extra_context_json must be a JSON object");
  }
  for (const auto& [key, value] : extra->as_dict().entries()) {
    const std::string& name = key.as_string();
    if (name == "messages" || name == "add_generation_prompt") {
      return absl::InvalidArgumentError(absl::StrCat(
          "extra_context_json may not set \"", name, "\" (apply_chat_template's own argument)"));
    }
    variables->Set(key, value);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A special token: a string, an AddedToken object {"content": ...}, or null.
std::optional<std::string> TokenContent(const OrderedJson& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    return value.at("content").get<std::string>();
  }
  return std::nullopt;
}

ChatSpecialTokens ReadSpecialTokens(const OrderedJson& config) {
  ChatSpecialTokens tokens;
  const std::pair<const char*, std::optional<std::string>*> named[] = {
      {"bos_token", &tokens.bos_token}, {"eos_token", &tokens.eos_token},
      {"unk_token", &tokens.unk_token}, {"sep_token", &tokens.sep_token},
      {"pad_token", &tokens.pad_token}, {"cls_token", &tokens.cls_token},
      {"mask_token", &tokens.mask_token}};
  for (const auto& [name, token] : named) {
    if (config.contains(name)) *token = TokenContent(config.at(name));
  }
  if (config.contains("additional_special_tokens") && config.at("additional_special_tokens").is_array()) {
    for (const OrderedJson& entry : config.at("additional_special_tokens")) {
      if (std::optional<std::string> content = TokenContent(entry)) {
        tokens.additional_special_tokens.push_back(*content);
      }
    }
  }
  return tokens;
}

// tokenizer_config.json's "chat_template": a string, or a list of
// {name, template} whose "default" entry is used. nullopt when absent/null.
absl::StatusOr<std::optional<std::string>> ConfigTemplate(const OrderedJson& config,
                                                          const std::string& path) {
  if (!config.contains("chat_template") || config.at("chat_template").is_null()) {
    return std::optional<std::string>();
  }
  const OrderedJson& entry = config.at("chat_template");
  if (entry.is_string()) return std::optional<std::string>(entry.get<std::string>());
  if (entry.is_array()) {
    for (const OrderedJson& named : entry) {
      if (named.is_object() && named.value("name", "") == "default" &&
          named.contains("template") && named.at("template").is_string()) {
        return std::optional<std::string>(named.at("template").get<std::string>());
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"chat_template\" lists several templates and none is \"default\""));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": \"chat_template\" must be a string or a list of {name, template}"));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source,
                                                 ChatSpecialTokens special_tokens) {
  absl::StatusOr<jinja::Template> compiled = jinja::Template::Parse(source);
  if (!compiled.ok()) return compiled.status();
  return ChatTemplate(*std::move(compiled), std::move(special_tokens));
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 const ChatRenderOptions& options) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!jinja::IsValidUtf8(messages[i].role) || !jinja::IsValidUtf8(messages[i].content)) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " is not valid UTF-8"));
    }
  }
  Dict variables;
  variables.Set(Value::String("messages"), MessagesValue(messages));
  variables.Set(Value::String("tools"), Value::None());
  variables.Set(Value::String("documents"), Value::None());
  variables.Set(Value::String("add_generation_prompt"), Value::Bool(options.add_generation_prompt));
  AddSpecialTokens(special_tokens_, &variables);
  if (absl::Status status = AddExtraContext(options.extra_context_json, &variables); !status.ok()) {
    return status;
  }
  return compiled_.Render(variables);
}

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& model_dir) {
  const std::string config_path = model_dir + "/tokenizer_config.json";
  OrderedJson config = OrderedJson::object();
  if (std::ifstream(config_path).good()) {
    absl::StatusOr<std::string> text = ReadFile(config_path);
    if (!text.ok()) return text.status();
    config = OrderedJson::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
  }
  absl::StatusOr<std::optional<std::string>> source = ConfigTemplate(config, config_path);
  if (!source.ok()) return source.status();
  if (!*source) {
    const std::string jinja_path = model_dir + "/chat_template.jinja";
    absl::StatusOr<std::string> text = ReadFile(jinja_path);
    if (!text.ok()) {
      return absl::NotFoundError(absl::StrCat(
          model_dir, ": no chat template (no \"chat_template\" in tokenizer_config.json and no "
                     "chat_template.jinja)"));
    }
    *source = *std::move(text);
  }
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(**source, ReadSpecialTokens(config));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir, ": ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace kappa::tasks
