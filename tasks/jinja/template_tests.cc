#include "tasks/jinja/template_tests.h"

#include <functional>
#include <map>
#include <string>

#include "tasks/jinja/arguments.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/filters.h"
#include "tasks/jinja/python_ops.h"
#include "tasks/jinja/python_str.h"
#include "tasks/jinja/python_text.h"

namespace kappa::tasks::jinja {
namespace {

using Test = std::function<bool(const Value&, const CallArgs&)>;

// A test of the value alone (no arguments).
Test Unary(const char* name, bool (*predicate)(const Value&)) {
  return [name, predicate](const Value& value, const CallArgs& args) {
    BoundArguments bound(args, name, {});
    return predicate(value);
  };
}

// A test comparing the value with one argument.
Test Binary(const char* name, std::function<bool(const Value&, const Value&)> predicate) {
  return [name, predicate](const Value& value, const CallArgs& args) {
    BoundArguments bound(args, name, {"other"}, 1);
    return predicate(value, bound.get(0));
  };
}

Test Comparison(const char* name, CompareOp op) {
  return Binary(name, [op](const Value& a, const Value& b) { return Compare(op, a, b); });
}

bool IsSequence(const Value& v) {
  if (v.is_string() || v.kind() == Kind::kTuple || v.kind() == Kind::kDict || v.is_undefined()) {
    return true;
  }
  if (v.kind() != Kind::kList) return false;
  const ListFlavor flavor = v.as_sequence().flavor;
  return flavor == ListFlavor::kList || flavor == ListFlavor::kRange;
}

bool IsIterable(const Value& v) {
  switch (v.kind()) {
    case Kind::kString:
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kDict:
    case Kind::kIterator:
    case Kind::kUndefined:
    case Kind::kLoop: return true;
    default: return false;
  }
}

// Python's `is`: identity. CPython shares None/True/False and containers
// by reference; strings and numbers have no identity kappa can reproduce.
bool SameAs(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) {
    if ((a.is_number() || a.is_string()) && (b.is_number() || b.is_string())) {
      ThrowUnsupported("kappa implements 'sameas' for none, booleans and containers only");
    }
    return false;
  }
  switch (a.kind()) {
    case Kind::kNone: return true;
    case Kind::kBool: return a.as_bool() == b.as_bool();
    case Kind::kList:
    case Kind::kTuple: return &a.as_sequence() == &b.as_sequence();
    case Kind::kDict: return &a.as_dict() == &b.as_dict();
    case Kind::kUndefined: return &a.as_undefined() == &b.as_undefined();
    case Kind::kNamespace:
    case Kind::kLoop:
    case Kind::kIterator:
    case Kind::kCallable: return PythonEquals(a, b);
    default: ThrowUnsupported("kappa implements 'sameas' for none, booleans and containers only");
  }
}

bool Divisible(const Value& value, const Value& divisor, int64_t remainder) {
  return PythonEquals(Modulo(value, divisor), Value::Int(remainder));
}

const std::map<std::string, Test, std::less<>>& Registry() {
  static const auto* registry = new std::map<std::string, Test, std::less<>>{
      {"boolean", Unary("test_boolean", [](const Value& v) { return v.kind() == Kind::kBool; })},
      {"callable", Unary("callable", [](const Value& v) {
         return v.kind() == Kind::kCallable || v.is_undefined() || v.kind() == Kind::kLoop;
       })},
      {"defined", Unary("test_defined", [](const Value& v) { return !v.is_undefined(); })},
      {"undefined", Unary("test_undefined", [](const Value& v) { return v.is_undefined(); })},
      {"divisibleby", Binary("test_divisibleby", [](const Value& v, const Value& n) {
         return Divisible(v, n, 0);
       })},
      {"even", Unary("test_even", [](const Value& v) { return Divisible(v, Value::Int(2), 0); })},
      {"odd", Unary("test_odd", [](const Value& v) { return Divisible(v, Value::Int(2), 1); })},
      {"escaped", Unary("test_escaped", [](const Value&) { return false; })},
      {"false", Unary("test_false", [](const Value& v) {
         return v.kind() == Kind::kBool && !v.as_bool();
       })},
      {"true", Unary("test_true", [](const Value& v) {
         return v.kind() == Kind::kBool && v.as_bool();
       })},
      {"filter", Unary("test_filter", [](const Value& v) {
         return v.is_string() && IsKnownFilter(v.as_string());
       })},
      {"test", Unary("test_test", [](const Value& v) {
         return v.is_string() && IsKnownTest(v.as_string());
       })},
      {"float", Unary("test_float", [](const Value& v) { return v.kind() == Kind::kFloat; })},
      {"integer", Unary("test_integer", [](const Value& v) { return v.kind() == Kind::kInt; })},
      {"number", Unary("test_number", [](const Value& v) { return v.is_number(); })},
      {"iterable", Unary("test_iterable", IsIterable)},
      {"sequence", Unary("test_sequence", IsSequence)},
      {"mapping", Unary("test_mapping", [](const Value& v) { return v.kind() == Kind::kDict; })},
      {"none", Unary("test_none", [](const Value& v) { return v.is_none(); })},
      {"string", Unary("test_string", [](const Value& v) { return v.is_string(); })},
      {"lower", Unary("test_lower", [](const Value& v) { return IsLower(Str(v)); })},
      {"upper", Unary("test_upper", [](const Value& v) { return IsUpper(Str(v)); })},
      {"sameas", Binary("test_sameas", SameAs)},
      {"in", Binary("test_in", [](const Value& v, const Value& seq) { return Contains(seq, v); })},
      {"eq", Comparison("eq", CompareOp::kEq)},
      {"equalto", Comparison("eq", CompareOp::kEq)},
      {"==", Comparison("eq", CompareOp::kEq)},
      {"ne", Comparison("ne", CompareOp::kNe)},
      {"!=", Comparison("ne", CompareOp::kNe)},
      {"gt", Comparison("gt", CompareOp::kGt)},
      {"greaterthan", Comparison("gt", CompareOp::kGt)},
      {">", Comparison("gt", CompareOp::kGt)},
      {"ge", Comparison("ge", CompareOp::kGe)},
      {">=", Comparison("ge", CompareOp::kGe)},
      {"lt", Comparison("lt", CompareOp::kLt)},
      {"lessthan", Comparison("lt", CompareOp::kLt)},
      {"<", Comparison("lt", CompareOp::kLt)},
      {"le", Comparison("le", CompareOp::kLe)},
      {"<=", Comparison("le", CompareOp::kLe)},
  };
  return *registry;
}

}  // namespace

bool IsKnownTest(std::string_view name) { return Registry().count(name) != 0; }

bool ApplyTest(std::string_view name, const Value& value, const CallArgs& args) {
  const auto it = Registry().find(name);
  if (it == Registry().end()) {
    throw RenderError("TemplateRuntimeError", "No test named '" + std::string(name) + "'.");
  }
  return it->second(value, args);
}

}  // namespace kappa::tasks::jinja
