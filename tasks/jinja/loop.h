// jinja2's LoopContext: the `loop` variable of a for loop. Items are pulled
// lazily (a `for ... if cond` filter runs as the loop advances, as jinja2's
// generator does); loop.last/nextitem peek one item ahead and loop.length
// pulls the rest, exactly when jinja2 would.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

class LoopState : public std::enable_shared_from_this<LoopState> {
 public:
  // `pull` produces the next item or returns false at the end;
  // `known_length` is len(iterable) when the iterable has one (no filter).
  LoopState(std::function<bool(Value*)> pull, std::optional<int64_t> known_length);

  // Moves to the next item; false when the loop is over.
  bool Advance();
  const Value& current() const { return current_; }

  // loop.<name>: index, index0, revindex, revindex0, first, last, length,
  // previtem, nextitem, depth, depth0, cycle, changed. Others are Undefined.
  Value Attribute(std::string_view name);

  // "<LoopContext 2/3>", str(loop).
  std::string Str();

 private:
  bool PeekNext(Value* out);
  int64_t Length();
  Value Cycle(const std::vector<Value>& args) const;
  bool Changed(const std::vector<Value>& args);

  std::function<bool(Value*)> pull_;
  std::optional<int64_t> length_;
  std::deque<Value> ahead_;  // Items pulled but not reached yet.
  int64_t index0_ = -1;
  Value before_;
  Value current_;
  std::optional<std::vector<Value>> last_changed_;

  friend class LoopMethod;
};

}  // namespace kappa::tasks::jinja
