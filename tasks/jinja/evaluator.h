// Runs a parsed template: statements write output, expressions evaluate
// with Python's semantics (python_ops.h, attributes.h), filters, tests and
// globals come from their registries, and macros are callables closed over
// their defining scope.
#pragma once

#include <string>

#include "tasks/jinja/ast.h"
#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

// Renders `program` with `variables` as the render context. Throws
// RenderError (with the template line of the failing node).
std::string Evaluate(const Program& program, const Dict& variables);

}  // namespace kappa::tasks::jinja
