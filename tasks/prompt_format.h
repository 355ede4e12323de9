// How a task example's prompt becomes the text the model is given
// (config key task.prompt_template):
//   auto  chat when the model directory has a chat template, else raw (the
//         default: instruct models get their chat format, base models and
//         kappa's toy models their raw prompt).
//   chat  the model's own chat template (tokenizer_config.json), rendered
//         with [{system}?, {user: prompt}] and add_generation_prompt, exactly
//         as transformers' apply_chat_template(..., tokenize=False,
//         add_generation_prompt=True) and vLLM's chat endpoint do. The system
//         message is the example's own ("system" in a JSONL dataset), else
//         task.system_prompt, else none (the template's default applies).
//   raw   the prompt text unchanged.
//   other a custom text in which every "{prompt}" is replaced by the prompt
//         (it must contain one), e.g. "Question: {prompt}\nAnswer:".
// The rendered text is then encoded with the tokenizer's special tokens
// (Llama's BOS, say) only for raw and custom: a chat template writes its own.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "tasks/chat_template.h"
#include "tasks/dataset.h"

namespace kappa::tasks {

class PromptFormat {
 public:
  // `prompt_template` as above. For chat, the template is read from
  // model_dir (LoadChatTemplate); a directory without one is an error naming
  // it and the key. `extra_context_json`: template variables for chat (e.g.
  // {"enable_thinking": false}), "" for none.
  static absl::StatusOr<PromptFormat> Make(const std::string& prompt_template,
                                           const std::string& system_prompt,
                                           const std::string& model_dir,
                                           const std::string& extra_context_json = "");

  // The model's input text for `example`. Errors (INVALID_ARGUMENT) only from
  // the chat template itself (its raise_exception, e.g. a role it refuses).
  absl::StatusOr<std::string> Render(const Example& example) const;
  // Whether the rendered text is encoded with the tokenizer's special tokens.
  bool add_special_tokens() const { return !chat_template_.has_value(); }

 private:
  std::optional<ChatTemplate> chat_template_;
  std::string custom_;  // "" for raw
  std::string system_prompt_;
  std::string extra_context_json_;
};

}  // namespace kappa::tasks
