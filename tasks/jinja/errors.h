// The interpreter's two internal exceptions. They never leave tasks/jinja:
// template.cc is the one place that turns them into absl::Status (the
// evaluator only catches a RenderError to record its line, and rethrows).
#pragma once

#include <stdexcept>
#include <utility>
#include <string>

namespace kappa::tasks::jinja {

// A template jinja2 would not compile (TemplateSyntaxError /
// TemplateAssertionError), or one that uses a construct kappa does not
// implement. `message` names the construct; `line` is 1-based.
class SyntaxError : public std::runtime_error {
 public:
  SyntaxError(int line, const std::string& message)
      : std::runtime_error(message), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

// A failure while rendering, named after the Python exception jinja2 would
// raise ("TemplateError" for raise_exception(), "UndefinedError",
// "TypeError", ...), or "Unsupported" for a value kappa cannot reproduce
// (e.g. printing a function, whose Python text contains an address).
class RenderError : public std::runtime_error {
 public:
  RenderError(std::string type, const std::string& message)
      : std::runtime_error(message), type_(std::move(type)) {}
  const std::string& type() const { return type_; }
  // The innermost template line being evaluated when it was raised; 0 until
  // the evaluator records it.
  int line() const { return line_; }
  void set_line(int line) {
    if (line_ == 0) line_ = line;
  }

 private:
  std::string type_;
  int line_ = 0;
};

[[noreturn]] inline void ThrowTypeError(const std::string& message) {
  throw RenderError("TypeError", message);
}
[[noreturn]] inline void ThrowValueError(const std::string& message) {
  throw RenderError("ValueError", message);
}
[[noreturn]] inline void ThrowUnsupported(const std::string& message) {
  throw RenderError("Unsupported", message);
}

}  // namespace kappa::tasks::jinja
