// jinja2's lexer (lexer.py) for the default delimiters: template text,
// {{ ... }}, {% ... %}, {# ... #} and {% raw %}, with whitespace control
// ({%- -%} {%+ +%}), trim_blocks (drop the newline after a block or comment
// tag) and lstrip_blocks (drop the spaces before a block or comment tag that
// starts a line). Newlines are normalised to \n and one trailing newline of
// the source is dropped (keep_trailing_newline=False). Names are ASCII.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kappa::tasks::jinja {

enum class TokenType {
  kData,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  // Data text, a name, an operator ("==", "("), or a string literal's value.
  std::string text;
  int64_t integer = 0;
  double number = 0;
  int line = 1;
};

struct LexerOptions {
  bool trim_blocks = true;    // transformers' setting
  bool lstrip_blocks = true;  // transformers' setting
};

// Throws SyntaxError (errors.h) as jinja2 raises TemplateSyntaxError:
// unterminated comment or raw block, an unexpected character, an
// unbalanced bracket, a bad string escape.
std::vector<Token> Tokenize(std::string_view source, const LexerOptions& options);

}  // namespace kappa::tasks::jinja
