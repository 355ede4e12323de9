#include "model/hf_tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

#include "base/utf8.h"

namespace kappa::model::hf {
namespace {

// Unicode White_Space, as PCRE2 class items.
constexpr char kWhitespaceItems[] =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

std::string WithUnicodeWhitespace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhitespaceItems)
                        : std::string("[") + kWhitespaceItems + "]";
      } else if (e == 'S') {
        if (in_class) {
          throw std::invalid_argument("regex \"" + std::string(pattern) +
                                      "\": \\S inside a character class is not supported");
        }
        out += std::string("[^") + kWhitespaceItems + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after '[' is a literal, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::string QuoteRegex(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::unique_ptr<Regex> RegexFromPatternJson(const JsonNode& pattern) {
  try {
    if (pattern.Has("String")) return std::make_unique<Regex>(QuoteRegex(pattern.String("String")));
    if (pattern.Has("Regex")) return std::make_unique<Regex>(pattern.String("Regex"));
  } catch (const std::invalid_argument& e) {
    pattern.Fail(e.what());
  }
  pattern.Fail("must be {\"String\": ...} or {\"Regex\": ...}");
}

Regex::Regex(std::string_view pattern)
    : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  const std::string translated = WithUnicodeWhitespace(pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                  translated.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK,
                                  &error, &error_offset, nullptr);
  if (compiled_->code == nullptr) {
    throw std::invalid_argument("regex \"" + std::string(pattern) + "\": " + Pcre2Message(error) +
                                " (at offset " + std::to_string(error_offset) +
                                " of the PCRE2 form \"" + translated + "\")");
  }
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> spans;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    int rc = -1;
    if (compiled_->jit) {
      rc = pcre2_jit_match(compiled_->code, subject, text.size(), offset, 0, match, nullptr);
    }
    // The interpreter also takes over when the JIT's stack is too small (a
    // look-ahead over a very long whitespace run).
    if (!compiled_->jit || rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(compiled_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, match,
                       nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(match);
      throw std::runtime_error("regex \"" + pattern_ + "\": " + Pcre2Message(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {
      size_t next = begin;
      if (next >= text.size()) break;
      base::NextCodePoint(text, &next);
      offset = next;
      continue;
    }
    spans.emplace_back(begin, end);
    offset = end;
  }
  pcre2_match_data_free(match);
  return spans;
}

}  // namespace kappa::model::hf
