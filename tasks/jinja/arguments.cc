#include "tasks/jinja/arguments.h"

#include "tasks/jinja/errors.h"
#include "tasks/jinja/python_ops.h"

namespace kappa::tasks::jinja {

BoundArguments::BoundArguments(const CallArgs& args, std::string_view function,
                               std::initializer_list<std::string_view> parameters,
                               size_t required)
    : function_(function), names_(parameters.begin(), parameters.end()),
      values_(parameters.size()) {
  if (args.positional.size() > names_.size()) {
    ThrowTypeError(function_ + "() takes at most " + std::to_string(names_.size()) +
                   " argument(s) (" + std::to_string(args.positional.size()) + " given)");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = args.positional[i];
  for (const auto& [name, value] : args.keyword) {
    size_t index = 0;
    while (index < names_.size() && names_[index] != name) ++index;
    if (index == names_.size()) {
      ThrowTypeError(function_ + "() got an unexpected keyword argument '" + name + "'");
    }
    if (values_[index]) {
      ThrowTypeError(function_ + "() got multiple values for argument '" + name + "'");
    }
    values_[index] = value;
  }
  for (size_t i = 0; i < required; ++i) {
    if (!values_[i]) {
      ThrowTypeError(function_ + "() missing required argument '" + names_[i] + "'");
    }
  }
}

Value BoundArguments::get(size_t index, const Value& fallback) const {
  return values_[index] ? *values_[index] : fallback;
}

std::string BoundArguments::GetString(size_t index, std::string fallback) const {
  if (!values_[index]) return fallback;
  const Value& value = *values_[index];
  if (value.is_undefined()) value.ThrowUndefined();
  if (!value.is_string()) {
    ThrowTypeError(function_ + "() argument '" + names_[index] + "' must be str, not " +
                   TypeName(value));
  }
  return value.as_string();
}

int64_t BoundArguments::GetInt(size_t index, int64_t fallback) const {
  if (!values_[index]) return fallback;
  const Value& value = *values_[index];
  if (value.is_undefined()) value.ThrowUndefined();
  if (!value.is_integer()) {
    ThrowTypeError("'" + TypeName(value) + "' object cannot be interpreted as an integer");
  }
  return value.as_int();
}

bool BoundArguments::GetTruthy(size_t index, bool fallback) const {
  return values_[index] ? Truthy(*values_[index]) : fallback;
}

}  // namespace kappa::tasks::jinja
