// Variable scopes with jinja2's rules: the render variables and top-level
// `set`s share the root scope; each for-loop iteration, macro call, `with`
// and block body gets a child scope, so a `set` inside it does not leak out
// (hence namespace()). Lookups walk outwards; macros keep the scope they
// were defined in and read it when called.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

class Scope;
using ScopePtr = std::shared_ptr<Scope>;

class Scope {
 public:
  explicit Scope(ScopePtr parent) : parent_(std::move(parent)) {}

  // The innermost binding of `name`, or null.
  const Value* Find(std::string_view name) const;
  // Binds `name` in this scope.
  void Set(const std::string& name, Value value);
  // Drops every binding (breaks the cycle a macro closed over its own
  // defining scope makes).
  void Clear() { variables_.clear(); }

 private:
  ScopePtr parent_;
  std::vector<std::pair<std::string, Value>> variables_;
};

}  // namespace kappa::tasks::jinja
