// The regular expressions of tokenizer.json (Split pre-tokenizer, Replace
// normalizer), run with PCRE2 in UTF + UCP mode, JIT-compiled. These patterns
// use `\p{L}`, `\p{N}` and a look-ahead `\s+(?!\S)`, which is why this is not
// RE2. `\s`/`\S` are rewritten to Unicode White_Space, what the Hugging Face
// tokenizers' Oniguruma matches (PCRE2 alone would add U+180E).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/hf_tokenizer/json_path.h"

namespace kappa::model::hf {

class Regex {
 public:
  // Throws std::invalid_argument with PCRE2's message and offset.
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // [begin, end) byte spans of the successive non-overlapping matches, left to
  // right; an empty match advances by one code point and yields nothing.
  // REQUIRES: text is valid UTF-8. Thread-safe.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

// `pattern` with `\s`/`\S` spelled as explicit White_Space classes (exposed
// for tests). Throws std::invalid_argument for `\S` inside a character class.
std::string WithUnicodeWhitespace(std::string_view pattern);

// A tokenizer.json "pattern": {"String": literal} or {"Regex": pattern}.
// Throws std::invalid_argument naming the JSON path.
std::unique_ptr<Regex> RegexFromPatternJson(const JsonNode& pattern);

// `literal` escaped so that PCRE2 matches it verbatim.
std::string QuoteRegex(std::string_view literal);

}  // namespace kappa::model::hf
