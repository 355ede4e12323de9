#include "tasks/prompt_format.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace kappa::tasks {

absl::StatusOr<PromptFormat> PromptFormat::Make(const std::string& prompt_template,
                                                const std::string& system_prompt,
                                                const std::string& model_dir,
                                                const std::string& extra_context_json) {
  PromptFormat format;
  format.system_prompt_ = system_prompt;
  format.extra_context_json_ = extra_context_json;
  if (prompt_template == "auto" || prompt_template == "chat") {
    absl::StatusOr<ChatTemplate> chat_template = LoadChatTemplate(model_dir);
    if (prompt_template == "auto" && absl::IsNotFound(chat_template.status())) return format;
    if (!chat_template.ok()) {
      const char* hint = prompt_template == "chat"
                             ? " (use task.prompt_template: raw or a custom text with {prompt} "
                               "for a model without a chat template)"
                             : "";
      return absl::Status(chat_template.status().code(),
                          absl::StrCat("task.prompt_template: ", prompt_template, ": ",
                                       chat_template.status().message(), hint));
    }
    format.chat_template_ = *std::move(chat_template);
    return format;
  }
  if (prompt_template == "raw") return format;
  if (prompt_template.find("{prompt}") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.prompt_template: \"", prompt_template,
                     "\" is neither auto, chat, raw nor a custom text containing {prompt}"));
  }
  format.custom_ = prompt_template;
  return format;
}

absl::StatusOr<std::string> PromptFormat::Render(const Example& example) const {
  if (!chat_template_) {
    if (custom_.empty()) return example.prompt;
    return absl::StrReplaceAll(custom_, {{"{prompt}", example.prompt}});
  }
  std::vector<ChatMessage> messages;
  const std::string& system = example.system.empty() ? system_prompt_ : example.system;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", example.prompt});
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.extra_context_json = extra_context_json_;
  absl::StatusOr<std::string> text = chat_template_->Render(messages, options);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("example ", example.id, ": chat template: ", text.status().message()));
  }
  return text;
}

}  // namespace kappa::tasks
