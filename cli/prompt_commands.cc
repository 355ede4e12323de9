#include "cli/prompt_commands.h"

#include <nlohmann/json.hpp>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/line_commands.h"
#include "tasks/chat_template.h"

namespace kappa::cli {
namespace {

constexpr const char* kRenderPromptUsage =
    "usage: kappa render-prompt MODEL_DIR [--no-generation-prompt] [--context JSON] < messages.jsonl\n";

std::vector<tasks::ChatMessage> ParseMessages(const nlohmann::json& value) {
  if (!value.is_array()) throw std::invalid_argument("expected a JSON list of messages");
  std::vector<tasks::ChatMessage> messages;
  for (size_t i = 0; i < value.size(); ++i) {
    const nlohmann::json& m = value[i];
    if (!m.is_object() || !m.contains("role") || !m.at("role").is_string() ||
        !m.contains("content") || !m.at("content").is_string()) {
      throw std::invalid_argument(
          absl::StrCat("message ", i, " must be {\"role\": string, \"content\": string}"));
    }
    messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  }
  return messages;
}

}  // namespace

int RenderPromptCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out) {
  const auto line = ParseModelDirCommand("render-prompt", args, {"--context"},
                                         {"--no-generation-prompt"}, kRenderPromptUsage);
  if (!line) return 2;
  absl::StatusOr<tasks::ChatTemplate> chat_template = tasks::LoadChatTemplate(line->config_path);
  if (!chat_template.ok()) {
    std::cerr << "kappa render-prompt: " << chat_template.status().message() << "\n";
    return 1;
  }
  tasks::ChatRenderOptions options;
  options.add_generation_prompt = !line->Has("--no-generation-prompt");
  options.extra_context_json = line->Get("--context", "");
  return ForEachJsonLine("render-prompt", in, out, [&](const nlohmann::json& value) {
    absl::StatusOr<std::string> text = chat_template->Render(ParseMessages(value), options);
    if (!text.ok()) throw std::invalid_argument(std::string(text.status().message()));
    return nlohmann::json(*text).dump();
  });
}

}  // namespace kappa::cli
