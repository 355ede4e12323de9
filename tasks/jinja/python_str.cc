#include "tasks/jinja/python_str.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "tasks/jinja/errors.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {
namespace {

int64_t Limit(int64_t maxsplit) {
  return maxsplit < 0 ? std::numeric_limits<int64_t>::max() : maxsplit;
}

bool IsAsciiUpper(char32_t c) { return c >= 'A' && c <= 'Z'; }
bool IsAsciiLower(char32_t c) { return c >= 'a' && c <= 'z'; }
bool IsAsciiLetter(char32_t c) { return IsAsciiUpper(c) || IsAsciiLower(c); }

// Throws for a code point whose case kappa does not know.
void RequireKnownCase(char32_t c, const char* operation) {
  if (c < 0x80 || IsKnownUncased(c)) return;
  char code[16];
  std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(c));
  ThrowUnsupported(std::string("kappa implements ") + operation +
                   " for ASCII and uncased scripts only, not for " + code);
}

enum class CaseOp { kUpper, kLower };

char32_t ConvertCase(char32_t c, CaseOp op, const char* operation) {
  RequireKnownCase(c, operation);
  if (op == CaseOp::kUpper && IsAsciiLower(c)) return c - 'a' + 'A';
  if (op == CaseOp::kLower && IsAsciiUpper(c)) return c - 'A' + 'a';
  return c;
}

std::string MapCase(std::string_view text, CaseOp op, const char* operation) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) AppendUtf8(ConvertCase(NextCodePoint(text, &pos), op, operation), &out);
  return out;
}

bool IsLineBreak(char32_t c) {
  switch (c) {
    case '\n': case '\r': case 0x0B: case 0x0C: case 0x1C: case 0x1D: case 0x1E:
    case 0x85: case 0x2028: case 0x2029:
      return true;
    default:
      return false;
  }
}

std::vector<std::string> SplitWhitespace(std::string_view text, int64_t maxsplit) {
  const std::u32string s = DecodeUtf8(text);
  std::vector<std::string> out;
  size_t i = 0;
  int64_t count = Limit(maxsplit);
  while (count-- > 0) {
    while (i < s.size() && IsPythonSpace(s[i])) ++i;
    if (i == s.size()) break;
    const size_t j = i++;
    while (i < s.size() && !IsPythonSpace(s[i])) ++i;
    out.push_back(EncodeUtf8(s.substr(j, i - j)));
  }
  if (i < s.size()) {
    while (i < s.size() && IsPythonSpace(s[i])) ++i;
    if (i != s.size()) out.push_back(EncodeUtf8(s.substr(i)));
  }
  return out;
}

std::vector<std::string> RSplitWhitespace(std::string_view text, int64_t maxsplit) {
  const std::u32string s = DecodeUtf8(text);
  std::vector<std::string> out;
  int64_t i = static_cast<int64_t>(s.size()) - 1;
  int64_t count = Limit(maxsplit);
  while (count-- > 0) {
    while (i >= 0 && IsPythonSpace(s[static_cast<size_t>(i)])) --i;
    if (i < 0) break;
    const int64_t j = i--;
    while (i >= 0 && !IsPythonSpace(s[static_cast<size_t>(i)])) --i;
    out.push_back(EncodeUtf8(s.substr(static_cast<size_t>(i + 1), static_cast<size_t>(j - i))));
  }
  if (i >= 0) {
    while (i >= 0 && IsPythonSpace(s[static_cast<size_t>(i)])) --i;
    if (i >= 0) out.push_back(EncodeUtf8(s.substr(0, static_cast<size_t>(i + 1))));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

void RequireSeparator(const std::string& sep) {
  if (sep.empty()) ThrowValueError("empty separator");
}

}  // namespace

std::string Strip(std::string_view text, const std::optional<std::string>& chars, StripSide side) {
  const std::u32string s = DecodeUtf8(text);
  const std::u32string set = chars ? DecodeUtf8(*chars) : std::u32string();
  auto strippable = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : IsPythonSpace(c);
  };
  size_t begin = 0, end = s.size();
  if (side != StripSide::kRight) {
    while (begin < end && strippable(s[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strippable(s[end - 1])) --end;
  }
  return EncodeUtf8(s.substr(begin, end - begin));
}

std::vector<std::string> Split(std::string_view text, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  if (!sep) return SplitWhitespace(text, maxsplit);
  RequireSeparator(*sep);
  std::vector<std::string> out;
  size_t start = 0;
  int64_t count = Limit(maxsplit);
  while (count-- > 0) {
    const size_t found = text.find(*sep, start);
    if (found == std::string_view::npos) break;
    out.emplace_back(text.substr(start, found - start));
    start = found + sep->size();
  }
  out.emplace_back(text.substr(start));
  return out;
}

std::vector<std::string> RSplit(std::string_view text, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  if (!sep) return RSplitWhitespace(text, maxsplit);
  RequireSeparator(*sep);
  std::vector<std::string> out;
  size_t end = text.size();
  int64_t count = Limit(maxsplit);
  while (count-- > 0 && end >= sep->size()) {
    const size_t found = text.rfind(*sep, end - sep->size());
    if (found == std::string_view::npos) break;
    out.emplace_back(text.substr(found + sep->size(), end - found - sep->size()));
    end = found;
  }
  out.emplace_back(text.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> SplitLines(std::string_view text, bool keepends) {
  const std::u32string s = DecodeUtf8(text);
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    while (i < s.size() && !IsLineBreak(s[i])) ++i;
    size_t line_end = i;
    if (i < s.size()) {
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      ++i;
      if (keepends) line_end = i;
    }
    out.push_back(EncodeUtf8(s.substr(start, line_end - start)));
  }
  return out;
}

std::string Replace(std::string_view text, std::string_view old, std::string_view replacement,
                    int64_t count) {
  int64_t remaining = Limit(count);
  std::string out;
  if (old.empty()) {
    size_t pos = 0;
    while (pos < text.size()) {
      if (remaining-- > 0) out.append(replacement);
      const size_t start = pos;
      NextCodePoint(text, &pos);
      out.append(text.substr(start, pos - start));
    }
    if (remaining > 0) out.append(replacement);
    return out;
  }
  size_t start = 0;
  while (remaining-- > 0) {
    const size_t found = text.find(old, start);
    if (found == std::string_view::npos) break;
    out.append(text.substr(start, found - start)).append(replacement);
    start = found + old.size();
  }
  out.append(text.substr(start));
  return out;
}

int64_t Find(std::string_view text, std::string_view sub) {
  const size_t found = text.find(sub);
  if (found == std::string_view::npos) return -1;
  return static_cast<int64_t>(CodePointCount(text.substr(0, found)));
}

int64_t RFind(std::string_view text, std::string_view sub) {
  const size_t found = text.rfind(sub);
  if (found == std::string_view::npos) return -1;
  return static_cast<int64_t>(CodePointCount(text.substr(0, found)));
}

int64_t Count(std::string_view text, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(CodePointCount(text)) + 1;
  int64_t count = 0;
  for (size_t found = text.find(sub); found != std::string_view::npos;
       found = text.find(sub, found + sub.size())) {
    ++count;
  }
  return count;
}

std::string Upper(std::string_view text) { return MapCase(text, CaseOp::kUpper, "upper()"); }
std::string Lower(std::string_view text) { return MapCase(text, CaseOp::kLower, "lower()"); }

std::string Title(std::string_view text) {
  std::string out;
  bool previous_cased = false;
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t c = NextCodePoint(text, &pos);
    RequireKnownCase(c, "title()");
    if (IsAsciiLetter(c)) {
      c = ConvertCase(c, previous_cased ? CaseOp::kLower : CaseOp::kUpper, "title()");
      previous_cased = true;
    } else {
      previous_cased = false;
    }
    AppendUtf8(c, &out);
  }
  return out;
}

std::string Capitalize(std::string_view text) {
  std::string out;
  size_t pos = 0;
  bool first = true;
  while (pos < text.size()) {
    const char32_t c = NextCodePoint(text, &pos);
    AppendUtf8(ConvertCase(c, first ? CaseOp::kUpper : CaseOp::kLower, "capitalize()"), &out);
    first = false;
  }
  return out;
}

bool IsLower(std::string_view text) {
  bool cased = false;
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t c = NextCodePoint(text, &pos);
    RequireKnownCase(c, "islower()");
    if (IsAsciiUpper(c)) return false;
    if (IsAsciiLower(c)) cased = true;
  }
  return cased;
}

bool IsUpper(std::string_view text) {
  bool cased = false;
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t c = NextCodePoint(text, &pos);
    RequireKnownCase(c, "isupper()");
    if (IsAsciiLower(c)) return false;
    if (IsAsciiUpper(c)) cased = true;
  }
  return cased;
}

std::string Pad(std::string_view text, int64_t width, std::string_view fill, Align align) {
  const int64_t length = static_cast<int64_t>(CodePointCount(text));
  if (width <= length) return std::string(text);
  const int64_t pad = width - length;
  int64_t left = 0;
  switch (align) {
    case Align::kLeft: left = 0; break;
    case Align::kRight: left = pad; break;
    case Align::kCenter: left = pad / 2 + (pad & width & 1); break;
  }
  std::string out;
  for (int64_t i = 0; i < left; ++i) out.append(fill);
  out.append(text);
  for (int64_t i = left; i < pad; ++i) out.append(fill);
  return out;
}

}  // namespace kappa::tasks::jinja
