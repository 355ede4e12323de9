#include "tasks/jinja/globals.h"

#include <sys/time.h>

#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <utility>

#include "tasks/jinja/arguments.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/python_text.h"

namespace kappa::tasks::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

class GlobalFunction : public Callable {
 public:
  using Body = Value (*)(const CallArgs&);
  GlobalFunction(std::string type_name, Body body)
      : type_name_(std::move(type_name)), body_(body) {}
  std::string type_name() const override { return type_name_; }
  Value Call(CallArgs args) const override { return body_(args); }

 private:
  std::string type_name_;
  Body body_;
};

// jinja2.sandbox.safe_range: range(stop) / range(start, stop[, step]).
Value Range(const CallArgs& args) {
  if (!args.keyword.empty()) ThrowTypeError("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) {
    ThrowTypeError("range expected at most 3 arguments, got " + std::to_string(p.size()));
  }
  for (const Value& v : p) {
    if (!v.is_integer()) {
      ThrowTypeError("'" + TypeName(v) + "' object cannot be interpreted as an integer");
    }
  }
  Sequence range;
  range.flavor = ListFlavor::kRange;
  range.range_start = p.size() == 1 ? 0 : p[0].as_int();
  range.range_stop = p.size() == 1 ? p[0].as_int() : p[1].as_int();
  range.range_step = p.size() == 3 ? p[2].as_int() : 1;
  if (range.range_step == 0) ThrowValueError("range() arg 3 must not be zero");
  for (int64_t i = range.range_start;
       range.range_step > 0 ? i < range.range_stop : i > range.range_stop; i += range.range_step) {
    if (static_cast<int64_t>(range.items.size()) >= kMaxRange) {
      throw RenderError("OverflowError",
                        "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    range.items.push_back(Value::Int(i));
  }
  return Value::FromSequence(std::move(range), Kind::kList);
}

// dict(mapping_or_pairs, **kwargs), which namespace() also takes.
Dict BuildDict(const CallArgs& args, const char* function) {
  if (args.positional.size() > 1) {
    ThrowTypeError(std::string(function) + " expected at most 1 argument, got " +
                   std::to_string(args.positional.size()));
  }
  Dict dict;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.kind() == Kind::kDict) {
      dict = source.as_dict();
    } else {
      for (const Value& pair : Iterate(source)) {
        const std::vector<Value> items = Iterate(pair);
        if (items.size() != 2) {
          ThrowValueError("dictionary update sequence element has length " +
                          std::to_string(items.size()) + "; 2 is required");
        }
        dict.Set(items[0], items[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keyword) dict.Set(Value::String(key), value);
  return dict;
}

Value MakeDictGlobal(const CallArgs& args) { return Value::MakeDict(BuildDict(args, "dict")); }

Value MakeNamespaceGlobal(const CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  ns->attributes = BuildDict(args, "Namespace");
  return Value::MakeNamespace(std::move(ns));
}

// transformers: raise jinja2.exceptions.TemplateError(message).
Value RaiseException(const CallArgs& args) {
  BoundArguments bound(args, "raise_exception", {"message"}, 1);
  throw RenderError("TemplateError", Str(bound.get(0)));
}

// transformers: datetime.now().strftime(format). A naive datetime, so %z
// and %Z are empty; %f is the microseconds.
Value StrftimeNow(const CallArgs& args) {
  BoundArguments bound(args, "strftime_now", {"format"}, 1);
  const std::string format = bound.GetString(0, "");
  timeval now;
  gettimeofday(&now, nullptr);
  std::tm local;
  const time_t seconds = now.tv_sec;
  localtime_r(&seconds, &local);
  std::string rewritten;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      rewritten.push_back(format[i]);
      continue;
    }
    const char directive = format[++i];
    if (directive == 'f') {
      char micros[8];
      std::snprintf(micros, sizeof micros, "%06ld", static_cast<long>(now.tv_usec));
      rewritten += micros;
    } else if (directive != 'z' && directive != 'Z') {
      rewritten.push_back('%');
      rewritten.push_back(directive);
    }
  }
  if (rewritten.empty()) return Value::String("");
  std::string out(256 + rewritten.size() * 8, '\0');
  const size_t length = std::strftime(out.data(), out.size(), rewritten.c_str(), &local);
  out.resize(length);
  return Value::String(std::move(out));
}

struct Global {
  const char* name;
  const char* type_name;
  GlobalFunction::Body body;
};

constexpr Global kGlobals[] = {
    {"range", "builtin_function_or_method", Range},
    {"dict", "type", MakeDictGlobal},
    {"namespace", "type", MakeNamespaceGlobal},
    {"raise_exception", "function", RaiseException},
    {"strftime_now", "function", StrftimeNow},
};

}  // namespace

bool IsGlobalFunction(std::string_view name) {
  for (const Global& global : kGlobals) {
    if (name == global.name) return true;
  }
  return false;
}

std::optional<Value> LookupGlobal(std::string_view name) {
  for (const Global& global : kGlobals) {
    if (name == global.name) {
      return Value::MakeCallable(std::make_shared<GlobalFunction>(global.type_name, global.body));
    }
  }
  return std::nullopt;
}

}  // namespace kappa::tasks::jinja
