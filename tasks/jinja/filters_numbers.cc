// Number filters: abs, float, int, round, with Python's conversions.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

#include "tasks/jinja/arguments.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/filters_internal.h"
#include "tasks/jinja/python_str.h"

namespace kappa::tasks::jinja::filters {
namespace {

bool IsDigitIn(char c, int base) {
  int d;
  if (c >= '0' && c <= '9') {
    d = c - '0';
  } else if (c >= 'a' && c <= 'z') {
    d = c - 'a' + 10;
  } else if (c >= 'A' && c <= 'Z') {
    d = c - 'A' + 10;
  } else {
    return false;
  }
  return d < base;
}

// Removes Python's digit-group underscores ("1_000"), which must sit
// between two digits; nullopt when one does not.
std::optional<std::string> RemoveUnderscores(const std::string& text, int base) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '_') {
      out.push_back(text[i]);
      continue;
    }
    if (i == 0 || i + 1 >= text.size() || !IsDigitIn(text[i + 1], base) ||
        !(IsDigitIn(text[i - 1], base) || (base != 10 && std::isalpha(static_cast<unsigned char>(text[i - 1]))))) {
      return std::nullopt;
    }
  }
  return out;
}

// Python's float(str); nullopt where it raises ValueError.
std::optional<double> ParsePythonFloat(const std::string& raw) {
  const std::string stripped = Strip(raw, std::nullopt, StripSide::kBoth);
  const std::optional<std::string> text = RemoveUnderscores(stripped, 10);
  if (!text || text->empty()) return std::nullopt;
  size_t i = 0;
  const std::string& s = *text;
  if (s[i] == '+' || s[i] == '-') ++i;
  std::string rest = s.substr(i);
  for (char& c : rest) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (rest == "inf" || rest == "infinity" || rest == "nan") {
    return std::strtod(s.c_str(), nullptr);
  }
  size_t digits = 0, j = i;
  while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j, ++digits;
  if (j < s.size() && s[j] == '.') {
    ++j;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j, ++digits;
  }
  if (digits == 0) return std::nullopt;
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    ++j;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exponent_start = j;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j == exponent_start) return std::nullopt;
  }
  if (j != s.size()) return std::nullopt;
  return std::strtod(s.c_str(), nullptr);
}

// Python's int(str, base); nullopt where it raises ValueError.
std::optional<int64_t> ParsePythonInt(const std::string& raw, int64_t base) {
  if (base != 0 && (base < 2 || base > 36)) ThrowValueError("int() base must be >= 2 and <= 36, or 0");
  std::string s = Strip(raw, std::nullopt, StripSide::kBoth);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.erase(0, 1);
  }
  auto has_prefix = [&](char letter) {
    return s.size() >= 2 && s[0] == '0' && std::tolower(static_cast<unsigned char>(s[1])) == letter;
  };
  int radix = static_cast<int>(base);
  const char prefixes[] = {'x', 'o', 'b'};
  const int radixes[] = {16, 8, 2};
  for (int k = 0; k < 3; ++k) {
    if (has_prefix(prefixes[k]) && (base == 0 || base == radixes[k])) {
      radix = radixes[k];
      s.erase(0, 2);
      if (!s.empty() && s[0] == '_') s.erase(0, 1);
      break;
    }
  }
  if (radix == 0) {
    radix = 10;
    // Base 0 rejects leading zeros ("010") except in zero itself.
    if (s.size() > 1 && s[0] == '0' && s.find_first_not_of("0_") != std::string::npos) {
      return std::nullopt;
    }
  }
  const std::optional<std::string> digits = RemoveUnderscores(s, radix);
  if (!digits || digits->empty()) return std::nullopt;
  for (char c : *digits) {
    if (!IsDigitIn(c, radix)) return std::nullopt;
  }
  errno = 0;
  const long long value = std::strtoll(digits->c_str(), nullptr, radix);
  if (errno == ERANGE) ThrowUnsupported("integer does not fit in 64 bits");
  return negative ? -value : value;
}

// int(float): truncation; OverflowError for inf, ValueError (nullopt) for nan.
std::optional<int64_t> TruncateFloat(double value) {
  if (std::isnan(value)) return std::nullopt;
  if (std::isinf(value)) {
    throw RenderError("OverflowError", "cannot convert float infinity to integer");
  }
  if (value >= 9.2e18 || value <= -9.2e18) ThrowUnsupported("integer does not fit in 64 bits");
  return static_cast<int64_t>(value);
}

}  // namespace

Value Abs(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "abs", {});
  if (input.is_integer()) {
    if (input.as_int() == std::numeric_limits<int64_t>::min()) ThrowUnsupported("integer overflow");
    return Value::Int(std::llabs(input.as_int()));
  }
  if (input.kind() == Kind::kFloat) return Value::Float(std::fabs(input.as_float()));
  ThrowTypeError("bad operand type for abs(): '" + TypeName(input) + "'");
}

// do_float(value, default=0.0).
Value Float(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_float", {"default"});
  if (input.is_undefined()) input.ThrowUndefined();
  if (input.is_number()) return Value::Float(input.as_float());
  if (input.is_string()) {
    if (std::optional<double> parsed = ParsePythonFloat(input.as_string())) {
      return Value::Float(*parsed);
    }
  }
  return bound.get(0, Value::Float(0.0));
}

// do_int(value, default=0, base=10): int(value[, base]), then int(float(value)).
Value Int(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_int", {"default", "base"});
  if (input.is_undefined()) input.ThrowUndefined();
  const Value fallback = bound.get(0, Value::Int(0));
  if (input.is_integer()) return Value::Int(input.as_int());
  if (input.kind() == Kind::kFloat) {
    const std::optional<int64_t> truncated = TruncateFloat(input.as_float());
    return truncated ? Value::Int(*truncated) : fallback;
  }
  if (!input.is_string()) return fallback;
  if (std::optional<int64_t> parsed = ParsePythonInt(input.as_string(), bound.GetInt(1, 10))) {
    return Value::Int(*parsed);
  }
  if (std::optional<double> parsed = ParsePythonFloat(input.as_string())) {
    if (std::optional<int64_t> truncated = TruncateFloat(*parsed)) return Value::Int(*truncated);
  }
  return fallback;
}

// do_round(value, precision=0, method='common'): Python's round() (correctly
// rounded, ties to even on the exact binary value) or ceil/floor.
Value Round(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_round", {"precision", "method"});
  const int64_t precision = bound.GetInt(0, 0);
  const std::string method = bound.GetString(1, "common");
  if (method != "common" && method != "ceil" && method != "floor") {
    throw RenderError("FilterArgumentError", "method must be common, ceil or floor");
  }
  if (!input.is_number()) {
    ThrowTypeError("type " + TypeName(input) + " doesn't define __round__ method");
  }
  if (precision < 0) ThrowUnsupported("kappa implements round() for precision >= 0 only");
  if (method == "common") {
    if (input.is_integer()) return Value::Int(input.as_int());
    const double value = input.as_float();
    if (!std::isfinite(value)) return input;
    char buffer[512];
    std::snprintf(buffer, sizeof buffer, "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)),
                  value);
    return Value::Float(std::strtod(buffer, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = input.as_float() * scale;
  return Value::Float((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

}  // namespace kappa::tasks::jinja::filters
