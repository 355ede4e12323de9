// JSON in and out of the interpreter: json.loads-style conversion of the
// render variables (object order kept, as Python's dict keeps it) and
// Python's json.dumps, which transformers' `tojson` filter calls.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

// null -> None, true -> True, 12 -> int, 1.5 / 1e3 -> float, arrays -> list,
// objects -> dict in document order. Integers beyond int64 are refused.
Value FromJson(const nlohmann::ordered_json& json);

// json.loads(text): FromJson of the parsed text. ValueError for text that is
// not JSON; Unsupported for an integer literal beyond int64 (which the JSON
// library would silently turn into a float).
Value ParseJson(std::string_view text);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // Python's indent=N is N spaces.
  std::optional<std::string> item_separator;  // Default ", " (",\n" with indent).
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(value, ...) byte for byte; TypeError "Object of type X is not
// JSON serializable" for what json cannot encode (Undefined, namespace, ...).
std::string JsonDumps(const Value& value, const JsonDumpOptions& options);

}  // namespace kappa::tasks::jinja
