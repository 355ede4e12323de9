// Python's str() and repr() of interpreter values — what `{{ x }}` prints
// and what error messages quote.
#pragma once

#include <string>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

// str(x): Undefined prints as "", None as "None", True as "True", floats as
// Python's shortest repr ("2.0", "1e-05"), containers as their repr.
// Functions and generators (whose Python text holds an address) are an
// Unsupported error.
std::string Str(const Value& value);

// repr(x): strings quoted and escaped as Python does.
std::string Repr(const Value& value);

// float.__repr__: the shortest round-tripping digits, "inf", "nan", "1e+16".
std::string FloatRepr(double value);

}  // namespace kappa::tasks::jinja
