// Methods of Python's str, dict, list and tuple as templates call them
// (`message.content.startswith('<tool_response>')`, `tool.items()`).
//
// Implemented: str.strip lstrip rstrip split rsplit splitlines startswith
// endswith upper lower title capitalize replace find rfind index rindex count
// join isalnum isalpha isdigit isspace islower isupper removeprefix
// removesuffix center ljust rjust zfill partition rpartition; dict.items
// keys values get; list/tuple.count index. The immutable sandbox's
// mutating methods (list.append, dict.update, ...) are SecurityErrors as in
// jinja2; list.pop/clear (which the sandbox allows) are Unsupported.
#pragma once

#include <string_view>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

// True for a method name the parser accepts in `x.name(...)`: one above or
// a loop method (cycle, changed).
bool IsCallableMethodName(std::string_view name);

// Python's getattr(obj, name) for the built-in types when `name` is one of
// their methods: the bound method, or the sandbox's "unsafe" Undefined
// (SecurityError when used). nullopt when the type has no such method.
std::optional<Value> LookupMethod(const Value& object, std::string_view name);

}  // namespace kappa::tasks::jinja
