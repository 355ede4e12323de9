// Python-style binding of call arguments (positional, then keyword) to a
// function's named parameters, for filters, tests, methods and globals.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

class BoundArguments {
 public:
  // TypeError, as Python raises it, for too many positional arguments, an
  // unknown or repeated keyword, or a missing one of the first `required`.
  BoundArguments(const CallArgs& args, std::string_view function,
                 std::initializer_list<std::string_view> parameters, size_t required = 0);

  bool has(size_t index) const { return values_[index].has_value(); }
  // The argument, or `fallback` when it was not passed (a copy: the fallback
  // is often a temporary).
  Value get(size_t index, const Value& fallback) const;
  const Value& get(size_t index) const { return *values_[index]; }

  // The argument as a str / int / bool, with a TypeError naming the
  // parameter when it has another type.
  std::string GetString(size_t index, std::string fallback) const;
  int64_t GetInt(size_t index, int64_t fallback) const;
  bool GetTruthy(size_t index, bool fallback) const;

 private:
  std::string function_;
  std::vector<std::string> names_;
  std::vector<std::optional<Value>> values_;
};

}  // namespace kappa::tasks::jinja
