// Checking a model's text path before a run, with the model directory's own
// tokenizer.json (render-prompt, for its chat template, is in
// cli/prompt_commands.h):
//   kappa tokenize MODEL_DIR [--add-special-tokens]
//       stdin: one JSON string per line; stdout: one JSON array of ids per line
//       (no BOS/EOS unless --add-special-tokens: then the post-processor's).
//   kappa detokenize MODEL_DIR [--skip-special-tokens]
//       stdin: one JSON array of ids per line; stdout: one JSON string per line.
// Output is flushed line by line, so a bad line loses nothing before it.
// Exit status: 0 done; 1 the tokenizer could not be loaded or a line could
// not be processed (the message names the file or the stdin line);
// 2 bad arguments.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace kappa::cli {

int TokenizeCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out);
int DetokenizeCommand(const std::vector<std::string>& args, std::istream& in, std::ostream& out);

}  // namespace kappa::cli
