// The filter implementations behind filters.h's dispatch, one function per
// jinja2 filter, grouped by what they work on (text, numbers, sequences).
#pragma once

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja::filters {

using Filter = Value (*)(const Value& input, const CallArgs& args);

// filters_text.cc
Value Capitalize(const Value& input, const CallArgs& args);
Value Center(const Value& input, const CallArgs& args);
Value Indent(const Value& input, const CallArgs& args);
Value Lower(const Value& input, const CallArgs& args);
Value Replace(const Value& input, const CallArgs& args);
Value String(const Value& input, const CallArgs& args);
Value Title(const Value& input, const CallArgs& args);
Value Trim(const Value& input, const CallArgs& args);
Value Upper(const Value& input, const CallArgs& args);
Value WordCount(const Value& input, const CallArgs& args);

// filters_numbers.cc
Value Abs(const Value& input, const CallArgs& args);
Value Float(const Value& input, const CallArgs& args);
Value Int(const Value& input, const CallArgs& args);
Value Round(const Value& input, const CallArgs& args);

// filters_sequences.cc
Value Batch(const Value& input, const CallArgs& args);
Value DictSort(const Value& input, const CallArgs& args);
Value First(const Value& input, const CallArgs& args);
Value Items(const Value& input, const CallArgs& args);
Value Join(const Value& input, const CallArgs& args);
Value Last(const Value& input, const CallArgs& args);
Value Length(const Value& input, const CallArgs& args);
Value List(const Value& input, const CallArgs& args);
Value Map(const Value& input, const CallArgs& args);
Value Max(const Value& input, const CallArgs& args);
Value Min(const Value& input, const CallArgs& args);
Value Reject(const Value& input, const CallArgs& args);
Value RejectAttr(const Value& input, const CallArgs& args);
Value Reverse(const Value& input, const CallArgs& args);
Value Select(const Value& input, const CallArgs& args);
Value SelectAttr(const Value& input, const CallArgs& args);
Value Sort(const Value& input, const CallArgs& args);
Value Sum(const Value& input, const CallArgs& args);
Value Unique(const Value& input, const CallArgs& args);

// filters.cc
Value Attr(const Value& input, const CallArgs& args);
Value Default(const Value& input, const CallArgs& args);
Value ToJson(const Value& input, const CallArgs& args);

// jinja2's soft_str: str(x), Undefined as "".
std::string SoftStr(const Value& value);

}  // namespace kappa::tasks::jinja::filters
