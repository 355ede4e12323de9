#include "tasks/jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "tasks/jinja/errors.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {
namespace {

// jinja2 splits the source on \r\n, \r and \n, drops one trailing empty
// line (keep_trailing_newline=False) and joins with \n.
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      out.push_back('\n');
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool AllPythonSpace(std::string_view text) {
  if (text.empty()) return false;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!IsPythonSpace(NextCodePoint(text, &pos))) return false;
  }
  return true;
}

std::string RStrip(std::string_view text) {
  std::u32string s = DecodeUtf8(text);
  while (!s.empty() && IsPythonSpace(s.back())) s.pop_back();
  return EncodeUtf8(s);
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options)
      : src_(NormalizeNewlines(source)), options_(options) {}

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      const size_t tag = FindTagStart(pos_);
      if (tag == std::string::npos) {
        EmitData(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      LexTag(tag);
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = LineAt(src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t position) {
    for (; line_position_ < position && line_position_ < src_.size(); ++line_position_) {
      if (src_[line_position_] == '\n') ++line_;
    }
    return line_;
  }

  [[noreturn]] void Fail(size_t position, const std::string& message) {
    throw SyntaxError(LineAt(position), message);
  }

  bool At(size_t position, std::string_view text) const {
    return src_.compare(position, text.size(), text) == 0;
  }

  size_t SkipSpaces(size_t position) const {
    while (position < src_.size()) {
      size_t next = position;
      if (!IsPythonSpace(NextCodePoint(src_, &next))) break;
      position = next;
    }
    return position;
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  void Emit(TokenType type, std::string text, size_t position) {
    Token token;
    token.type = type;
    token.text = std::move(text);
    token.line = LineAt(position);
    tokens_.push_back(std::move(token));
  }

  void EmitData(std::string_view text, size_t position) {
    if (!text.empty()) Emit(TokenType::kData, std::string(text), position);
  }

  // The text before a tag, after the tag's whitespace control: '-' strips
  // all trailing whitespace; lstrip_blocks strips the spaces between the
  // last line start and a block/comment tag (not `{{`, not `{%+`).
  std::string StripBeforeTag(std::string_view text, char sign, bool is_variable) const {
    if (sign == '-') return RStrip(text);
    if (sign == '+' || !options_.lstrip_blocks || is_variable) return std::string(text);
    const size_t line_start = text.rfind('\n') + 1;  // npos + 1 == 0
    if ((line_start > 0 || line_starting_) && AllPythonSpace(text.substr(line_start))) {
      return std::string(text.substr(0, line_start));
    }
    return std::string(text);
  }

  // Records whether the last consumed text ended a line (jinja2's
  // `line_starting`, which gates lstrip_blocks for the next tag).
  void MarkEnd(size_t end) {
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    pos_ = end;
  }

  void LexTag(size_t tag) {
    const char kind = src_[tag + 1];
    size_t after = tag + 2;
    char sign = 0;
    if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
    const std::string_view text(src_.data() + pos_, tag - pos_);
    if (kind == '%') {
      if (const size_t raw_end = MatchRawBegin(after); raw_end != std::string::npos) {
        EmitData(StripBeforeTag(text, sign, false), pos_);
        MarkEnd(raw_end);
        LexRawBody();
        return;
      }
    }
    EmitData(StripBeforeTag(text, sign, kind == '{'), pos_);
    if (kind == '#') {
      LexComment(after);
    } else {
      Emit(kind == '%' ? TokenType::kBlockBegin : TokenType::kVariableBegin, "", tag);
      LexInsideTag(after, kind == '%');
    }
  }

  // `{%[-+] raw [-]%}`: the end of the raw tag, or npos.
  size_t MatchRawBegin(size_t position) const {
    size_t p = SkipSpaces(position);
    if (!At(p, "raw")) return std::string::npos;
    p = SkipSpaces(p + 3);
    if (At(p, "-%}")) return SkipSpaces(p + 3);
    if (At(p, "%}")) return p + 2;  // No trim_blocks after a raw tag, as in jinja2.
    return std::string::npos;
  }

  void LexRawBody() {
    for (size_t q = src_.find("{%", pos_); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t p = q + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = SkipSpaces(p);
      if (!At(p, "endraw")) continue;
      p = SkipSpaces(p + 6);
      size_t end;
      if (At(p, "+%}")) {
        end = p + 3;
      } else if (At(p, "-%}")) {
        end = SkipSpaces(p + 3);
      } else if (At(p, "%}")) {
        end = p + 2;
        if (options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      EmitData(StripBeforeTag(std::string_view(src_.data() + pos_, q - pos_), sign, false), pos_);
      MarkEnd(end);
      return;
    }
    Fail(pos_, "Missing end of raw directive");
  }

  void LexComment(size_t body) {
    for (size_t q = body; q < src_.size(); ++q) {
      if (At(q, "+#}")) return MarkEnd(q + 3);
      if (At(q, "-#}")) return MarkEnd(SkipSpaces(q + 3));
      if (At(q, "#}")) {
        size_t end = q + 2;
        if (options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
        return MarkEnd(end);
      }
    }
    Fail(body, "Missing end of comment tag");
  }

  // The closing delimiter at `p`, if the brackets are balanced: its end.
  size_t MatchTagEnd(size_t p, bool block) const {
    if (!brackets_.empty()) return std::string::npos;
    if (block) {
      if (At(p, "+%}")) return p + 3;
      if (At(p, "-%}")) return SkipSpaces(p + 3);
      if (At(p, "%}")) {
        size_t end = p + 2;
        if (options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
        return end;
      }
      return std::string::npos;
    }
    if (At(p, "-}}")) return SkipSpaces(p + 3);
    if (At(p, "}}")) return p + 2;
    return std::string::npos;
  }

  void LexInsideTag(size_t p, bool block) {
    while (true) {
      if (p >= src_.size()) {
        pos_ = src_.size();
        return;  // The parser reports the unexpected end of template.
      }
      if (const size_t end = MatchTagEnd(p, block); end != std::string::npos) {
        Emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", p);
        MarkEnd(end);
        return;
      }
      const size_t spaces = SkipSpaces(p);
      if (spaces != p) {
        p = spaces;
        continue;
      }
      if (size_t end = LexNumber(p); end != std::string::npos) {
        p = end;
      } else if (IsNameStart(src_[p])) {
        size_t end = p;
        while (end < src_.size() && IsNameChar(src_[end])) ++end;
        if (end < src_.size() && static_cast<unsigned char>(src_[end]) >= 0x80) {
          Fail(p, "kappa supports ASCII names only");
        }
        Emit(TokenType::kName, src_.substr(p, end - p), p);
        p = end;
      } else if (src_[p] == '\'' || src_[p] == '"') {
        p = LexString(p);
      } else {
        p = LexOperator(p);
      }
    }
  }

  // `(\d+_)*\d+` from `p`: its end, or `p` when no digit is there.
  size_t Digits(size_t p) const {
    if (p >= src_.size() || !IsDigit(src_[p])) return p;
    while (p < src_.size() && IsDigit(src_[p])) ++p;
    while (p + 1 < src_.size() && src_[p] == '_' && IsDigit(src_[p + 1])) {
      ++p;
      while (p < src_.size() && IsDigit(src_[p])) ++p;
    }
    return p;
  }

  size_t Exponent(size_t p) const {
    if (p >= src_.size() || (src_[p] != 'e' && src_[p] != 'E')) return std::string::npos;
    size_t q = p + 1;
    if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
    const size_t end = Digits(q);
    return end == q ? std::string::npos : end;
  }

  // jinja2's float_re then integer_re; npos when neither matches.
  size_t LexNumber(size_t p) {
    if (!IsDigit(src_[p])) return std::string::npos;
    const size_t whole = Digits(p);
    size_t float_end = std::string::npos;
    if (p == 0 || src_[p - 1] != '.') {
      size_t fraction = std::string::npos;
      if (whole < src_.size() && src_[whole] == '.' && Digits(whole + 1) != whole + 1) {
        fraction = Digits(whole + 1);
      }
      const size_t exponent = Exponent(fraction != std::string::npos ? fraction : whole);
      float_end = exponent != std::string::npos ? exponent : fraction;
    }
    if (float_end != std::string::npos) {
      std::string text;
      for (size_t i = p; i < float_end; ++i) {
        if (src_[i] != '_') text.push_back(src_[i]);
      }
      Token token;
      token.type = TokenType::kFloat;
      token.text = src_.substr(p, float_end - p);
      token.number = std::strtod(text.c_str(), nullptr);
      token.line = LineAt(p);
      tokens_.push_back(std::move(token));
      return float_end;
    }
    return LexInteger(p);
  }

  size_t LexInteger(size_t p) {
    int base = 10;
    size_t digits_begin = p, end = p;
    auto run = [&](size_t q, int radix) {
      // (_?digit)+ in `radix`.
      size_t r = q;
      while (true) {
        size_t s = r;
        if (s < src_.size() && src_[s] == '_') ++s;
        if (s >= src_.size()) break;
        const int d = HexValue(src_[s]);
        if (d < 0 || d >= radix) break;
        r = s + 1;
      }
      return r;
    };
    const char prefix = p + 1 < src_.size() ? static_cast<char>(std::tolower(src_[p + 1])) : 0;
    if (src_[p] == '0' && (prefix == 'b' || prefix == 'o' || prefix == 'x')) {
      base = prefix == 'b' ? 2 : (prefix == 'o' ? 8 : 16);
      end = run(p + 2, base);
      if (end == p + 2) {
        base = 10;
      } else {
        digits_begin = p + 2;
      }
    }
    if (base == 10) {
      if (src_[p] == '0') {
        end = p + 1;
        while (true) {  // 0(_?0)*
          size_t s = end;
          if (s < src_.size() && src_[s] == '_') ++s;
          if (s < src_.size() && src_[s] == '0') {
            end = s + 1;
          } else {
            break;
          }
        }
      } else {
        end = run(p + 1, 10);
      }
    }
    std::string digits;
    for (size_t i = digits_begin; i < end; ++i) {
      if (src_[i] != '_') digits.push_back(src_[i]);
    }
    errno = 0;
    const long long value = std::strtoll(digits.c_str(), nullptr, base);
    if (errno == ERANGE) Fail(p, "integer literal does not fit in 64 bits");
    Token token;
    token.type = TokenType::kInteger;
    token.text = src_.substr(p, end - p);
    token.integer = value;
    token.line = LineAt(p);
    tokens_.push_back(std::move(token));
    return end;
  }

  size_t LexString(size_t p) {
    const char quote = src_[p];
    size_t q = p + 1;
    while (q < src_.size() && src_[q] != quote) q += src_[q] == '\\' ? 2 : 1;
    if (q >= src_.size()) {
      Fail(p, std::string("unexpected char '") + quote + "' at " + std::to_string(p));
    }
    Emit(TokenType::kString, Unescape(src_.substr(p + 1, q - p - 1), p), p);
    return q + 1;
  }

  // Python's "unicode-escape" decoding of the literal's text (after
  // jinja2's encode("ascii", "backslashreplace")).
  std::string Unescape(std::string_view body, size_t position) {
    std::string out;
    size_t i = 0;
    while (i < body.size()) {
      if (body[i] != '\\') {
        out.push_back(body[i++]);
        continue;
      }
      ++i;
      if (i >= body.size()) Fail(position, "\\ at end of string");
      const char c = body[i];
      if (static_cast<unsigned char>(c) >= 0x80) {
        // "\é": backslashreplace turned é into \xe9, so "\\xe9" decodes
        // to a backslash followed by the text "xe9".
        size_t next = i;
        const char32_t code_point = NextCodePoint(body, &next);
        char buffer[16];
        if (code_point <= 0xFF) {
          std::snprintf(buffer, sizeof buffer, "x%02x", static_cast<unsigned>(code_point));
        } else if (code_point <= 0xFFFF) {
          std::snprintf(buffer, sizeof buffer, "u%04x", static_cast<unsigned>(code_point));
        } else {
          std::snprintf(buffer, sizeof buffer, "U%08x", static_cast<unsigned>(code_point));
        }
        out.push_back('\\');
        out.append(buffer);
        i = next;
        continue;
      }
      ++i;
      switch (c) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': AppendUtf8(HexEscape(body, &i, 2, position, "truncated \\xXX escape"), &out); break;
        case 'u': AppendUtf8(HexEscape(body, &i, 4, position, "truncated \\uXXXX escape"), &out); break;
        case 'U': {
          const char32_t code_point =
              HexEscape(body, &i, 8, position, "truncated \\UXXXXXXXX escape");
          if (code_point > 0x10FFFF) Fail(position, "illegal Unicode character");
          AppendUtf8(code_point, &out);
          break;
        }
        case 'N': Fail(position, "kappa does not implement \\N{...} escapes");
        default:
          if (c >= '0' && c <= '7') {
            char32_t value = static_cast<char32_t>(c - '0');
            for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k) {
              value = value * 8 + static_cast<char32_t>(body[i++] - '0');
            }
            AppendUtf8(value, &out);
          } else {
            out.push_back('\\');
            out.push_back(c);
          }
      }
    }
    if (!IsValidUtf8(out)) Fail(position, "string escape produces a surrogate");
    return out;
  }

  char32_t HexEscape(std::string_view body, size_t* i, int digits, size_t position,
                     const char* message) {
    char32_t value = 0;
    for (int k = 0; k < digits; ++k) {
      const int d = *i < body.size() ? HexValue(body[*i]) : -1;
      if (d < 0) Fail(position, message);
      value = value * 16 + static_cast<char32_t>(d);
      ++*i;
    }
    return value;
  }

  size_t LexOperator(size_t p) {
    static const char* const kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwoChar) {
      if (At(p, op)) {
        Emit(TokenType::kOperator, op, p);
        return p + 2;
      }
    }
    const char c = src_[p];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      size_t next = p;
      std::string shown;
      AppendUtf8(NextCodePoint(src_, &next), &shown);
      Fail(p, "unexpected char '" + shown + "' at " + std::to_string(p));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets_.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets_.empty()) Fail(p, std::string("unexpected '") + c + "'");
      if (brackets_.back() != c) {
        Fail(p, std::string("unexpected '") + c + "', expected '" + brackets_.back() + "'");
      }
      brackets_.pop_back();
    }
    Emit(TokenType::kOperator, std::string(1, c), p);
    return p + 1;
  }

  std::string src_;
  LexerOptions options_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::string brackets_;  // Expected closers, innermost last.
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_position_ = 0;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(source, options).Run();
}

}  // namespace kappa::tasks::jinja
