// jinja2's tests (tests.py), the `x is name(args)` operators: all of them:
// boolean callable defined divisibleby eq/equalto/== escaped even false
// filter float ge/>= gt/greaterthan/> in integer iterable le/<= lower
// lt/lessthan/< mapping ne/!= none number odd sameas sequence string test
// true undefined upper. `sameas` is Python's `is`, implemented for None,
// booleans and containers (identity); for strings and numbers, whose
// identity CPython leaves to interning, it is Unsupported.
#pragma once

#include <string_view>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

bool IsKnownTest(std::string_view name);

bool ApplyTest(std::string_view name, const Value& value, const CallArgs& args);

}  // namespace kappa::tasks::jinja
