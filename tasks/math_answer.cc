#include "tasks/math_answer.h"

#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/str_replace.h"
#include "tasks/ascii_text.h"

namespace kappa::tasks {
namespace {

constexpr size_t kNpos = std::string_view::npos;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

bool HasAt(std::string_view text, size_t pos, std::string_view what) {
  return pos <= text.size() && text.substr(pos, what.size()) == what;
}

bool DigitAt(std::string_view text, size_t pos) { return pos < text.size() && IsDigit(text[pos]); }

// The '}' that closes the '{' at `open`, or kNpos. A backslash escapes the
// next character, so \{ and \} are not braces.
size_t MatchingBrace(std::string_view text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '{') {
      ++depth;
    } else if (text[i] == '}' && --depth == 0) {
      return i;
    }
  }
  return kNpos;
}

// --- Rule 1: the final answer.

// What starts at `pos`: no box, a box that never closes, or a box's content.
struct BoxMatch {
  bool is_box = false;
  std::optional<std::string_view> content;  // nullopt: unclosed
};

BoxMatch MatchBox(std::string_view text, size_t pos) {
  const bool boxed = HasAt(text, pos, "\\boxed");
  if (!boxed && !HasAt(text, pos, "\\fbox")) return {};
  const size_t name_end = pos + (boxed ? 6 : 5);
  size_t next = name_end;
  while (next < text.size() && IsAsciiSpace(text[next])) ++next;
  if (next < text.size() && text[next] == '{') {
    const size_t close = MatchingBrace(text, next);
    if (close == kNpos) return {true, std::nullopt};
    return {true, text.substr(next + 1, close - next - 1)};
  }
  // "\boxed 5$": up to the next '$'.
  if (boxed && next > name_end && next < text.size()) {
    const std::string_view rest = text.substr(next);
    return {true, TrimAsciiSpace(rest.substr(0, rest.find('$')))};
  }
  return {};  // \boxedfoo, or \boxed at the very end
}

// The length of the thousands separator at `pos` (",", "{,}", ",\!" and the
// spaces after it), or 0.
size_t ThousandsSeparatorAt(std::string_view text, size_t pos) {
  if (HasAt(text, pos, "{,}")) return 3;
  if (HasAt(text, pos, ",\\!")) {
    size_t end = pos + 3;
    while (end < text.size() && IsAsciiSpace(text[end])) ++end;
    return end - pos;
  }
  return HasAt(text, pos, ",") ? 1 : 0;
}

// The length of the number that starts at `pos`, or 0.
size_t NumberLengthAt(std::string_view text, size_t pos) {
  size_t i = pos;
  if (i < text.size() && text[i] == '-') ++i;
  size_t end = i;
  while (DigitAt(text, end)) ++end;
  const size_t integer_digits = end - i;
  if (integer_digits >= 1 && integer_digits <= 3) {
    // Groups of exactly three digits after a separator.
    for (;;) {
      const size_t separator = ThousandsSeparatorAt(text, end);
      const size_t group = end + separator;
      if (separator == 0 || !DigitAt(text, group) || !DigitAt(text, group + 1) ||
          !DigitAt(text, group + 2) || DigitAt(text, group + 3)) {
        break;
      }
      end = group + 3;
    }
  }
  // A fraction part needs a digit after the point: "18." ends at 18.
  if (HasAt(text, end, ".") && DigitAt(text, end + 1)) {
    end += 1;
    while (DigitAt(text, end)) ++end;
  }
  return end == i ? 0 : end - pos;
}

std::optional<std::string> AfterLastHashes(std::string_view response) {
  const size_t hashes = response.rfind("####");
  if (hashes == kNpos) return std::nullopt;
  const std::string_view rest = response.substr(hashes + 4);
  return std::string(TrimAsciiSpace(rest.substr(0, rest.find('\n'))));
}

// --- Rule 3: normalization steps.

void Remove(std::string& text, std::string_view what) {
  absl::StrReplaceAll({{absl::string_view(what.data(), what.size()), ""}}, &text);
}

// Removes `command` ("\\left") where no letter follows, so \leftarrow stays.
std::string RemoveCommand(std::string_view text, std::string_view command) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (HasAt(text, i, command) &&
        !(i + command.size() < text.size() && IsLetter(text[i + command.size()]))) {
      i += command.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

// "10\text{ cm}^2" -> "10": a final \text{ ...} (no braces inside) whose text
// starts with a space, optionally followed by ^digit.
std::string DropTrailingTextUnit(std::string_view text) {
  text = TrimAsciiSpace(text);
  std::string_view body = text;
  if (body.size() >= 2 && body[body.size() - 2] == '^' && IsDigit(body.back())) {
    body.remove_suffix(2);
  }
  // The shortest unit is \text{ } (8 characters).
  if (body.size() < 8 || body.back() != '}') return std::string(text);
  const size_t open = body.find_last_of("{}", body.size() - 2);
  if (open == kNpos || body[open] != '{' || open < 5 || body.substr(open - 5, 6) != "\\text{" ||
      !HasAt(body, open + 1, " ")) {
    return std::string(text);
  }
  return std::string(body.substr(0, open - 5));
}

// "\text{(A)}" -> "(A)" where the text has no braces inside.
std::string UnwrapText(std::string_view text) {
  std::string out;
  size_t i = 0;
  for (size_t command = text.find("\\text{"); command != kNpos; command = text.find("\\text{", i)) {
    const size_t open = command + 5;
    const size_t brace = text.find_first_of("{}", open + 1);
    out.append(text.substr(i, command - i));
    if (brace != kNpos && text[brace] == '}') {
      out.append(text.substr(open + 1, brace - open - 1));
      i = brace + 1;
    } else {
      out.append(text.substr(command, open + 1 - command));
      i = open + 1;
    }
  }
  out.append(text.substr(i));
  return out;
}

// ",\!" and the whitespace after it.
std::string RemoveThinSpaceSeparators(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (HasAt(text, i, ",\\!")) {
      i = i + ThousandsSeparatorAt(text, i);
    } else {
      out += text[i++];
    }
  }
  return out;
}

// "-1,234,567.5": commas between groups of three digits, nothing else.
bool IsCommaGroupedNumber(std::string_view text) {
  if (text.find(',') == kNpos) return false;
  size_t i = HasAt(text, 0, "-") ? 1 : 0;
  size_t digits = 0;
  while (DigitAt(text, i + digits)) ++digits;
  if (digits < 1 || digits > 3) return false;
  i += digits;
  while (HasAt(text, i, ",")) {
    for (size_t k = 1; k <= 3; ++k) {
      if (!DigitAt(text, i + k)) return false;
    }
    i += 4;
  }
  if (HasAt(text, i, ".") && DigitAt(text, i + 1)) {
    for (++i; DigitAt(text, i);) ++i;
  }
  return i == text.size();
}

std::string RemoveWhitespace(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (!IsAsciiSpace(c)) out += c;
  }
  return out;
}

bool IsAsciiAlnum(char c) { return IsDigit(c) || IsLetter(c); }

// For each '{', the index of its '}' (kNpos if it never closes); escapes as
// in MatchingBrace. One pass, so long answers cost linear time.
std::vector<size_t> ClosingBraces(std::string_view text) {
  std::vector<size_t> closing(text.size(), kNpos);
  std::vector<size_t> open;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '{') {
      open.push_back(i);
    } else if (text[i] == '}' && !open.empty()) {
      closing[open.back()] = i;
      open.pop_back();
    }
  }
  return closing;
}

// The arguments of \frac (two) and \sqrt (one) written as one character get
// braces: \frac34 -> \frac{3}{4}, \frac3{4} -> \frac{3}{4}, \sqrt3 -> \sqrt{3}.
// Runs on text without whitespace.
std::string BraceShorthandArguments(std::string_view text) {
  const std::vector<size_t> closing = ClosingBraces(text);
  std::vector<bool> wrap(text.size(), false);
  for (size_t command = text.find('\\'); command != kNpos; command = text.find('\\', command + 1)) {
    const bool frac = HasAt(text, command, "\\frac");
    if (!frac && !HasAt(text, command, "\\sqrt")) continue;
    size_t argument = command + 5;  // \frac and \sqrt are 5 characters each
    for (int n = 0; n < (frac ? 2 : 1) && argument < text.size(); ++n) {
      if (text[argument] == '{' && closing[argument] != kNpos) {
        argument = closing[argument] + 1;
      } else if (IsAsciiAlnum(text[argument])) {
        wrap[argument++] = true;
      } else {
        break;
      }
    }
  }
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (wrap[i]) out += '{';
    out += text[i];
    if (wrap[i]) out += '}';
  }
  return out;
}

// --- Rule 4: exact numbers.

struct Fraction128 {
  absl::uint128 numerator;
  absl::uint128 denominator;
};

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

// A decimal "12", "1.50", ".5", "5." (no sign) as digits / 10^k, each below
// 2^64; nullopt otherwise.
std::optional<Fraction128> ParseDecimal(std::string_view text) {
  const size_t point = text.find('.');
  std::string_view integer = text.substr(0, point);
  std::string_view fraction = point == kNpos ? std::string_view() : text.substr(point + 1);
  if (integer.empty() && fraction.empty()) return std::nullopt;
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (fraction.size() > 19) return std::nullopt;  // 10^20 > 2^64
  absl::uint128 numerator = 0;
  for (std::string_view part : {integer, fraction}) {
    for (char c : part) {
      if (!IsDigit(c)) return std::nullopt;
      numerator = numerator * 10 + static_cast<uint64_t>(c - '0');
      if (numerator > kMax64) return std::nullopt;
    }
  }
  absl::uint128 denominator = 1;
  for (size_t k = 0; k < fraction.size(); ++k) denominator *= 10;
  return Fraction128{numerator, denominator};
}

// "-"? then a decimal; `negative` flips on the minus.
std::optional<Fraction128> ParseSignedDecimal(std::string_view text, bool* negative) {
  if (HasAt(text, 0, "-")) {
    *negative = !*negative;
    text.remove_prefix(1);
  }
  return ParseDecimal(text);
}

absl::uint128 Gcd(absl::uint128 a, absl::uint128 b) {
  while (b != 0) {
    const absl::uint128 r = a % b;
    a = b;
    b = r;
  }
  return a;
}

// (top / bottom) in lowest terms, if it fits the 64-bit bound.
std::optional<Rational> Reduce(bool negative, Fraction128 top, Fraction128 bottom) {
  // Operands are below 2^64, so the products fit in 128 bits.
  absl::uint128 numerator = top.numerator * bottom.denominator;
  absl::uint128 denominator = top.denominator * bottom.numerator;
  if (denominator == 0) return std::nullopt;
  const absl::uint128 gcd = Gcd(numerator, denominator);
  numerator /= gcd;
  denominator /= gcd;
  if (numerator > kMax64 || denominator > kMax64) return std::nullopt;
  return Rational{negative && numerator != 0, absl::Uint128Low64(numerator),
                  absl::Uint128Low64(denominator)};
}

}  // namespace

std::optional<std::string> LastBoxedAnswer(std::string_view response) {
  // The box that starts last decides, closed or not.
  for (size_t pos = response.rfind('\\'); pos != kNpos;
       pos = pos == 0 ? kNpos : response.rfind('\\', pos - 1)) {
    const BoxMatch box = MatchBox(response, pos);
    if (!box.is_box) continue;
    if (!box.content.has_value()) return std::nullopt;
    return std::string(*box.content);
  }
  return std::nullopt;
}

std::optional<std::string> LastNumber(std::string_view text) {
  std::optional<std::string> last;
  for (size_t i = 0; i < text.size();) {
    const size_t length = NumberLengthAt(text, i);
    if (length == 0) {
      ++i;
    } else {
      last = std::string(text.substr(i, length));
      i += length;
    }
  }
  return last;
}

std::optional<std::string> ExtractMathAnswer(std::string_view response, bool strict) {
  if (std::optional<std::string> boxed = LastBoxedAnswer(response)) return boxed;
  if (strict) return std::nullopt;
  if (std::optional<std::string> hashed = AfterLastHashes(response)) return hashed;
  return LastNumber(response);
}

std::string_view MathReferenceAnswer(std::string_view reference) {
  const size_t hashes = reference.rfind("####");
  return TrimAsciiSpace(hashes == kNpos ? reference : reference.substr(hashes + 4));
}

std::string NormalizeMathAnswer(std::string_view answer) {
  std::string text(TrimAsciiSpace(answer));
  Remove(text, "\\$");
  Remove(text, "$");
  text = RemoveCommand(RemoveCommand(text, "\\left"), "\\right");
  absl::StrReplaceAll({{"\\dfrac", "\\frac"}, {"\\tfrac", "\\frac"}}, &text);
  Remove(text, "\\%");
  Remove(text, "%");
  Remove(text, "^{\\circ}");
  Remove(text, "^\\circ");
  text = UnwrapText(DropTrailingTextUnit(text));
  Remove(text, "{,}");
  text = std::string(TrimAsciiSpace(RemoveThinSpaceSeparators(text)));
  if (IsCommaGroupedNumber(text)) Remove(text, ",");
  return BraceShorthandArguments(RemoveWhitespace(text));
}

std::optional<Rational> ParseExactNumber(std::string_view normalized) {
  bool negative = false;
  std::string_view text = normalized;
  if (HasAt(text, 0, "-")) {
    negative = true;
    text.remove_prefix(1);
  }
  std::optional<Fraction128> top;
  std::optional<Fraction128> bottom = Fraction128{1, 1};
  if (HasAt(text, 0, "\\frac{")) {
    // \frac{-?D}{-?D}
    text.remove_prefix(6);
    const size_t close = text.find('}');
    if (close == kNpos || !HasAt(text, close, "}{") || text.back() != '}') return std::nullopt;
    top = ParseSignedDecimal(text.substr(0, close), &negative);
    bottom = ParseSignedDecimal(text.substr(close + 2, text.size() - close - 3), &negative);
  } else if (const size_t slash = text.find('/'); slash != kNpos) {
    top = ParseDecimal(text.substr(0, slash));
    bottom = ParseDecimal(text.substr(slash + 1));
  } else {
    top = ParseDecimal(text);
  }
  if (!top.has_value() || !bottom.has_value()) return std::nullopt;
  return Reduce(negative, *top, *bottom);
}

std::string_view AssignedValue(std::string_view normalized) {
  if (normalized.size() < 3 || !IsLetter(normalized[0]) || normalized[1] != '=') {
    return normalized;
  }
  const std::string_view value = normalized.substr(2);
  return value.find('=') == kNpos ? value : normalized;
}

namespace {

bool NormalizedAnswersEqual(std::string_view left, std::string_view right) {
  if (left.empty() || right.empty()) return false;
  const std::optional<Rational> left_number = ParseExactNumber(left);
  const std::optional<Rational> right_number = ParseExactNumber(right);
  if (left_number.has_value() && right_number.has_value()) return *left_number == *right_number;
  return left == right;
}

}  // namespace

bool MathAnswersEqual(std::string_view a, std::string_view b) {
  return NormalizedAnswersEqual(NormalizeMathAnswer(a), NormalizeMathAnswer(b));
}

float MathReward(std::string_view reference, std::string_view response, bool strict) {
  const std::optional<std::string> answer = ExtractMathAnswer(response, strict);
  if (!answer.has_value()) return 0.0f;
  const std::string expected = NormalizeMathAnswer(MathReferenceAnswer(reference));
  const std::string got = NormalizeMathAnswer(*answer);
  // Rule 3b: an equation as the reference is compared as one.
  const std::string_view compared =
      expected.find('=') == std::string::npos ? AssignedValue(got) : std::string_view(got);
  return NormalizedAnswersEqual(compared, expected) ? 1.0f : 0.0f;
}

}  // namespace kappa::tasks
