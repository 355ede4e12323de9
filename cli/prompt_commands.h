// Checking a model's prompts before a run, with its own chat template:
//   kappa render-prompt MODEL_DIR [--no-generation-prompt] [--context JSON]
//       stdin: one JSON list of {"role", "content"} messages per line; stdout:
//       the chat template's rendering (tokenizer_config.json's chat_template,
//       or chat_template.jinja) as one JSON string per line — what
//       transformers' apply_chat_template(messages, tokenize=False,
//       add_generation_prompt=True) returns. --no-generation-prompt turns the
//       generation prompt off; --context adds template variables, e.g.
//       '{"enable_thinking": false}'.
// Output is flushed line by line, so a bad line loses nothing before it.
// Exit status: 0 done; 1 no template, a template kappa refuses (naming the
// construct and line), or a line that could not be rendered (naming the
// stdin line, with the template's own message for raise_exception); 2 bad
// arguments.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace kappa::cli {

int RenderPromptCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out);

}  // namespace kappa::cli
