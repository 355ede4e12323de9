// Python's operators on interpreter values, with Python's results and error
// messages: truthiness, ==, ordering, arithmetic, `in`. An Undefined operand
// raises its UndefinedError wherever jinja2's Undefined would.
#pragma once

#include <string_view>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

bool Truthy(const Value& value);

bool PythonEquals(const Value& a, const Value& b);

enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe };
// a <op> b. Ordering of unorderable types is a TypeError
// ("'<' not supported between instances of 'int' and 'str'").
bool Compare(CompareOp op, const Value& a, const Value& b);

// Python's `item in container` (str: substring; list/tuple: any ==; dict:
// key; Undefined: empty). TypeError for non-containers.
bool Contains(const Value& container, const Value& item);

Value Add(const Value& a, const Value& b);
Value Subtract(const Value& a, const Value& b);
Value Multiply(const Value& a, const Value& b);
Value TrueDivide(const Value& a, const Value& b);
Value FloorDivide(const Value& a, const Value& b);
Value Modulo(const Value& a, const Value& b);
Value Power(const Value& a, const Value& b);
Value Negate(const Value& a);
Value Positive(const Value& a);

// Checked int64 arithmetic: an OverflowError where Python would go to a big
// integer.
int64_t CheckedAdd(int64_t a, int64_t b);
int64_t CheckedMultiply(int64_t a, int64_t b);

}  // namespace kappa::tasks::jinja
