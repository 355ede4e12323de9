#include "tasks/jinja/value.h"

#include "tasks/jinja/errors.h"
#include "tasks/jinja/loop.h"
#include "tasks/jinja/python_ops.h"
#include "tasks/jinja/python_text.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {
namespace {

class Generator : public Iterator {
 public:
  Generator(std::string type_name, std::function<bool(Value*)> next)
      : type_name_(std::move(type_name)), next_(std::move(next)) {}

  bool Next(Value* out) override {
    if (done_) return false;
    if (next_(out)) return true;
    done_ = true;
    next_ = nullptr;
    return false;
  }
  std::string type_name() const override { return type_name_; }

 private:
  std::string type_name_;
  std::function<bool(Value*)> next_;
  bool done_ = false;
};

}  // namespace

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : entries_) {
    if (PythonEquals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::FindString(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& entry : entries_) {
    if (PythonEquals(entry.first, key)) {
      entry.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

// Default-constructed values (placeholders about to be assigned) share one
// Undefined instead of allocating their own.
Value::Value() : kind_(Kind::kUndefined) {
  static const auto* const kPlaceholder = new std::shared_ptr<const UndefinedInfo>(
      std::make_shared<UndefinedInfo>(UndefinedInfo{"undefined value", "UndefinedError"}));
  undefined_ = *kPlaceholder;
}

Value Value::Undefined(std::string message, std::string error_type) {
  Value v(Kind::kUndefined);
  v.undefined_ = std::make_shared<UndefinedInfo>(
      UndefinedInfo{std::move(message), std::move(error_type)});
  return v;
}

Value Value::UndefinedName(std::string_view name) {
  return Undefined(Repr(String(std::string(name))) + " is undefined");
}

Value Value::UndefinedAttribute(const Value& object, std::string_view name) {
  return Undefined(Repr(String(ObjectTypeRepr(object))) + " has no attribute " +
                   Repr(String(std::string(name))));
}

Value Value::UndefinedElement(const Value& object, const Value& key) {
  return Undefined(ObjectTypeRepr(object) + " has no element " + Repr(key));
}

Value Value::None() { return Value(Kind::kNone); }

Value Value::Bool(bool value) {
  Value v(Kind::kBool);
  v.bool_ = value;
  v.int_ = value ? 1 : 0;
  return v;
}

Value Value::Int(int64_t value) {
  Value v(Kind::kInt);
  v.int_ = value;
  return v;
}

Value Value::Float(double value) {
  Value v(Kind::kFloat);
  v.float_ = value;
  return v;
}

Value Value::String(std::string value) {
  Value v(Kind::kString);
  v.string_ = std::make_shared<const std::string>(std::move(value));
  return v;
}

Value Value::List(std::vector<Value> items) {
  Sequence sequence;
  sequence.items = std::move(items);
  return FromSequence(std::move(sequence), Kind::kList);
}

Value Value::Tuple(std::vector<Value> items) {
  Sequence sequence;
  sequence.items = std::move(items);
  return FromSequence(std::move(sequence), Kind::kTuple);
}

Value Value::FromSequence(Sequence sequence, Kind kind) {
  Value v(kind);
  v.sequence_ = std::make_shared<const Sequence>(std::move(sequence));
  return v;
}

Value Value::MakeDict(Dict dict) {
  Value v(Kind::kDict);
  v.dict_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}

Value Value::MakeNamespace(std::shared_ptr<Namespace> ns) {
  Value v(Kind::kNamespace);
  v.namespace_ = std::move(ns);
  return v;
}

Value Value::Loop(std::shared_ptr<LoopState> loop) {
  Value v(Kind::kLoop);
  v.loop_ = std::move(loop);
  return v;
}

Value Value::MakeIterator(std::shared_ptr<Iterator> iterator) {
  Value v(Kind::kIterator);
  v.iterator_ = std::move(iterator);
  return v;
}

Value Value::MakeCallable(std::shared_ptr<const Callable> callable) {
  Value v(Kind::kCallable);
  v.callable_ = std::move(callable);
  return v;
}

double Value::as_float() const {
  return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_);
}

void Value::ThrowUndefined() const { throw RenderError(undefined_->error_type, undefined_->message); }

std::string TypeName(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList:
      switch (value.as_sequence().flavor) {
        case ListFlavor::kRange: return "range";
        case ListFlavor::kDictItems: return "dict_items";
        case ListFlavor::kDictKeys: return "dict_keys";
        case ListFlavor::kDictValues: return "dict_values";
        case ListFlavor::kList: return "list";
      }
      return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kLoop: return "LoopContext";
    case Kind::kIterator: return value.as_iterator().type_name();
    case Kind::kCallable: return value.as_callable().type_name();
  }
  return "object";
}

std::string ObjectTypeRepr(const Value& value) {
  switch (value.kind()) {
    case Kind::kNone: return "None";
    case Kind::kUndefined: return "jinja2.runtime.Undefined object";
    case Kind::kNamespace: return "jinja2.utils.Namespace object";
    case Kind::kLoop: return "jinja2.runtime.LoopContext object";
    case Kind::kCallable:
      if (value.as_callable().type_name() == "Macro") return "jinja2.runtime.Macro object";
      return TypeName(value) + " object";
    default: return TypeName(value) + " object";
  }
}

std::vector<Value> Iterate(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined: return {};
    case Kind::kList:
    case Kind::kTuple: return value.items();
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& entry : value.as_dict().entries()) keys.push_back(entry.first);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      const std::string& text = value.as_string();
      size_t pos = 0;
      while (pos < text.size()) {
        const size_t start = pos;
        NextCodePoint(text, &pos);
        chars.push_back(Value::String(text.substr(start, pos - start)));
      }
      return chars;
    }
    case Kind::kLoop: ThrowUnsupported("kappa does not iterate the loop object");
    case Kind::kIterator: {
      std::vector<Value> rest;
      Value item;
      while (value.as_iterator().Next(&item)) rest.push_back(item);
      return rest;
    }
    default: ThrowTypeError("'" + TypeName(value) + "' object is not iterable");
  }
}

std::shared_ptr<Iterator> MakeGenerator(std::string type_name, std::function<bool(Value*)> next) {
  return std::make_shared<Generator>(std::move(type_name), std::move(next));
}

std::function<bool(Value*)> Pull(const Value& value) {
  if (value.kind() == Kind::kIterator) {
    return [value](Value* out) { return value.as_iterator().Next(out); };
  }
  auto items = std::make_shared<std::vector<Value>>(Iterate(value));
  auto position = std::make_shared<size_t>(0);
  return [items, position](Value* out) {
    if (*position >= items->size()) return false;
    *out = (*items)[(*position)++];
    return true;
  };
}

}  // namespace kappa::tasks::jinja
