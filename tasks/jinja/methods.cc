#include "tasks/jinja/methods.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "tasks/jinja/arguments.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/python_ops.h"
#include "tasks/jinja/python_str.h"
#include "tasks/jinja/python_text.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {
namespace {

bool In(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Every public method of Python 3.11's str, dict, list and tuple: getattr
// finds them (so `x.casefold is defined`), even those kappa cannot call.
bool IsStrMethod(std::string_view n) {
  return In(n, {"capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs",
                "find", "format", "format_map", "index", "isalnum", "isalpha", "isascii",
                "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable",
                "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
                "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex",
                "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith",
                "strip", "swapcase", "title", "translate", "upper", "zfill"});
}
bool IsDictMethod(std::string_view n) {
  return In(n, {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem",
                "setdefault", "update", "values"});
}
bool IsListMethod(std::string_view n) {
  return In(n, {"append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove",
                "reverse", "sort"});
}
bool IsTupleMethod(std::string_view n) { return In(n, {"count", "index"}); }

// ImmutableSandboxedEnvironment's modifies_known_mutable().
bool IsUnsafe(const Value& object, std::string_view n) {
  if (object.kind() == Kind::kDict) return In(n, {"clear", "pop", "popitem", "setdefault", "update"});
  if (object.kind() == Kind::kList) {
    return In(n, {"append", "reverse", "insert", "sort", "extend", "remove"});
  }
  return false;
}

void NoArguments(const CallArgs& args, const std::string& method) {
  BoundArguments bound(args, method, {});
}

std::string Arg(const BoundArguments& bound, size_t index, const char* method) {
  const Value& value = bound.get(index);
  if (!value.is_string()) {
    ThrowTypeError(std::string(method) + "() argument must be str, not " + TypeName(value));
  }
  return value.as_string();
}

std::optional<std::string> OptionalStringArg(const BoundArguments& bound, size_t index) {
  if (!bound.has(index) || bound.get(index).is_none()) return std::nullopt;
  const Value& value = bound.get(index);
  if (!value.is_string()) ThrowTypeError("must be str or None, not " + TypeName(value));
  return value.as_string();
}

Value StringList(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& part : parts) items.push_back(Value::String(std::move(part)));
  return Value::List(std::move(items));
}

bool AffixMatches(const std::string& text, const Value& affix, bool prefix, const char* method) {
  auto matches = [&](const std::string& candidate) {
    if (candidate.size() > text.size()) return false;
    return prefix ? text.compare(0, candidate.size(), candidate) == 0
                  : text.compare(text.size() - candidate.size(), candidate.size(), candidate) == 0;
  };
  if (affix.is_string()) return matches(affix.as_string());
  if (affix.kind() == Kind::kTuple) {
    for (const Value& item : affix.items()) {
      if (!item.is_string()) {
        ThrowTypeError(std::string("tuple for ") + method + " must only contain str, not " +
                       TypeName(item));
      }
      if (matches(item.as_string())) return true;
    }
    return false;
  }
  ThrowTypeError(std::string(method) + " first arg must be str or a tuple of str, not " +
                 TypeName(affix));
}

// isalnum/isalpha/isdigit: ASCII classes; other code points are refused.
template <typename Predicate>
bool AllAscii(const std::string& text, const char* method, Predicate predicate) {
  if (text.empty()) return false;
  for (unsigned char c : text) {
    if (c >= 0x80) ThrowUnsupported(std::string("kappa implements str.") + method + "() for ASCII only");
    if (!predicate(c)) return false;
  }
  return true;
}

Value Join(const std::string& separator, const Value& iterable) {
  std::string out;
  const std::vector<Value> items = Iterate(iterable);
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      ThrowTypeError("sequence item " + std::to_string(i) + ": expected str instance, " +
                     TypeName(items[i]) + " found");
    }
    if (i > 0) out += separator;
    out += items[i].as_string();
  }
  return Value::String(std::move(out));
}

Value Partition(const std::string& text, const std::string& sep, bool from_right) {
  if (sep.empty()) ThrowValueError("empty separator");
  const size_t found = from_right ? text.rfind(sep) : text.find(sep);
  if (found == std::string::npos) {
    const Value empty = Value::String("");
    return from_right ? Value::Tuple({empty, empty, Value::String(text)})
                      : Value::Tuple({Value::String(text), empty, empty});
  }
  return Value::Tuple({Value::String(text.substr(0, found)), Value::String(sep),
                       Value::String(text.substr(found + sep.size()))});
}

Value ZFill(const std::string& text, int64_t width) {
  const int64_t length = static_cast<int64_t>(CodePointCount(text));
  if (width <= length) return Value::String(text);
  const size_t sign = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  return Value::String(text.substr(0, sign) + std::string(static_cast<size_t>(width - length), '0') +
                       text.substr(sign));
}

Value CallStrMethod(const std::string& self, std::string_view name, const CallArgs& args) {
  const std::string method(name);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BoundArguments bound(args, method, {"chars"});
    const StripSide side = name == "strip" ? StripSide::kBoth
                           : name == "lstrip" ? StripSide::kLeft : StripSide::kRight;
    return Value::String(Strip(self, OptionalStringArg(bound, 0), side));
  }
  if (name == "split" || name == "rsplit") {
    BoundArguments bound(args, method, {"sep", "maxsplit"});
    const auto sep = OptionalStringArg(bound, 0);
    const int64_t maxsplit = bound.GetInt(1, -1);
    return StringList(name == "split" ? Split(self, sep, maxsplit) : RSplit(self, sep, maxsplit));
  }
  if (name == "splitlines") {
    BoundArguments bound(args, method, {"keepends"});
    return StringList(SplitLines(self, bound.GetTruthy(0, false)));
  }
  if (name == "startswith" || name == "endswith") {
    BoundArguments bound(args, method, {"prefix", "start", "end"}, 1);
    if (bound.has(1) || bound.has(2)) {
      ThrowUnsupported("kappa implements str." + method + "() without start/end");
    }
    return Value::Bool(AffixMatches(self, bound.get(0), name == "startswith", method.c_str()));
  }
  if (name == "upper") {
    NoArguments(args, method);
    return Value::String(Upper(self));
  }
  if (name == "lower") {
    NoArguments(args, method);
    return Value::String(Lower(self));
  }
  if (name == "title") {
    NoArguments(args, method);
    return Value::String(Title(self));
  }
  if (name == "capitalize") {
    NoArguments(args, method);
    return Value::String(Capitalize(self));
  }
  if (name == "replace") {
    BoundArguments bound(args, method, {"old", "new", "count"}, 2);
    return Value::String(Replace(self, Arg(bound, 0, "replace"), Arg(bound, 1, "replace"),
                                 bound.GetInt(2, -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" ||
      name == "count") {
    BoundArguments bound(args, method, {"sub", "start", "end"}, 1);
    if (bound.has(1) || bound.has(2)) {
      ThrowUnsupported("kappa implements str." + method + "() without start/end");
    }
    const std::string sub = Arg(bound, 0, method.c_str());
    if (name == "count") return Value::Int(Count(self, sub));
    const int64_t at = (name == "find" || name == "index") ? Find(self, sub) : RFind(self, sub);
    if (at < 0 && (name == "index" || name == "rindex")) ThrowValueError("substring not found");
    return Value::Int(at);
  }
  if (name == "join") {
    BoundArguments bound(args, method, {"iterable"}, 1);
    return Join(self, bound.get(0));
  }
  if (name == "isalnum") {
    NoArguments(args, method);
    return Value::Bool(AllAscii(self, "isalnum", [](unsigned char c) { return std::isalnum(c); }));
  }
  if (name == "isalpha") {
    NoArguments(args, method);
    return Value::Bool(AllAscii(self, "isalpha", [](unsigned char c) { return std::isalpha(c); }));
  }
  if (name == "isdigit") {
    NoArguments(args, method);
    return Value::Bool(AllAscii(self, "isdigit", [](unsigned char c) { return std::isdigit(c); }));
  }
  if (name == "isspace") {
    NoArguments(args, method);
    const std::u32string s = DecodeUtf8(self);
    return Value::Bool(!s.empty() && std::all_of(s.begin(), s.end(), IsPythonSpace));
  }
  if (name == "islower") {
    NoArguments(args, method);
    return Value::Bool(IsLower(self));
  }
  if (name == "isupper") {
    NoArguments(args, method);
    return Value::Bool(IsUpper(self));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    BoundArguments bound(args, method, {"affix"}, 1);
    const std::string affix = Arg(bound, 0, method.c_str());
    const bool prefix = name == "removeprefix";
    if (!AffixMatches(self, Value::String(affix), prefix, method.c_str())) return Value::String(self);
    return Value::String(prefix ? self.substr(affix.size())
                                : self.substr(0, self.size() - affix.size()));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    BoundArguments bound(args, method, {"width", "fillchar"}, 1);
    const std::string fill = bound.GetString(1, " ");
    if (CodePointCount(fill) != 1) {
      ThrowTypeError("The fill character must be exactly one character long");
    }
    const Align align = name == "center" ? Align::kCenter
                        : name == "ljust" ? Align::kLeft : Align::kRight;
    return Value::String(Pad(self, bound.GetInt(0, 0), fill, align));
  }
  if (name == "zfill") {
    BoundArguments bound(args, method, {"width"}, 1);
    return ZFill(self, bound.GetInt(0, 0));
  }
  if (name == "partition" || name == "rpartition") {
    BoundArguments bound(args, method, {"sep"}, 1);
    return Partition(self, Arg(bound, 0, method.c_str()), name == "rpartition");
  }
  ThrowUnsupported("kappa does not implement str." + method + "()");
}

Value DictView(const Dict& dict, ListFlavor flavor) {
  Sequence view;
  view.flavor = flavor;
  for (const auto& [key, value] : dict.entries()) {
    if (flavor == ListFlavor::kDictItems) view.items.push_back(Value::Tuple({key, value}));
    if (flavor == ListFlavor::kDictKeys) view.items.push_back(key);
    if (flavor == ListFlavor::kDictValues) view.items.push_back(value);
  }
  return Value::FromSequence(std::move(view), Kind::kList);
}

Value CallDictMethod(const Dict& self, std::string_view name, const CallArgs& args) {
  const std::string method(name);
  if (name == "items") {
    NoArguments(args, method);
    return DictView(self, ListFlavor::kDictItems);
  }
  if (name == "keys") {
    NoArguments(args, method);
    return DictView(self, ListFlavor::kDictKeys);
  }
  if (name == "values") {
    NoArguments(args, method);
    return DictView(self, ListFlavor::kDictValues);
  }
  if (name == "get") {
    BoundArguments bound(args, method, {"key", "default"}, 1);
    const Value* found = self.Find(bound.get(0));
    return found != nullptr ? *found : bound.get(1, Value::None());
  }
  ThrowUnsupported("kappa does not implement dict." + method + "()");
}

Value CallSequenceMethod(const Value& self, std::string_view name, const CallArgs& args) {
  const std::string method(name);
  const std::string type = TypeName(self);
  if (name == "count" || name == "index") {
    BoundArguments bound(args, method, {"value"}, 1);
    const Value& needle = bound.get(0);
    const auto& items = self.items();
    int64_t count = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!PythonEquals(items[i], needle)) continue;
      if (name == "index") return Value::Int(static_cast<int64_t>(i));
      ++count;
    }
    if (name == "count") return Value::Int(count);
    ThrowValueError(type == "tuple" ? "tuple.index(x): x not in tuple"
                                    : Repr(needle) + " is not in list");
  }
  ThrowUnsupported("kappa does not implement " + type + "." + method +
                   "() (the immutable sandbox allows it, but kappa does not mutate lists)");
}

// obj.name bound to obj, as Python's bound methods are.
class BoundMethod : public Callable {
 public:
  BoundMethod(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  Value Call(CallArgs args) const override {
    switch (self_.kind()) {
      case Kind::kString: return CallStrMethod(self_.as_string(), name_, args);
      case Kind::kDict: return CallDictMethod(self_.as_dict(), name_, args);
      default: return CallSequenceMethod(self_, name_, args);
    }
  }

 private:
  Value self_;
  std::string name_;
};

}  // namespace

bool IsCallableMethodName(std::string_view name) {
  return In(name, {"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith",
                   "endswith", "upper", "lower", "title", "capitalize", "replace", "find", "rfind",
                   "index", "rindex", "count", "join", "isalnum", "isalpha", "isdigit", "isspace",
                   "islower", "isupper", "removeprefix", "removesuffix", "center", "ljust",
                   "rjust", "zfill", "partition", "rpartition", "items", "keys", "values", "get",
                   "cycle", "changed"}) ||
         // The sandbox's mutating methods: jinja2 compiles them and raises at
         // render (SecurityError; list.pop/clear are Unsupported here).
         In(name, {"append", "reverse", "insert", "sort", "extend", "remove", "clear", "pop",
                   "popitem", "setdefault", "update"});
}

std::optional<Value> LookupMethod(const Value& object, std::string_view name) {
  bool has = false;
  switch (object.kind()) {
    case Kind::kString: has = IsStrMethod(name); break;
    case Kind::kDict: has = IsDictMethod(name); break;
    case Kind::kList:
      has = object.as_sequence().flavor == ListFlavor::kList ? IsListMethod(name)
                                                             : IsTupleMethod(name);
      break;
    case Kind::kTuple: has = IsTupleMethod(name); break;
    default: break;
  }
  if (!has) return std::nullopt;
  if (IsUnsafe(object, name)) {
    return Value::Undefined("access to attribute '" + std::string(name) + "' of '" +
                                TypeName(object) + "' object is unsafe.",
                            "SecurityError");
  }
  return Value::MakeCallable(std::make_shared<BoundMethod>(object, std::string(name)));
}

}  // namespace kappa::tasks::jinja
