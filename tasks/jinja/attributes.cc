#include "tasks/jinja/attributes.h"

#include <string>
#include <vector>

#include "tasks/jinja/errors.h"
#include "tasks/jinja/loop.h"
#include "tasks/jinja/methods.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {
namespace {

// The attribute of a namespace or the loop object; nullopt if it has none.
std::optional<Value> ObjectAttribute(const Value& object, std::string_view name) {
  if (object.kind() == Kind::kNamespace) {
    const Value* found = object.as_namespace().attributes.FindString(name);
    if (found != nullptr) return *found;
    return std::nullopt;
  }
  if (object.kind() == Kind::kLoop) {
    Value attribute = object.as_loop().Attribute(name);
    if (!attribute.is_undefined() || name == "previtem" || name == "nextitem") return attribute;
    return std::nullopt;
  }
  return LookupMethod(object, name);
}

// Python's index normalisation: nullopt when out of range.
std::optional<size_t> NormalizeIndex(int64_t index, size_t size) {
  const int64_t n = static_cast<int64_t>(size);
  if (index < 0) index += n;
  if (index < 0 || index >= n) return std::nullopt;
  return static_cast<size_t>(index);
}

std::optional<Value> IndexSequence(const Value& object, int64_t index) {
  if (object.is_string()) {
    const std::u32string text = DecodeUtf8(object.as_string());
    const auto at = NormalizeIndex(index, text.size());
    if (!at) return std::nullopt;
    return Value::String(EncodeUtf8(text.substr(*at, 1)));
  }
  const auto& items = object.items();
  const auto at = NormalizeIndex(index, items.size());
  if (!at) return std::nullopt;
  return items[*at];
}

bool IsIndexable(const Value& v) {
  if (v.is_string() || v.kind() == Kind::kTuple) return true;
  if (v.kind() != Kind::kList) return false;
  const ListFlavor flavor = v.as_sequence().flavor;
  return flavor == ListFlavor::kList || flavor == ListFlavor::kRange;
}

int64_t SliceBound(const std::optional<Value>& bound, const char* what) {
  const Value& v = *bound;
  if (!v.is_integer()) {
    ThrowTypeError(std::string("slice indices must be integers or None or have an __index__ ") +
                   "method (" + what + ")");
  }
  return v.as_int();
}

// CPython's PySlice_AdjustIndices.
std::vector<size_t> SliceIndices(size_t size, const std::optional<Value>& start_value,
                                 const std::optional<Value>& stop_value,
                                 const std::optional<Value>& step_value) {
  auto given = [](const std::optional<Value>& v) { return v && !v->is_none(); };
  const int64_t n = static_cast<int64_t>(size);
  const int64_t step = given(step_value) ? SliceBound(step_value, "step") : 1;
  if (step == 0) ThrowValueError("slice step cannot be zero");
  int64_t start, stop;
  if (!given(start_value)) {
    start = step < 0 ? n - 1 : 0;
  } else {
    start = SliceBound(start_value, "start");
    if (start < 0) {
      start += n;
      if (start < 0) start = step < 0 ? -1 : 0;
    } else if (start >= n) {
      start = step < 0 ? n - 1 : n;
    }
  }
  if (!given(stop_value)) {
    stop = step < 0 ? -1 : n;
  } else {
    stop = SliceBound(stop_value, "stop");
    if (stop < 0) {
      stop += n;
      if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= n) {
      stop = step < 0 ? n - 1 : n;
    }
  }
  std::vector<size_t> indices;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    indices.push_back(static_cast<size_t>(i));
  }
  return indices;
}

}  // namespace

Value GetAttr(const Value& object, std::string_view name) {
  if (object.is_undefined()) object.ThrowUndefined();
  if (std::optional<Value> attribute = ObjectAttribute(object, name)) return *attribute;
  if (object.kind() == Kind::kDict) {
    if (const Value* found = object.as_dict().FindString(name)) return *found;
  }
  return Value::UndefinedAttribute(object, name);
}

Value GetItem(const Value& object, const Value& key) {
  if (object.is_undefined()) object.ThrowUndefined();
  if (object.kind() == Kind::kDict) {
    if (const Value* found = object.as_dict().Find(key)) return *found;
  } else if (IsIndexable(object) && key.is_integer()) {
    if (std::optional<Value> item = IndexSequence(object, key.as_int())) return *item;
  }
  if (key.is_string()) {
    if (std::optional<Value> attribute = ObjectAttribute(object, key.as_string())) {
      return *attribute;
    }
    return Value::UndefinedAttribute(object, key.as_string());
  }
  return Value::UndefinedElement(object, key);
}

Value GetSlice(const Value& object, const std::optional<Value>& start,
               const std::optional<Value>& stop, const std::optional<Value>& step) {
  if (object.is_undefined()) object.ThrowUndefined();
  if (object.kind() == Kind::kList && object.as_sequence().flavor == ListFlavor::kRange) {
    ThrowUnsupported("kappa does not slice range objects");
  }
  if (!IsIndexable(object)) {
    return Value::Undefined(ObjectTypeRepr(object) + " has no element slice(...)");
  }
  if (object.is_string()) {
    const std::u32string text = DecodeUtf8(object.as_string());
    std::u32string out;
    for (size_t i : SliceIndices(text.size(), start, stop, step)) out.push_back(text[i]);
    return Value::String(EncodeUtf8(out));
  }
  const auto& items = object.items();
  std::vector<Value> out;
  for (size_t i : SliceIndices(items.size(), start, stop, step)) out.push_back(items[i]);
  return object.kind() == Kind::kTuple ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
}

}  // namespace kappa::tasks::jinja
