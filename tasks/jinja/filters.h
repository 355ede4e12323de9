// jinja2's built-in filters (filters.py) that kappa implements, plus
// transformers' own `tojson` (json.dumps with ensure_ascii=False, indent,
// separators, sort_keys) in place of jinja2's HTML-escaping one.
//
// Implemented: abs attr batch capitalize center count d default dictsort
// first float indent int items join last length list lower map max min
// reject rejectattr replace reverse round select selectattr sort string sum
// title tojson trim unique upper wordcount.
// Not implemented (refused by the parser): the Markup/HTML filters (safe, e,
// escape, forceescape, striptags, urlize, urlencode, xmlattr) and
// filesizeformat, format, groupby, pprint, random, slice, truncate, wordwrap.
#pragma once

#include <string_view>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

bool IsKnownFilter(std::string_view name);

// `input|name(args)`. Throws RenderError as the Python filter raises.
Value ApplyFilter(std::string_view name, const Value& input, const CallArgs& args);

}  // namespace kappa::tasks::jinja
