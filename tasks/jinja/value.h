// The interpreter's value: the Python objects a chat template sees (None,
// bool, int, float, str, list, tuple, dict) plus jinja2's own (Undefined,
// namespace, the loop object, generators, callables).
//
// Containers have Python's reference semantics (shared); the immutable
// sandbox never mutates a list or dict, only a namespace. Strings are UTF-8.
// Integers are int64 (Python's are unbounded: arithmetic that leaves int64
// is an OverflowError here).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kappa::tasks::jinja {

class Value;
class Callable;
class LoopState;

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kLoop,
  kIterator,
  kCallable,
};

// What an Undefined reports when used: jinja2's message and the exception
// it raises (UndefinedError; SecurityError for the sandbox's unsafe
// attributes such as list.append).
struct UndefinedInfo {
  std::string message;
  std::string error_type = "UndefinedError";
};

// A list also stands for the list-like Python objects whose repr differs:
// range(...) and the dict views of .items()/.keys()/.values().
enum class ListFlavor { kList, kRange, kDictItems, kDictKeys, kDictValues };

struct Sequence {
  std::vector<Value> items;
  ListFlavor flavor = ListFlavor::kList;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // kRange only.
};

// An insertion-ordered dict (Python 3.7+ order). Keys compare with Python
// equality (1 == 1.0 == True).
class Dict {
 public:
  const Value* Find(const Value& key) const;
  const Value* FindString(std::string_view key) const;
  // Overwriting keeps the key's first position, as Python does.
  void Set(Value key, Value value);
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<Value, Value>> entries_;
};

// jinja2.utils.Namespace: the one mutable object (`{% set ns.x = ... %}`).
struct Namespace {
  Dict attributes;
};

// A Python iterator (a generator from select/map/..., reversed(list)):
// single pass, always truthy, no len().
class Iterator {
 public:
  virtual ~Iterator() = default;
  virtual bool Next(Value* out) = 0;
  virtual std::string type_name() const = 0;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Something a template can call: a global function, a macro, a bound method.
class Callable {
 public:
  virtual ~Callable() = default;
  // Python's type(x).__name__: "function", "Macro", "builtin_function_or_method".
  virtual std::string type_name() const = 0;
  virtual Value Call(CallArgs args) const = 0;
};

class Value {
 public:
  // Undefined with jinja2's "'name' is undefined".
  Value();
  static Value Undefined(std::string message, std::string error_type = "UndefinedError");
  static Value UndefinedName(std::string_view name);
  // obj.name / obj[name] missing: "'dict object' has no attribute 'name'".
  static Value UndefinedAttribute(const Value& object, std::string_view name);
  // obj[key] missing for a non-string key: "list object has no element 0".
  static Value UndefinedElement(const Value& object, const Value& key);
  static Value None();
  static Value Bool(bool value);
  static Value Int(int64_t value);
  static Value Float(double value);
  static Value String(std::string value);
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  static Value FromSequence(Sequence sequence, Kind kind);
  static Value MakeDict(Dict dict);
  static Value MakeNamespace(std::shared_ptr<Namespace> ns);
  static Value Loop(std::shared_ptr<LoopState> loop);
  static Value MakeIterator(std::shared_ptr<Iterator> iterator);
  static Value MakeCallable(std::shared_ptr<const Callable> callable);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  // int or bool (bool is an int subclass in Python).
  bool is_integer() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }
  bool is_number() const { return is_integer() || kind_ == Kind::kFloat; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }

  bool as_bool() const { return bool_; }
  // The integer value of an int or bool.
  int64_t as_int() const { return int_; }
  // The float value of any number.
  double as_float() const;
  const std::string& as_string() const { return *string_; }
  const Sequence& as_sequence() const { return *sequence_; }
  const std::vector<Value>& items() const { return sequence_->items; }
  const Dict& as_dict() const { return *dict_; }
  Namespace& as_namespace() const { return *namespace_; }
  LoopState& as_loop() const { return *loop_; }
  Iterator& as_iterator() const { return *iterator_; }
  const Callable& as_callable() const { return *callable_; }
  const UndefinedInfo& as_undefined() const { return *undefined_; }

  // Raises the error jinja2's Undefined raises when it is used.
  [[noreturn]] void ThrowUndefined() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const Sequence> sequence_;
  std::shared_ptr<const Dict> dict_;
  std::shared_ptr<Namespace> namespace_;
  std::shared_ptr<LoopState> loop_;
  std::shared_ptr<Iterator> iterator_;
  std::shared_ptr<const Callable> callable_;
  std::shared_ptr<const UndefinedInfo> undefined_;
};

// Python's type(x).__name__ ("str", "NoneType", "generator", ...).
std::string TypeName(const Value& value);

// jinja2's object_type_repr: "None", "dict object", "jinja2.utils.Namespace object".
std::string ObjectTypeRepr(const Value& value);

// Iterates like Python's iter(): list/tuple items, dict keys, str code
// points, an iterator's remaining items (consuming it), Undefined as empty.
// TypeError "'int' object is not iterable" otherwise.
std::vector<Value> Iterate(const Value& value);

// A Python generator: `next` stores the next item and returns true, or
// returns false once exhausted (and keeps returning false).
std::shared_ptr<Iterator> MakeGenerator(std::string type_name, std::function<bool(Value*)> next);

// The items of `value` one at a time, as a `for` over it sees them: an
// iterator is pulled lazily, any other iterable from its items now
// (Iterate's rules and errors).
std::function<bool(Value*)> Pull(const Value& value);

}  // namespace kappa::tasks::jinja
