// Sequence filters. Those that are generator functions in jinja2 (select,
// reject, selectattr, rejectattr, map, unique, items, batch) return lazy
// generators here too: their work, and their errors, happen as they are
// consumed.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tasks/jinja/arguments.h"
#include "tasks/jinja/attributes.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/filters.h"
#include "tasks/jinja/filters_internal.h"
#include "tasks/jinja/loop.h"
#include "tasks/jinja/python_ops.h"
#include "tasks/jinja/python_str.h"
#include "tasks/jinja/python_text.h"
#include "tasks/jinja/template_tests.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja::filters {
namespace {

[[noreturn]] void ThrowFilterArgument(const std::string& message) {
  throw RenderError("FilterArgumentError", message);
}

// jinja2's ignore_case: strings lower-cased for comparison.
Value IgnoreCase(const Value& value) {
  return value.is_string() ? Value::String(jinja::Lower(value.as_string())) : value;
}

// make_attrgetter: "a.b.0" looked up part by part with the sandbox's
// getitem; `fallback` replaces an Undefined part (map's default=).
class AttributeGetter {
 public:
  AttributeGetter(const Value& attribute, bool ignore_case, std::optional<Value> fallback = {})
      : ignore_case_(ignore_case), fallback_(std::move(fallback)) {
    if (attribute.is_none()) return;
    if (!attribute.is_string()) {
      parts_.push_back(attribute);
      return;
    }
    for (const std::string& part : Split(attribute.as_string(), std::string("."), -1)) {
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return c >= '0' && c <= '9';
      });
      parts_.push_back(digits ? Value::Int(std::stoll(part)) : Value::String(part));
    }
  }

  Value operator()(Value item) const {
    for (const Value& part : parts_) {
      item = GetItem(item, part);
      if (fallback_ && item.is_undefined()) item = *fallback_;
    }
    return ignore_case_ ? IgnoreCase(item) : item;
  }

 private:
  std::vector<Value> parts_;
  bool ignore_case_;
  std::optional<Value> fallback_;
};

// make_multi_attrgetter: "age,name" gives a list key [age, name].
class MultiAttributeGetter {
 public:
  MultiAttributeGetter(const Value& attribute, bool ignore_case) {
    if (!attribute.is_string()) {
      getters_.emplace_back(attribute, ignore_case);
      return;
    }
    for (const std::string& part : Split(attribute.as_string(), std::string(","), -1)) {
      getters_.emplace_back(Value::String(part), ignore_case);
    }
  }

  Value operator()(const Value& item) const {
    std::vector<Value> key;
    for (const AttributeGetter& getter : getters_) key.push_back(getter(item));
    return Value::List(std::move(key));
  }

 private:
  std::vector<AttributeGetter> getters_;
};

// A generator whose body (setup included) runs at the first pull, as a
// Python generator function's does.
using GeneratorStart = std::function<std::function<bool(Value*)>()>;
Value LazyGenerator(GeneratorStart start) {
  auto next = std::make_shared<std::function<bool(Value*)>>();
  return Value::MakeIterator(MakeGenerator("generator", [start, next](Value* out) {
    if (!*next) *next = start();
    return (*next)(out);
  }));
}

bool Exhausted(Value*) { return false; }

// select/reject/selectattr/rejectattr: select_or_reject().
Value SelectOrReject(const Value& input, const CallArgs& args, bool keep_when, bool lookup_attr) {
  return LazyGenerator([input, args, keep_when, lookup_attr]() -> std::function<bool(Value*)> {
    if (!Truthy(input)) return Exhausted;
    size_t offset = 0;
    std::optional<AttributeGetter> getter;
    if (lookup_attr) {
      if (args.positional.empty()) ThrowFilterArgument("Missing parameter for attribute name");
      getter.emplace(args.positional[0], false);
      offset = 1;
    }
    std::optional<std::string> test;
    CallArgs test_args;
    if (args.positional.size() > offset) {
      const Value& name = args.positional[offset];
      if (!name.is_string()) ThrowTypeError("test name must be a string");
      test = name.as_string();
      test_args.positional.assign(args.positional.begin() + static_cast<long>(offset) + 1,
                                  args.positional.end());
      test_args.keyword = args.keyword;
    }
    auto pull = Pull(input);
    return [pull, getter, test, test_args, keep_when](Value* out) {
      Value item;
      while (pull(&item)) {
        const Value probe = getter ? (*getter)(item) : item;
        const bool passed = test ? ApplyTest(*test, probe, test_args) : Truthy(probe);
        if (passed == keep_when) {
          *out = item;
          return true;
        }
      }
      return false;
    };
  });
}

// Python's max()/min() with a key: the first extreme item.
Value Extreme(const Value& input, const CallArgs& args, const char* filter, bool maximum) {
  BoundArguments bound(args, filter, {"case_sensitive", "attribute"});
  const std::vector<Value> items = Iterate(input);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const AttributeGetter key(bound.get(1, Value::None()), !bound.GetTruthy(0, false));
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value candidate = key(items[i]);
    if (Compare(maximum ? CompareOp::kGt : CompareOp::kLt, candidate, best_key)) {
      best = i;
      best_key = std::move(candidate);
    }
  }
  return items[best];
}

std::vector<Value> SortedBy(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? Compare(CompareOp::kLt, keys[b], keys[a])
                   : Compare(CompareOp::kLt, keys[a], keys[b]);
  });
  std::vector<Value> sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(std::move(items[i]));
  return sorted;
}

bool IsHashable(const Value& v) {
  if (v.kind() == Kind::kList || v.kind() == Kind::kDict) return false;
  if (v.kind() == Kind::kTuple) {
    return std::all_of(v.items().begin(), v.items().end(), IsHashable);
  }
  return true;
}

std::string ReversedTypeName(const Value& value) {
  switch (value.kind()) {
    case Kind::kTuple: return "reversed";
    case Kind::kDict: return "dict_reversekeyiterator";
    case Kind::kUndefined: return "reversed";
    default: break;
  }
  switch (value.as_sequence().flavor) {
    case ListFlavor::kRange: return "range_iterator";
    case ListFlavor::kDictItems: return "dict_reverseitemiterator";
    case ListFlavor::kDictKeys: return "dict_reversekeyiterator";
    case ListFlavor::kDictValues: return "dict_reversevalueiterator";
    case ListFlavor::kList: return "list_reverseiterator";
  }
  return "reversed";
}

}  // namespace

Value Select(const Value& input, const CallArgs& args) {
  return SelectOrReject(input, args, true, false);
}
Value Reject(const Value& input, const CallArgs& args) {
  return SelectOrReject(input, args, false, false);
}
Value SelectAttr(const Value& input, const CallArgs& args) {
  return SelectOrReject(input, args, true, true);
}
Value RejectAttr(const Value& input, const CallArgs& args) {
  return SelectOrReject(input, args, false, true);
}

// do_map(value, name, *args, **kwargs) or do_map(value, attribute=, default=).
Value Map(const Value& input, const CallArgs& args) {
  return LazyGenerator([input, args]() -> std::function<bool(Value*)> {
    if (!Truthy(input)) return Exhausted;
    std::function<Value(const Value&)> transform;
    const auto attribute = std::find_if(args.keyword.begin(), args.keyword.end(),
                                        [](const auto& kw) { return kw.first == "attribute"; });
    if (args.positional.empty() && attribute != args.keyword.end()) {
      std::optional<Value> fallback;
      for (const auto& [key, value] : args.keyword) {
        if (key == "default") {
          if (!value.is_none()) fallback = value;
        } else if (key != "attribute") {
          ThrowFilterArgument("Unexpected keyword argument '" + key + "'");
        }
      }
      AttributeGetter getter(attribute->second, false, fallback);
      transform = [getter](const Value& item) { return getter(item); };
    } else {
      if (args.positional.empty()) ThrowFilterArgument("map requires a filter argument");
      if (!args.positional[0].is_string()) ThrowTypeError("filter name must be a string");
      const std::string name = args.positional[0].as_string();
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keyword = args.keyword;
      transform = [name, rest](const Value& item) { return ApplyFilter(name, item, rest); };
    }
    auto pull = Pull(input);
    return [pull, transform](Value* out) {
      Value item;
      if (!pull(&item)) return false;
      *out = transform(item);
      return true;
    };
  });
}

// do_unique(value, case_sensitive=False, attribute=None).
Value Unique(const Value& input, const CallArgs& args) {
  return LazyGenerator([input, args]() -> std::function<bool(Value*)> {
    BoundArguments bound(args, "do_unique", {"case_sensitive", "attribute"});
    const AttributeGetter key(bound.get(1, Value::None()), !bound.GetTruthy(0, false));
    auto pull = Pull(input);
    auto seen = std::make_shared<std::vector<Value>>();
    return [pull, key, seen](Value* out) {
      Value item;
      while (pull(&item)) {
        const Value k = key(item);
        if (!IsHashable(k)) ThrowTypeError("unhashable type: '" + TypeName(k) + "'");
        const bool repeated = std::any_of(seen->begin(), seen->end(),
                                          [&](const Value& s) { return PythonEquals(s, k); });
        if (repeated) continue;
        seen->push_back(k);
        *out = item;
        return true;
      }
      return false;
    };
  });
}

// do_items(value): (key, value) pairs of a mapping; nothing for Undefined.
Value Items(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_items", {});
  return LazyGenerator([input]() -> std::function<bool(Value*)> {
    if (input.is_undefined()) return Exhausted;
    if (input.kind() != Kind::kDict) ThrowTypeError("Can only get item pairs from a mapping.");
    std::vector<Value> pairs;
    for (const auto& [key, value] : input.as_dict().entries()) {
      pairs.push_back(Value::Tuple({key, value}));
    }
    return Pull(Value::List(std::move(pairs)));
  });
}

// do_batch(value, linecount, fill_with=None).
Value Batch(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_batch", {"linecount", "fill_with"}, 1);
  const int64_t linecount = bound.GetInt(0, 0);
  const Value fill = bound.get(1, Value::None());
  return LazyGenerator([input, linecount, fill]() -> std::function<bool(Value*)> {
    auto pull = Pull(input);
    auto batch = std::make_shared<std::vector<Value>>();
    auto done = std::make_shared<bool>(false);
    return [pull, batch, done, linecount, fill](Value* out) {
      if (*done) return false;
      Value item;
      while (pull(&item)) {
        if (static_cast<int64_t>(batch->size()) == linecount) {
          *out = Value::List(std::move(*batch));
          *batch = {item};
          return true;
        }
        batch->push_back(item);
      }
      *done = true;
      if (batch->empty()) return false;
      if (!fill.is_none()) {
        while (static_cast<int64_t>(batch->size()) < linecount) batch->push_back(fill);
      }
      *out = Value::List(std::move(*batch));
      return true;
    };
  });
}

// do_dictsort(value, case_sensitive=False, by='key', reverse=False).
Value DictSort(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_dictsort", {"case_sensitive", "by", "reverse"});
  const std::string by = bound.GetString(1, "key");
  if (by != "key" && by != "value") {
    ThrowFilterArgument("You can only sort by either \"key\" or \"value\"");
  }
  if (input.is_undefined()) input.ThrowUndefined();
  if (input.kind() != Kind::kDict) {
    throw RenderError("AttributeError", "'" + TypeName(input) + "' object has no attribute 'items'");
  }
  const bool ignore_case = !bound.GetTruthy(0, false);
  std::vector<Value> pairs, keys;
  for (const auto& [key, value] : input.as_dict().entries()) {
    pairs.push_back(Value::Tuple({key, value}));
    const Value& sort_on = by == "key" ? key : value;
    keys.push_back(ignore_case ? IgnoreCase(sort_on) : sort_on);
  }
  return Value::List(SortedBy(std::move(pairs), keys, bound.GetTruthy(2, false)));
}

// do_sort(value, reverse=False, case_sensitive=False, attribute=None).
Value Sort(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_sort", {"reverse", "case_sensitive", "attribute"});
  const MultiAttributeGetter key(bound.get(2, Value::None()), !bound.GetTruthy(1, false));
  std::vector<Value> items = Iterate(input);
  std::vector<Value> keys;
  for (const Value& item : items) keys.push_back(key(item));
  return Value::List(SortedBy(std::move(items), keys, bound.GetTruthy(0, false)));
}

Value First(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_first", {});
  Value item;
  if (Pull(input)(&item)) return item;
  return Value::Undefined("No first item, sequence was empty.");
}

Value Last(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_last", {});
  if (input.kind() == Kind::kIterator || (!input.is_string() && !input.is_sequence() &&
                                          input.kind() != Kind::kDict && !input.is_undefined())) {
    ThrowTypeError("'" + TypeName(input) + "' object is not reversible");
  }
  const std::vector<Value> items = Iterate(input);
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

// do_join(value, d='', attribute=None): str(d).join(map(str, value)).
Value Join(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_join", {"d", "attribute"});
  const std::string separator = Str(bound.get(0, Value::String("")));
  std::vector<Value> items = Iterate(input);
  if (bound.has(1) && !bound.get(1).is_none()) {
    const AttributeGetter getter(bound.get(1), false);
    for (Value& item : items) item = getter(item);
  }
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += Str(items[i]);
  }
  return Value::String(std::move(out));
}

// len(value).
Value Length(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "len", {});
  switch (input.kind()) {
    case Kind::kUndefined: return Value::Int(0);
    case Kind::kString: return Value::Int(static_cast<int64_t>(CodePointCount(input.as_string())));
    case Kind::kList:
    case Kind::kTuple: return Value::Int(static_cast<int64_t>(input.items().size()));
    case Kind::kDict: return Value::Int(static_cast<int64_t>(input.as_dict().size()));
    case Kind::kLoop: return input.as_loop().Attribute("length");
    default: ThrowTypeError("object of type '" + TypeName(input) + "' has no len()");
  }
}

Value List(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_list", {});
  return Value::List(Iterate(input));
}

Value Max(const Value& input, const CallArgs& args) { return Extreme(input, args, "do_max", true); }
Value Min(const Value& input, const CallArgs& args) { return Extreme(input, args, "do_min", false); }

// do_reverse: a reversed str, an iterator over a reversible value, else
// the reversed list of its items.
Value Reverse(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_reverse", {});
  if (input.is_string()) {
    std::u32string text = DecodeUtf8(input.as_string());
    std::reverse(text.begin(), text.end());
    return Value::String(EncodeUtf8(text));
  }
  const bool reversible = input.is_sequence() || input.kind() == Kind::kDict || input.is_undefined();
  if (!reversible && input.kind() != Kind::kIterator) {
    ThrowFilterArgument("argument must be iterable");
  }
  std::vector<Value> items = Iterate(input);
  std::reverse(items.begin(), items.end());
  if (!reversible) return Value::List(std::move(items));
  return Value::MakeIterator(MakeGenerator(ReversedTypeName(input), Pull(Value::List(std::move(items)))));
}

// do_sum(iterable, attribute=None, start=0).
Value Sum(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_sum", {"attribute", "start"});
  Value total = bound.get(1, Value::Int(0));
  const bool by_attribute = bound.has(0) && !bound.get(0).is_none();
  const AttributeGetter getter(bound.get(0, Value::None()), false);
  for (const Value& item : Iterate(input)) total = Add(total, by_attribute ? getter(item) : item);
  return total;
}

}  // namespace kappa::tasks::jinja::filters
