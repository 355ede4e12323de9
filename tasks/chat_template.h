// Hugging Face chat templates, rendered as transformers'
// tokenizer.apply_chat_template(messages, tokenize=False,
// add_generation_prompt=...) renders them: the Jinja source runs in kappa's
// interpreter (tasks/jinja) with transformers' environment —
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) plus
// loopcontrols and the {% generation %} tag, its own `tojson`, and the
// globals raise_exception and strftime_now — and the variables
// messages, tools=None, documents=None, add_generation_prompt, the
// tokenizer's special_tokens_map and the caller's extra variables.
// No libtorch, no gRPC.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tasks/jinja/template.h"

namespace kappa::tasks {

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Extra template variables as JSON text of an object, e.g.
  // {"enable_thinking": false}; "" = none. They override the special tokens
  // (transformers: {**special_tokens_map, **kwargs}); "tools" and
  // "documents" fill those arguments (None otherwise); "messages" and
  // "add_generation_prompt" are refused (InvalidArgumentError).
  std::string extra_context_json;
};

// transformers' special_tokens_map: each attribute that is set and
// non-empty becomes a template variable; absent ones stay undefined.
struct ChatSpecialTokens {
  std::optional<std::string> bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
      mask_token;
  std::vector<std::string> additional_special_tokens;
};

class ChatTemplate {
 public:
  // Parses the Jinja source. A construct outside what kappa implements
  // (unknown tag, filter, test, global function, or a method name not in the
  // supported set) is InvalidArgumentError naming it and its line — at parse
  // time, not at first render.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source,
                                            ChatSpecialTokens special_tokens = {});

  // Render errors (raise_exception(...) called by the template, type
  // errors, undefined values used) are InvalidArgumentError
  // "template line N: <PythonErrorType>: <message>", e.g.
  // "template line 1: TemplateError: System role not supported".
  // Message contents must be valid UTF-8.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const ChatRenderOptions& options) const;

  const ChatSpecialTokens& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate(jinja::Template compiled, ChatSpecialTokens special_tokens)
      : compiled_(std::move(compiled)), special_tokens_(std::move(special_tokens)) {}

  jinja::Template compiled_;  // Shares the parsed tree: copies are cheap.
  ChatSpecialTokens special_tokens_;
};

// Reads the template of a Hugging Face model directory: tokenizer_config.json
// "chat_template" (a string, or a list of {name, template} where "default"
// is used), else chat_template.jinja; and the special tokens from
// tokenizer_config.json (each a string or an AddedToken object
// {"content": ...}). NotFoundError naming the directory when there is no
// template; InvalidArgumentError naming the file for malformed JSON.
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& model_dir);

}  // namespace kappa::tasks
