#include "tasks/jinja/python_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "tasks/jinja/errors.h"
#include "tasks/jinja/loop.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {
namespace {

void AppendHexEscape(char prefix, unsigned width, char32_t c, std::string* out) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "\\%c%0*x", prefix, static_cast<int>(width),
                static_cast<unsigned>(c));
  out->append(buffer);
}

// Python's unicode_repr: single quotes unless the text has ' and no ".
std::string StringRepr(const std::string& text) {
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t c = NextCodePoint(text, &pos);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out.append("\\t");
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (IsPythonPrintable(c)) {
      out.append(text, start, pos - start);
    } else if (c <= 0xFF) {
      AppendHexEscape('x', 2, c, &out);
    } else if (c <= 0xFFFF) {
      AppendHexEscape('u', 4, c, &out);
    } else {
      AppendHexEscape('U', 8, c, &out);
    }
  }
  out.push_back(quote);
  return out;
}

std::string JoinRepr(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.append(", ");
    out.append(Repr(items[i]));
  }
  return out;
}

std::string DictRepr(const Dict& dict) {
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : dict.entries()) {
    if (!first) out.append(", ");
    first = false;
    out.append(Repr(key)).append(": ").append(Repr(value));
  }
  return out + "}";
}

std::string ListRepr(const Value& value) {
  const Sequence& sequence = value.as_sequence();
  switch (sequence.flavor) {
    case ListFlavor::kRange: {
      std::string out = "range(" + std::to_string(sequence.range_start) + ", " +
                        std::to_string(sequence.range_stop);
      if (sequence.range_step != 1) out += ", " + std::to_string(sequence.range_step);
      return out + ")";
    }
    case ListFlavor::kDictItems: return "dict_items([" + JoinRepr(sequence.items) + "])";
    case ListFlavor::kDictKeys: return "dict_keys([" + JoinRepr(sequence.items) + "])";
    case ListFlavor::kDictValues: return "dict_values([" + JoinRepr(sequence.items) + "])";
    case ListFlavor::kList: break;
  }
  return "[" + JoinRepr(sequence.items) + "]";
}

}  // namespace

std::string FloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, e.g. "1.2345e+02".
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string_view text(buffer, static_cast<size_t>(result.ptr - buffer));
  const bool negative = text.front() == '-';
  if (negative) text.remove_prefix(1);
  const size_t e = text.find('e');
  std::string digits(text.substr(0, e));
  if (digits.size() > 1) digits.erase(1, 1);  // Drop the '.'.
  const int exponent = std::stoi(std::string(text.substr(e + 1)));
  // Python's repr: positional when -4 <= exponent < 16, else scientific.
  const int decimal_point = exponent + 1;  // Digits before the point.
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (decimal_point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decimal_point), '0') + digits;
    } else if (static_cast<size_t>(decimal_point) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decimal_point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decimal_point)) + "." +
             digits.substr(static_cast<size_t>(decimal_point));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exponent_text[16];
  std::snprintf(exponent_text, sizeof exponent_text, "e%c%02d", exponent < 0 ? '-' : '+',
                exponent < 0 ? -exponent : exponent);
  return out + exponent_text;
}

std::string Repr(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kString: return StringRepr(value.as_string());
    case Kind::kList: return ListRepr(value);
    case Kind::kTuple: {
      const auto& items = value.items();
      return "(" + JoinRepr(items) + (items.size() == 1 ? ",)" : ")");
    }
    case Kind::kDict: return DictRepr(value.as_dict());
    default: return Str(value);
  }
}

std::string Str(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return value.as_bool() ? "True" : "False";
    case Kind::kInt: return std::to_string(value.as_int());
    case Kind::kFloat: return FloatRepr(value.as_float());
    case Kind::kString: return value.as_string();
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kDict: return Repr(value);
    case Kind::kNamespace: return "<Namespace " + DictRepr(value.as_namespace().attributes) + ">";
    case Kind::kLoop: return value.as_loop().Str();
    case Kind::kIterator:
    case Kind::kCallable:
      ThrowUnsupported("kappa cannot print a " + TypeName(value) +
                       " (Python prints its memory address)");
  }
  return "";
}

}  // namespace kappa::tasks::jinja
