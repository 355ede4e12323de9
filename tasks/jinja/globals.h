// The global functions a chat template can call: jinja2's range (with the
// sandbox's 100000-item limit), dict and namespace, and the two transformers
// adds, raise_exception(message) and strftime_now(format).
// (lipsum, cycler and joiner are not implemented.)
#pragma once

#include <optional>
#include <string_view>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

bool IsGlobalFunction(std::string_view name);

// The callable bound to a global name, or nullopt.
std::optional<Value> LookupGlobal(std::string_view name);

}  // namespace kappa::tasks::jinja
