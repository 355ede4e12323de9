// jinja2's parser (parser.py) for kappa's subset, with operator precedence,
// tuples, slices, filters, tests and the statements chat templates use.
//
// Tags: if/elif/else, for (tuple targets, `if` filter, else), set (names,
// tuples, namespace attributes, and block form with filters), macro, filter,
// with, generation (transformers' AssistantTracker; rendered as a scoped
// pass-through), break/continue (jinja2.ext.loopcontrols), print, raw.
//
// Refused at parse time, each naming itself and its line: any other tag
// (extends, block, include, import, from, call, autoescape, do...), an
// unknown filter or test, a call of anything but a global function
// (range, dict, namespace, raise_exception, strftime_now), a macro of the
// template, or a supported method; recursive loops; *args/**kwargs; macros
// that read varargs/kwargs; break/continue outside a loop.
#pragma once

#include <vector>

#include "tasks/jinja/ast.h"
#include "tasks/jinja/lexer.h"

namespace kappa::tasks::jinja {

// Throws SyntaxError.
Program Parse(std::vector<Token> tokens);

}  // namespace kappa::tasks::jinja
