#include "tasks/jinja/loop.h"

#include <string>
#include <utility>

#include "tasks/jinja/errors.h"
#include "tasks/jinja/python_ops.h"

namespace kappa::tasks::jinja {

// loop.cycle / loop.changed as callables bound to their loop.
class LoopMethod : public Callable {
 public:
  LoopMethod(std::shared_ptr<LoopState> loop, std::string name)
      : loop_(std::move(loop)), name_(std::move(name)) {}
  std::string type_name() const override { return "method"; }
  Value Call(CallArgs args) const override {
    if (!args.keyword.empty()) {
      ThrowTypeError("LoopContext." + name_ + "() got an unexpected keyword argument '" +
                     args.keyword.front().first + "'");
    }
    if (name_ == "cycle") return loop_->Cycle(args.positional);
    return Value::Bool(loop_->Changed(args.positional));
  }

 private:
  std::shared_ptr<LoopState> loop_;
  std::string name_;
};

LoopState::LoopState(std::function<bool(Value*)> pull, std::optional<int64_t> known_length)
    : pull_(std::move(pull)), length_(known_length) {}

bool LoopState::PeekNext(Value* out) {
  if (ahead_.empty()) {
    Value next;
    if (!pull_(&next)) return false;
    ahead_.push_back(std::move(next));
  }
  *out = ahead_.front();
  return true;
}

bool LoopState::Advance() {
  Value next;
  if (!ahead_.empty()) {
    next = std::move(ahead_.front());
    ahead_.pop_front();
  } else if (!pull_(&next)) {
    return false;
  }
  ++index0_;
  before_ = std::move(current_);
  current_ = std::move(next);
  return true;
}

int64_t LoopState::Length() {
  if (!length_) {
    Value item;
    while (pull_(&item)) ahead_.push_back(item);
    length_ = index0_ + 1 + static_cast<int64_t>(ahead_.size());
  }
  return *length_;
}

Value LoopState::Cycle(const std::vector<Value>& args) const {
  if (args.empty()) ThrowTypeError("no items for cycling given");
  return args[static_cast<size_t>(index0_ % static_cast<int64_t>(args.size()))];
}

bool LoopState::Changed(const std::vector<Value>& args) {
  if (last_changed_ && PythonEquals(Value::Tuple(*last_changed_), Value::Tuple(args))) {
    return false;
  }
  last_changed_ = args;
  return true;
}

Value LoopState::Attribute(std::string_view name) {
  if (name == "index0") return Value::Int(index0_);
  if (name == "index") return Value::Int(index0_ + 1);
  if (name == "revindex0") return Value::Int(Length() - (index0_ + 1));
  if (name == "revindex") return Value::Int(Length() - index0_);
  if (name == "first") return Value::Bool(index0_ == 0);
  if (name == "length") return Value::Int(Length());
  if (name == "depth") return Value::Int(1);
  if (name == "depth0") return Value::Int(0);
  Value next;
  if (name == "last") return Value::Bool(!PeekNext(&next));
  if (name == "nextitem") {
    return PeekNext(&next) ? next : Value::Undefined("there is no next item");
  }
  if (name == "previtem") {
    return index0_ == 0 ? Value::Undefined("there is no previous item") : before_;
  }
  if (name == "cycle" || name == "changed") {
    return Value::MakeCallable(std::make_shared<LoopMethod>(shared_from_this(), std::string(name)));
  }
  return Value::UndefinedAttribute(Value::Loop(shared_from_this()), name);
}

std::string LoopState::Str() {
  return "<LoopContext " + std::to_string(index0_ + 1) + "/" + std::to_string(Length()) + ">";
}

}  // namespace kappa::tasks::jinja
