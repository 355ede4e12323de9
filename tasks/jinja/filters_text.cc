// Text filters: each starts from soft_str(value), as jinja2's do.
#include <algorithm>
#include <cctype>
#include <string>

#include "tasks/jinja/arguments.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/filters_internal.h"
#include "tasks/jinja/python_str.h"
#include "tasks/jinja/python_text.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja::filters {
namespace {

void NoArguments(const CallArgs& args, const char* filter) {
  BoundArguments bound(args, filter, {});
}

// do_title's word boundaries: _word_beginning_split_re = ([-\s({\[<]+).
bool IsTitleSeparator(char32_t c) {
  return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPythonSpace(c);
}

}  // namespace

Value Capitalize(const Value& input, const CallArgs& args) {
  NoArguments(args, "do_capitalize");
  return Value::String(jinja::Capitalize(SoftStr(input)));
}

Value Lower(const Value& input, const CallArgs& args) {
  NoArguments(args, "do_lower");
  return Value::String(jinja::Lower(SoftStr(input)));
}

Value Upper(const Value& input, const CallArgs& args) {
  NoArguments(args, "do_upper");
  return Value::String(jinja::Upper(SoftStr(input)));
}

Value String(const Value& input, const CallArgs& args) {
  NoArguments(args, "soft_str");
  return Value::String(SoftStr(input));
}

// do_center(value, width=80).
Value Center(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_center", {"width"});
  return Value::String(Pad(SoftStr(input), bound.GetInt(0, 80), " ", Align::kCenter));
}

// do_trim(value, chars=None): soft_str(value).strip(chars).
Value Trim(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_trim", {"chars"});
  std::optional<std::string> chars;
  if (bound.has(0) && !bound.get(0).is_none()) chars = bound.GetString(0, "");
  return Value::String(Strip(SoftStr(input), chars, StripSide::kBoth));
}

// do_replace(s, old, new, count=None): str(s).replace(str(old), str(new), count).
Value Replace(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_replace", {"old", "new", "count"}, 2);
  const Value count = bound.get(2, Value::None());
  int64_t limit = -1;
  if (!count.is_none()) limit = bound.GetInt(2, -1);
  return Value::String(
      jinja::Replace(Str(input), Str(bound.get(0)), Str(bound.get(1)), limit));
}

// do_title: each word's first character upper-cased, the rest lower-cased.
Value Title(const Value& input, const CallArgs& args) {
  NoArguments(args, "do_title");
  const std::u32string text = DecodeUtf8(SoftStr(input));
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const bool separators = IsTitleSeparator(text[i]);
    size_t end = i;
    while (end < text.size() && IsTitleSeparator(text[end]) == separators) ++end;
    const std::string item = EncodeUtf8(text.substr(i, end - i));
    size_t first_end = 0;
    NextCodePoint(item, &first_end);
    out += jinja::Upper(item.substr(0, first_end)) + jinja::Lower(item.substr(first_end));
    i = end;
  }
  return Value::String(std::move(out));
}

// do_indent(s, width=4, first=False, blank=False).
Value Indent(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_indent", {"width", "first", "blank"});
  if (input.is_undefined()) input.ThrowUndefined();
  if (!input.is_string()) {
    ThrowTypeError("unsupported operand type(s) for +=: '" + TypeName(input) + "' and 'str'");
  }
  const Value width = bound.get(0, Value::Int(4));
  const std::string indention =
      width.is_string() ? width.as_string()
                        : std::string(static_cast<size_t>(std::max<int64_t>(bound.GetInt(0, 4), 0)), ' ');
  const std::vector<std::string> lines = SplitLines(input.as_string() + "\n", false);
  std::string out;
  if (bound.GetTruthy(2, false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + indention;
      out += lines[i];
    }
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += indention;
      out += lines[i];
    }
  }
  if (bound.GetTruthy(1, false)) out = indention + out;
  return Value::String(std::move(out));
}

// do_wordcount: len(re.findall(r"\w+", soft_str(s))), for ASCII text.
Value WordCount(const Value& input, const CallArgs& args) {
  NoArguments(args, "do_wordcount");
  const std::string text = SoftStr(input);
  int64_t count = 0;
  bool in_word = false;
  for (unsigned char c : text) {
    if (c >= 0x80) ThrowUnsupported("kappa implements wordcount for ASCII text only");
    const bool word = std::isalnum(c) || c == '_';
    if (word && !in_word) ++count;
    in_word = word;
  }
  return Value::Int(count);
}

}  // namespace kappa::tasks::jinja::filters
