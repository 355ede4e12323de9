#include "tasks/jinja/template.h"

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tasks/jinja/ast.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/evaluator.h"
#include "tasks/jinja/json_value.h"
#include "tasks/jinja/parser.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {

absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json) {
  try {
    return FromJson(json);
  } catch (const RenderError& error) {
    return absl::InvalidArgumentError(error.what());
  }
}

absl::StatusOr<Value> ValueFromJsonText(std::string_view text) {
  try {
    return ParseJson(text);
  } catch (const RenderError& error) {
    return absl::InvalidArgumentError(error.what());
  }
}

absl::StatusOr<Template> Template::Parse(std::string_view source, const LexerOptions& options) {
  if (!IsValidUtf8(source)) return absl::InvalidArgumentError("template is not valid UTF-8");
  try {
    auto program = std::make_shared<Program>(jinja::Parse(Tokenize(source, options)));
    return Template(std::move(program));
  } catch (const SyntaxError& error) {
    return absl::InvalidArgumentError(absl::StrCat("template line ", error.line(), ": ", error.what()));
  } catch (const RenderError& error) {
    // A literal the parser evaluates (e.g. an escape) failing like a value.
    return absl::InvalidArgumentError(
        absl::StrCat("template line ", error.line(), ": ", error.type(), ": ", error.what()));
  }
}

absl::StatusOr<std::string> Template::Render(const Dict& variables) const {
  try {
    return Evaluate(*program_, variables);
  } catch (const RenderError& error) {
    return absl::InvalidArgumentError(
        absl::StrCat("template line ", error.line(), ": ", error.type(), ": ", error.what()));
  }
}

}  // namespace kappa::tasks::jinja
