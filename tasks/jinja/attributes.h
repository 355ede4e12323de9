// `obj.name` and `obj[key]` as jinja2's SandboxedEnvironment resolves them:
// getattr tries the Python attribute (a method) before the item, getitem the
// item before the attribute, and a miss is an Undefined that remembers what
// was looked up ("'dict object' has no attribute 'tool_calls'"). Only an
// Undefined object raises.
#pragma once

#include <optional>
#include <string_view>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

Value GetAttr(const Value& object, std::string_view name);
Value GetItem(const Value& object, const Value& key);

// obj[start:stop:step] with Python's slice rules (None = omitted). A slice
// of a dict or non-sequence is Undefined, as the sandbox's getitem returns.
Value GetSlice(const Value& object, const std::optional<Value>& start,
               const std::optional<Value>& stop, const std::optional<Value>& step);

}  // namespace kappa::tasks::jinja
