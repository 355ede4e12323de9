#include "tasks/jinja/filters.h"

#include <map>
#include <string>

#include "tasks/jinja/arguments.h"
#include "tasks/jinja/attributes.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/filters_internal.h"
#include "tasks/jinja/json_value.h"
#include "tasks/jinja/methods.h"
#include "tasks/jinja/python_ops.h"
#include "tasks/jinja/python_text.h"

namespace kappa::tasks::jinja {
namespace filters {

std::string SoftStr(const Value& value) { return Str(value); }

// do_default(value, default_value='', boolean=False).
Value Default(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_default", {"default_value", "boolean"});
  if (input.is_undefined() || (bound.GetTruthy(1, false) && !Truthy(input))) {
    return bound.get(0, Value::String(""));
  }
  return input;
}

// do_attr: the Python attribute only, never the item.
Value Attr(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "do_attr", {"name"}, 1);
  const Value& name = bound.get(0);
  if (!name.is_string()) ThrowTypeError("attribute name must be string");
  if (input.kind() == Kind::kNamespace || input.kind() == Kind::kLoop) {
    return GetAttr(input, name.as_string());
  }
  if (std::optional<Value> method = LookupMethod(input, name.as_string())) return *method;
  return Value::UndefinedAttribute(input, name.as_string());
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False) -> json.dumps(...).
Value ToJson(const Value& input, const CallArgs& args) {
  BoundArguments bound(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions options;
  options.ensure_ascii = bound.GetTruthy(0, false);
  options.sort_keys = bound.GetTruthy(3, false);
  const Value indent = bound.get(1, Value::None());
  if (indent.is_string()) {
    options.indent = indent.as_string();
  } else if (indent.is_integer()) {
    options.indent = std::string(static_cast<size_t>(std::max<int64_t>(indent.as_int(), 0)), ' ');
  } else if (!indent.is_none()) {
    ThrowTypeError("can't multiply sequence by non-int of type '" + TypeName(indent) + "'");
  }
  const Value separators = bound.get(2, Value::None());
  if (!separators.is_none()) {
    const std::vector<Value> parts = Iterate(separators);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string()) {
      ThrowValueError("separators must be a pair of strings");
    }
    options.item_separator = parts[0].as_string();
    options.key_separator = parts[1].as_string();
  }
  return Value::String(JsonDumps(input, options));
}

}  // namespace filters

namespace {

const std::map<std::string, filters::Filter, std::less<>>& Registry() {
  static const auto* registry = new std::map<std::string, filters::Filter, std::less<>>{
      {"abs", filters::Abs},
      {"attr", filters::Attr},
      {"batch", filters::Batch},
      {"capitalize", filters::Capitalize},
      {"center", filters::Center},
      {"count", filters::Length},
      {"d", filters::Default},
      {"default", filters::Default},
      {"dictsort", filters::DictSort},
      {"first", filters::First},
      {"float", filters::Float},
      {"indent", filters::Indent},
      {"int", filters::Int},
      {"items", filters::Items},
      {"join", filters::Join},
      {"last", filters::Last},
      {"length", filters::Length},
      {"list", filters::List},
      {"lower", filters::Lower},
      {"map", filters::Map},
      {"max", filters::Max},
      {"min", filters::Min},
      {"reject", filters::Reject},
      {"rejectattr", filters::RejectAttr},
      {"replace", filters::Replace},
      {"reverse", filters::Reverse},
      {"round", filters::Round},
      {"select", filters::Select},
      {"selectattr", filters::SelectAttr},
      {"sort", filters::Sort},
      {"string", filters::String},
      {"sum", filters::Sum},
      {"title", filters::Title},
      {"tojson", filters::ToJson},
      {"trim", filters::Trim},
      {"unique", filters::Unique},
      {"upper", filters::Upper},
      {"wordcount", filters::WordCount},
  };
  return *registry;
}

}  // namespace

bool IsKnownFilter(std::string_view name) { return Registry().count(name) != 0; }

Value ApplyFilter(std::string_view name, const Value& input, const CallArgs& args) {
  const auto it = Registry().find(name);
  if (it == Registry().end()) {
    throw RenderError("TemplateRuntimeError", "No filter named '" + std::string(name) + "'.");
  }
  return it->second(input, args);
}

}  // namespace kappa::tasks::jinja
