// A compiled Jinja template: kappa's interpreter for the Jinja subset that
// Hugging Face chat templates use, with the semantics of jinja2 3.1's
// ImmutableSandboxedEnvironment (default Undefined, autoescape off).
//
// This is the module boundary: the interpreter's internal exceptions
// (errors.h) are converted here, in template.cc's four functions below, and
// nowhere else, into absl::InvalidArgumentError.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tasks/jinja/lexer.h"
#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

struct Program;

// FromJson (json_value.h) at the module boundary: InvalidArgumentError for
// what the interpreter cannot hold (an integer beyond int64).
absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json);
// ParseJson (json_value.h) at the module boundary, likewise.
absl::StatusOr<Value> ValueFromJsonText(std::string_view text);

class Template {
 public:
  // InvalidArgumentError "template line N: <message>" for a syntax error or
  // a construct kappa does not implement (named in the message).
  static absl::StatusOr<Template> Parse(std::string_view source, const LexerOptions& options = {});

  // Renders with `variables` (string keys) as the context. A render error is
  // InvalidArgumentError "template line N: <Type>: <message>", <Type> being
  // the Python exception jinja2 raises (TemplateError for raise_exception,
  // UndefinedError, TypeError, ...) or Unsupported.
  absl::StatusOr<std::string> Render(const Dict& variables) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;  // Shared: copies are cheap.
};

}  // namespace kappa::tasks::jinja
