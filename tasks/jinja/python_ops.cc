#include "tasks/jinja/python_ops.h"

#include <cmath>
#include <limits>
#include <string>

#include "tasks/jinja/errors.h"

namespace kappa::tasks::jinja {
namespace {

[[noreturn]] void ThrowOverflow() {
  throw RenderError("OverflowError",
                    "integer result does not fit in 64 bits (kappa has no big integers)");
}

[[noreturn]] void ThrowZeroDivision(const std::string& message) {
  throw RenderError("ZeroDivisionError", message);
}

// An Undefined operand fails the way jinja2's Undefined.__add__ etc. do.
void RejectUndefined(const Value& a, const Value& b) {
  if (a.is_undefined()) a.ThrowUndefined();
  if (b.is_undefined()) b.ThrowUndefined();
}

[[noreturn]] void ThrowUnsupportedOperands(std::string_view op, const Value& a, const Value& b) {
  ThrowTypeError("unsupported operand type(s) for " + std::string(op) + ": '" + TypeName(a) +
                 "' and '" + TypeName(b) + "'");
}

bool IsPlainList(const Value& v) {
  return v.kind() == Kind::kList && v.as_sequence().flavor == ListFlavor::kList;
}

// Exact comparison of an int with a float, as Python does.
int CompareIntFloat(int64_t i, double f) {
  if (std::isnan(f)) return 2;  // Unordered.
  if (f >= 9.3e18) return -1;
  if (f <= -9.3e18) return 1;
  const double floor = std::floor(f);
  const int64_t whole = static_cast<int64_t>(floor);
  if (i < whole) return -1;
  if (i > whole) return 1;
  return f > floor ? -1 : 0;
}

// -1, 0, 1 for numbers; 2 when unordered (NaN).
int CompareNumbers(const Value& a, const Value& b) {
  if (a.is_integer() && b.is_integer()) {
    return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
  }
  if (a.is_integer()) return CompareIntFloat(a.as_int(), b.as_float());
  if (b.is_integer()) {
    const int c = CompareIntFloat(b.as_int(), a.as_float());
    return c == 2 ? 2 : -c;
  }
  const double x = a.as_float(), y = b.as_float();
  if (std::isnan(x) || std::isnan(y)) return 2;
  return x < y ? -1 : (x > y ? 1 : 0);
}

const char* OpText(CompareOp op) {
  switch (op) {
    case CompareOp::kLt: return "<";
    case CompareOp::kLe: return "<=";
    case CompareOp::kGt: return ">";
    case CompareOp::kGe: return ">=";
    case CompareOp::kEq: return "==";
    case CompareOp::kNe: return "!=";
  }
  return "?";
}

bool Apply(CompareOp op, int order) {
  if (order == 2) return op == CompareOp::kNe;
  switch (op) {
    case CompareOp::kLt: return order < 0;
    case CompareOp::kLe: return order <= 0;
    case CompareOp::kGt: return order > 0;
    case CompareOp::kGe: return order >= 0;
    case CompareOp::kEq: return order == 0;
    case CompareOp::kNe: return order != 0;
  }
  return false;
}

bool Order(CompareOp op, const Value& a, const Value& b) {
  RejectUndefined(a, b);
  if (a.is_number() && b.is_number()) return Apply(op, CompareNumbers(a, b));
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return Apply(op, c < 0 ? -1 : (c > 0 ? 1 : 0));
  }
  const bool both_lists = IsPlainList(a) && IsPlainList(b);
  const bool both_tuples = a.kind() == Kind::kTuple && b.kind() == Kind::kTuple;
  if (both_lists || both_tuples) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!PythonEquals(x[i], y[i])) return Order(op, x[i], y[i]);
    }
    return Apply(op, x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0));
  }
  ThrowTypeError(std::string("'") + OpText(op) + "' not supported between instances of '" +
                 TypeName(a) + "' and '" + TypeName(b) + "'");
}

Value Repeat(const Value& sequence, int64_t times) {
  if (sequence.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.as_string();
    return Value::String(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i) {
    out.insert(out.end(), sequence.items().begin(), sequence.items().end());
  }
  return sequence.kind() == Kind::kTuple ? Value::Tuple(std::move(out))
                                         : Value::List(std::move(out));
}

bool IsRepeatable(const Value& v) {
  return v.is_string() || IsPlainList(v) || v.kind() == Kind::kTuple;
}

int64_t FloorDivInt(int64_t a, int64_t b) {
  if (a == std::numeric_limits<int64_t>::min() && b == -1) ThrowOverflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

double FloatFloorDivide(double a, double b) {
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div != 0) {
    const double floor = std::floor(div);
    if (div - floor > 0.5) return floor + 1.0;
    return floor;
  }
  return std::copysign(0.0, a / b);
}

double FloatModulo(double a, double b) {
  double mod = std::fmod(a, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = std::copysign(0.0, b);
  }
  return mod;
}

}  // namespace

int64_t CheckedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) ThrowOverflow();
  return out;
}

int64_t CheckedMultiply(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) ThrowOverflow();
  return out;
}

bool Truthy(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return value.as_bool();
    case Kind::kInt: return value.as_int() != 0;
    case Kind::kFloat: return value.as_float() != 0.0;
    case Kind::kString: return !value.as_string().empty();
    case Kind::kList:
    case Kind::kTuple: return !value.items().empty();
    case Kind::kDict: return value.as_dict().size() != 0;
    default: return true;  // Namespace, loop, generator, function.
  }
}

bool PythonEquals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return CompareNumbers(a, b) == 0;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.as_string() == b.as_string();
    case Kind::kList:
    case Kind::kTuple: {
      if (a.as_sequence().flavor != b.as_sequence().flavor) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!PythonEquals(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.Find(key);
        if (other == nullptr || !PythonEquals(value, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return &a.as_namespace() == &b.as_namespace();
    case Kind::kLoop: return &a.as_loop() == &b.as_loop();
    case Kind::kIterator: return &a.as_iterator() == &b.as_iterator();
    case Kind::kCallable: return &a.as_callable() == &b.as_callable();
    default: return false;
  }
}

bool Compare(CompareOp op, const Value& a, const Value& b) {
  if (op == CompareOp::kEq) return PythonEquals(a, b);
  if (op == CompareOp::kNe) return !PythonEquals(a, b);
  return Order(op, a, b);
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (!item.is_string()) {
        ThrowTypeError("'in <string>' requires string as left operand, not " + TypeName(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
      for (const Value& element : container.items()) {
        if (PythonEquals(element, item)) return true;
      }
      return false;
    case Kind::kDict: return container.as_dict().Find(item) != nullptr;
    case Kind::kIterator: {
      Value element;
      while (container.as_iterator().Next(&element)) {
        if (PythonEquals(element, item)) return true;
      }
      return false;
    }
    case Kind::kLoop: ThrowUnsupported("kappa does not search the loop object");
    default:
      ThrowTypeError("argument of type '" + TypeName(container) + "' is not iterable");
  }
}

Value Add(const Value& a, const Value& b) {
  RejectUndefined(a, b);
  if (a.is_integer() && b.is_integer()) return Value::Int(CheckedAdd(a.as_int(), b.as_int()));
  if (a.is_number() && b.is_number()) return Value::Float(a.as_float() + b.as_float());
  if (a.is_string()) {
    if (!b.is_string()) {
      ThrowTypeError("can only concatenate str (not \"" + TypeName(b) + "\") to str");
    }
    return Value::String(a.as_string() + b.as_string());
  }
  if (IsPlainList(a) || a.kind() == Kind::kTuple) {
    const bool same = a.kind() == Kind::kTuple ? b.kind() == Kind::kTuple : IsPlainList(b);
    if (!same) {
      ThrowTypeError("can only concatenate " + TypeName(a) + " (not \"" + TypeName(b) + "\") to " +
                     TypeName(a));
    }
    std::vector<Value> items = a.items();
    items.insert(items.end(), b.items().begin(), b.items().end());
    return a.kind() == Kind::kTuple ? Value::Tuple(std::move(items))
                                    : Value::List(std::move(items));
  }
  ThrowUnsupportedOperands("+", a, b);
}

Value Subtract(const Value& a, const Value& b) {
  RejectUndefined(a, b);
  if (a.is_integer() && b.is_integer()) {
    int64_t out;
    if (__builtin_sub_overflow(a.as_int(), b.as_int(), &out)) ThrowOverflow();
    return Value::Int(out);
  }
  if (a.is_number() && b.is_number()) return Value::Float(a.as_float() - b.as_float());
  ThrowUnsupportedOperands("-", a, b);
}

Value Multiply(const Value& a, const Value& b) {
  RejectUndefined(a, b);
  if (a.is_integer() && b.is_integer()) {
    return Value::Int(CheckedMultiply(a.as_int(), b.as_int()));
  }
  if (a.is_number() && b.is_number()) return Value::Float(a.as_float() * b.as_float());
  const Value* sequence = IsRepeatable(a) ? &a : (IsRepeatable(b) ? &b : nullptr);
  if (sequence != nullptr) {
    const Value& count = sequence == &a ? b : a;
    if (!count.is_integer()) {
      ThrowTypeError("can't multiply sequence by non-int of type '" + TypeName(count) + "'");
    }
    return Repeat(*sequence, count.as_int());
  }
  ThrowUnsupportedOperands("*", a, b);
}

Value TrueDivide(const Value& a, const Value& b) {
  RejectUndefined(a, b);
  if (!a.is_number() || !b.is_number()) ThrowUnsupportedOperands("/", a, b);
  if (b.as_float() == 0.0) {
    ThrowZeroDivision(a.is_integer() && b.is_integer() ? "division by zero"
                                                       : "float division by zero");
  }
  return Value::Float(a.as_float() / b.as_float());
}

Value FloorDivide(const Value& a, const Value& b) {
  RejectUndefined(a, b);
  if (!a.is_number() || !b.is_number()) ThrowUnsupportedOperands("//", a, b);
  if (a.is_integer() && b.is_integer()) {
    if (b.as_int() == 0) ThrowZeroDivision("integer division or modulo by zero");
    return Value::Int(FloorDivInt(a.as_int(), b.as_int()));
  }
  if (b.as_float() == 0.0) ThrowZeroDivision("float floor division by zero");
  return Value::Float(FloatFloorDivide(a.as_float(), b.as_float()));
}

Value Modulo(const Value& a, const Value& b) {
  RejectUndefined(a, b);
  if (a.is_string()) ThrowUnsupported("kappa does not implement printf-style '%' on strings");
  if (!a.is_number() || !b.is_number()) ThrowUnsupportedOperands("%", a, b);
  if (a.is_integer() && b.is_integer()) {
    if (b.as_int() == 0) ThrowZeroDivision("integer modulo by zero");
    if (b.as_int() == -1) return Value::Int(0);
    const int64_t q = FloorDivInt(a.as_int(), b.as_int());
    return Value::Int(a.as_int() - q * b.as_int());
  }
  if (b.as_float() == 0.0) ThrowZeroDivision("float modulo");
  return Value::Float(FloatModulo(a.as_float(), b.as_float()));
}

Value Power(const Value& a, const Value& b) {
  RejectUndefined(a, b);
  if (!a.is_number() || !b.is_number()) ThrowUnsupportedOperands("** or pow()", a, b);
  if (a.is_integer() && b.is_integer() && b.as_int() >= 0) {
    int64_t result = 1;
    for (int64_t i = 0; i < b.as_int(); ++i) {
      result = CheckedMultiply(result, a.as_int());
      if (result == 0 || result == 1) break;
    }
    if (result == 1 && a.as_int() == -1 && b.as_int() % 2 == 1) result = -1;
    return Value::Int(result);
  }
  const double base = a.as_float(), exponent = b.as_float();
  if (base == 0.0 && exponent < 0) {
    ThrowZeroDivision("0.0 cannot be raised to a negative power");
  }
  if (base < 0 && exponent != std::floor(exponent)) {
    ThrowUnsupported("kappa has no complex numbers (negative base, fractional exponent)");
  }
  return Value::Float(std::pow(base, exponent));
}

Value Negate(const Value& a) {
  if (a.is_undefined()) a.ThrowUndefined();
  if (a.is_integer()) {
    if (a.as_int() == std::numeric_limits<int64_t>::min()) ThrowOverflow();
    return Value::Int(-a.as_int());
  }
  if (a.kind() == Kind::kFloat) return Value::Float(-a.as_float());
  ThrowTypeError("bad operand type for unary -: '" + TypeName(a) + "'");
}

Value Positive(const Value& a) {
  if (a.is_undefined()) a.ThrowUndefined();
  if (a.is_integer()) return Value::Int(a.as_int());
  if (a.kind() == Kind::kFloat) return a;
  ThrowTypeError("bad operand type for unary +: '" + TypeName(a) + "'");
}

}  // namespace kappa::tasks::jinja
