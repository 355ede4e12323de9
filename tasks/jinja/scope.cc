#include "tasks/jinja/scope.h"

namespace kappa::tasks::jinja {

const Value* Scope::Find(std::string_view name) const {
  for (const Scope* scope = this; scope != nullptr; scope = scope->parent_.get()) {
    for (const auto& [key, value] : scope->variables_) {
      if (key == name) return &value;
    }
  }
  return nullptr;
}

void Scope::Set(const std::string& name, Value value) {
  for (auto& entry : variables_) {
    if (entry.first == name) {
      entry.second = std::move(value);
      return;
    }
  }
  variables_.emplace_back(name, std::move(value));
}

}  // namespace kappa::tasks::jinja
