#include "tasks/jinja/evaluator.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tasks/jinja/attributes.h"
#include "tasks/jinja/errors.h"
#include "tasks/jinja/filters.h"
#include "tasks/jinja/globals.h"
#include "tasks/jinja/loop.h"
#include "tasks/jinja/python_ops.h"
#include "tasks/jinja/python_text.h"
#include "tasks/jinja/scope.h"
#include "tasks/jinja/template_tests.h"

namespace kappa::tasks::jinja {
namespace {

constexpr int kMaxMacroDepth = 200;

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter;

// A template macro: renders its body in a child of the scope it was
// defined in, with jinja2's argument rules.
class Macro : public Callable {
 public:
  Macro(const MacroStmt* definition, ScopePtr closure, Interpreter* interpreter)
      : definition_(definition), closure_(std::move(closure)), interpreter_(interpreter) {}
  std::string type_name() const override { return "Macro"; }
  Value Call(CallArgs args) const override;

 private:
  const MacroStmt* definition_;
  ScopePtr closure_;
  Interpreter* interpreter_;
};

class DepthGuard {
 public:
  explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
  ~DepthGuard() { --*depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int* depth_;
};

class Interpreter {
 public:
  // Scopes can end up in cycles (a macro closes over the scope that holds
  // it; a loop object stored in a namespace); clearing them all frees them.
  ~Interpreter() {
    for (const ScopePtr& scope : scopes_) scope->Clear();
  }

  std::string Render(const Program& program, const Dict& variables) {
    ScopePtr root = NewScope(nullptr);
    for (const auto& [key, value] : variables.entries()) root->Set(key.as_string(), value);
    std::string out;
    ExecBody(program.body, root, &out);
    return out;
  }

  Value CallMacro(const MacroStmt& macro, const ScopePtr& closure, CallArgs args) {
    if (macro_depth_ >= kMaxMacroDepth) {
      throw RenderError("RecursionError", "maximum recursion depth exceeded in macro '" +
                                              macro.name + "'");
    }
    const size_t count = macro.parameters.size();
    if (args.positional.size() > count) {
      ThrowTypeError("macro '" + macro.name + "' takes not more than " + std::to_string(count) +
                     " argument(s)");
    }
    std::vector<std::optional<Value>> values(count);
    for (size_t i = 0; i < args.positional.size(); ++i) values[i] = std::move(args.positional[i]);
    for (auto& [name, value] : args.keyword) {
      size_t index = args.positional.size();
      while (index < count && macro.parameters[index] != name) ++index;
      if (index == count) {
        ThrowTypeError("macro '" + macro.name + "' takes no keyword argument '" + name + "'");
      }
      values[index] = std::move(value);
    }
    auto scope = NewScope(closure);
    const size_t first_default = count - macro.defaults.size();
    for (size_t i = 0; i < count; ++i) {
      const std::string& parameter = macro.parameters[i];
      if (values[i]) {
        scope->Set(parameter, std::move(*values[i]));
      } else if (i >= first_default) {
        scope->Set(parameter, Eval(*macro.defaults[i - first_default], scope));
      } else {
        scope->Set(parameter, Value::Undefined("parameter '" + parameter + "' was not provided"));
      }
    }
    DepthGuard depth(&macro_depth_);
    std::string out;
    ExecBody(macro.body, scope, &out);
    return Value::String(std::move(out));
  }

 private:
  // ---- statements -------------------------------------------------------
  Flow ExecBody(const Body& body, const ScopePtr& scope, std::string* out) {
    for (const StmtPtr& statement : body) {
      const Flow flow = Exec(*statement, scope, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow Exec(const Stmt& statement, const ScopePtr& scope, std::string* out) {
    try {
      return ExecStatement(statement, scope, out);
    } catch (RenderError& error) {
      error.set_line(statement.line);
      throw;
    }
  }

  Flow ExecStatement(const Stmt& statement, const ScopePtr& scope, std::string* out) {
    switch (statement.kind) {
      case StmtKind::kText:
        out->append(static_cast<const TextStmt&>(statement).text);
        return Flow::kNormal;
      case StmtKind::kOutput:
        out->append(Str(Eval(*static_cast<const OutputStmt&>(statement).expr, scope)));
        return Flow::kNormal;
      case StmtKind::kIf: return ExecIf(static_cast<const IfStmt&>(statement), scope, out);
      case StmtKind::kFor: return ExecFor(static_cast<const ForStmt&>(statement), scope, out);
      case StmtKind::kSet: {
        const auto& set = static_cast<const SetStmt&>(statement);
        Assign(set.target, Eval(*set.value, scope), scope);
        return Flow::kNormal;
      }
      case StmtKind::kSetBlock: {
        const auto& block = static_cast<const BlockStmt&>(statement);
        Assign(block.target, RenderBlock(block, scope), scope);
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock:
        out->append(Str(RenderBlock(static_cast<const BlockStmt&>(statement), scope)));
        return Flow::kNormal;
      case StmtKind::kMacro: {
        const auto& macro = static_cast<const MacroStmt&>(statement);
        scope->Set(macro.name, Value::MakeCallable(std::make_shared<Macro>(&macro, scope, this)));
        return Flow::kNormal;
      }
      case StmtKind::kWith: return ExecWith(static_cast<const WithStmt&>(statement), scope, out);
      case StmtKind::kScope:
        ExecBody(static_cast<const ScopeStmt&>(statement).body, NewScope(scope), out);
        return Flow::kNormal;
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Flow ExecIf(const IfStmt& node, const ScopePtr& scope, std::string* out) {
    for (const auto& [test, body] : node.branches) {
      if (Truthy(Eval(*test, scope))) return ExecBody(body, scope, out);
    }
    return ExecBody(node.otherwise, scope, out);
  }

  Flow ExecFor(const ForStmt& node, const ScopePtr& scope, std::string* out) {
    const Value iterable = Eval(*node.iterable, scope);
    std::function<bool(Value*)> pull = Pull(iterable);
    std::optional<int64_t> length;
    if (iterable.kind() != Kind::kIterator && !node.filter) {
      length = iterable.is_undefined() ? 0 : static_cast<int64_t>(Iterate(iterable).size());
    }
    if (node.filter) {
      // `for x in xs if cond`: cond sees x (and the enclosing loop).
      pull = [this, &node, scope, source = std::move(pull)](Value* item) {
        while (source(item)) {
          auto probe = NewScope(scope);
          Assign(node.target, *item, probe);
          if (Truthy(Eval(*node.filter, probe))) return true;
        }
        return false;
      };
    }
    auto loop = std::make_shared<LoopState>(std::move(pull), length);
    bool iterated = false;
    while (loop->Advance()) {
      iterated = true;
      auto iteration = NewScope(scope);
      Assign(node.target, loop->current(), iteration);
      iteration->Set("loop", Value::Loop(loop));
      if (ExecBody(node.body, iteration, out) == Flow::kBreak) break;
    }
    if (!iterated) ExecBody(node.otherwise, NewScope(scope), out);
    return Flow::kNormal;
  }

  Flow ExecWith(const WithStmt& node, const ScopePtr& scope, std::string* out) {
    std::vector<Value> values;
    for (const ExprPtr& value : node.values) values.push_back(Eval(*value, scope));
    auto inner = NewScope(scope);
    for (size_t i = 0; i < node.targets.size(); ++i) Assign(node.targets[i], values[i], inner);
    return ExecBody(node.body, inner, out);
  }

  // A set-block or filter-block body, rendered in its own scope and passed
  // through the block's filters.
  Value RenderBlock(const BlockStmt& block, const ScopePtr& scope) {
    std::string body;
    ExecBody(block.body, NewScope(scope), &body);
    Value text = Value::String(std::move(body));
    if (!block.filter) return text;
    return EvalFilter(static_cast<const FilterExpr&>(*block.filter), scope, &text);
  }

  void Assign(const Target& target, const Value& value, const ScopePtr& scope) {
    switch (target.kind) {
      case Target::Kind::kName: scope->Set(target.name, value); return;
      case Target::Kind::kNamespaceAttribute: {
        const Value* ns = scope->Find(target.name);
        if (ns == nullptr || ns->kind() != Kind::kNamespace) {
          throw RenderError("TemplateRuntimeError",
                            "cannot assign attribute on non-namespace object");
        }
        ns->as_namespace().attributes.Set(Value::String(target.attribute), value);
        return;
      }
      case Target::Kind::kTuple: {
        const std::vector<Value> items = Iterate(value);
        const size_t expected = target.items.size();
        if (items.size() < expected) {
          ThrowValueError("not enough values to unpack (expected " + std::to_string(expected) +
                          ", got " + std::to_string(items.size()) + ")");
        }
        if (items.size() > expected) {
          ThrowValueError("too many values to unpack (expected " + std::to_string(expected) + ")");
        }
        for (size_t i = 0; i < expected; ++i) Assign(target.items[i], items[i], scope);
        return;
      }
    }
  }

  // ---- expressions ------------------------------------------------------
  Value Eval(const Expr& expr, const ScopePtr& scope) {
    try {
      return EvalExpr(expr, scope);
    } catch (RenderError& error) {
      error.set_line(expr.line);
      throw;
    }
  }

  Value EvalExpr(const Expr& expr, const ScopePtr& scope) {
    switch (expr.kind) {
      case ExprKind::kLiteral: return static_cast<const LiteralExpr&>(expr).value;
      case ExprKind::kName: return LookupName(static_cast<const NameExpr&>(expr).name, scope);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        for (const ExprPtr& item : static_cast<const SequenceExpr&>(expr).items) {
          items.push_back(Eval(*item, scope));
        }
        return expr.kind == ExprKind::kList ? Value::List(std::move(items))
                                            : Value::Tuple(std::move(items));
      }
      case ExprKind::kDict: return EvalDict(static_cast<const DictExpr&>(expr), scope);
      case ExprKind::kGetAttr: {
        const auto& node = static_cast<const GetAttrExpr&>(expr);
        return GetAttr(Eval(*node.object, scope), node.name);
      }
      case ExprKind::kGetItem: {
        const auto& node = static_cast<const GetItemExpr&>(expr);
        const Value object = Eval(*node.object, scope);
        return GetItem(object, Eval(*node.key, scope));
      }
      case ExprKind::kSlice: return EvalSlice(static_cast<const SliceExpr&>(expr), scope);
      case ExprKind::kCall: return EvalCall(static_cast<const CallExpr&>(expr), scope);
      case ExprKind::kFilter:
        return EvalFilter(static_cast<const FilterExpr&>(expr), scope, nullptr);
      case ExprKind::kTest: {
        const auto& node = static_cast<const TestExpr&>(expr);
        const Value value = Eval(*node.operand, scope);
        return Value::Bool(ApplyTest(node.name, value, EvalArgs(node.args, scope)));
      }
      case ExprKind::kUnary: return EvalUnary(static_cast<const UnaryExpr&>(expr), scope);
      case ExprKind::kBinary: return EvalBinary(static_cast<const BinaryExpr&>(expr), scope);
      case ExprKind::kCompare: return EvalCompare(static_cast<const CompareExpr&>(expr), scope);
      case ExprKind::kCondition: {
        const auto& node = static_cast<const ConditionExpr&>(expr);
        if (Truthy(Eval(*node.test, scope))) return Eval(*node.then, scope);
        if (node.otherwise) return Eval(*node.otherwise, scope);
        return Value::Undefined("the inline if-expression on line " + std::to_string(expr.line) +
                                " evaluated to false and no else section was defined.");
      }
    }
    ThrowUnsupported("unknown expression");
  }

  static Value LookupName(const std::string& name, const ScopePtr& scope) {
    if (const Value* value = scope->Find(name)) return *value;
    if (std::optional<Value> global = LookupGlobal(name)) return *global;
    return Value::UndefinedName(name);
  }

  Value EvalDict(const DictExpr& node, const ScopePtr& scope) {
    Dict dict;
    for (const auto& [key_expr, value_expr] : node.items) {
      Value key = Eval(*key_expr, scope);
      if (key.kind() == Kind::kList || key.kind() == Kind::kDict) {
        ThrowTypeError("unhashable type: '" + TypeName(key) + "'");
      }
      dict.Set(std::move(key), Eval(*value_expr, scope));
    }
    return Value::MakeDict(std::move(dict));
  }

  Value EvalSlice(const SliceExpr& node, const ScopePtr& scope) {
    const Value object = Eval(*node.object, scope);
    auto part = [&](const ExprPtr& e) -> std::optional<Value> {
      if (!e) return std::nullopt;
      return Eval(*e, scope);
    };
    const std::optional<Value> start = part(node.start), stop = part(node.stop),
                               step = part(node.step);
    return GetSlice(object, start, stop, step);
  }

  CallArgs EvalArgs(const CallArguments& args, const ScopePtr& scope) {
    CallArgs values;
    for (const ExprPtr& arg : args.positional) values.positional.push_back(Eval(*arg, scope));
    for (const auto& [name, arg] : args.keyword) {
      values.keyword.emplace_back(name, Eval(*arg, scope));
    }
    return values;
  }

  Value EvalCall(const CallExpr& node, const ScopePtr& scope) {
    const Value callee = Eval(*node.callee, scope);
    CallArgs args = EvalArgs(node.args, scope);
    if (callee.is_undefined()) callee.ThrowUndefined();
    if (callee.kind() != Kind::kCallable) {
      ThrowTypeError("'" + TypeName(callee) + "' object is not callable");
    }
    return callee.as_callable().Call(std::move(args));
  }

  // `operand|name(args)`; a null innermost operand is `*block_input`.
  Value EvalFilter(const FilterExpr& node, const ScopePtr& scope, const Value* block_input) {
    try {
      Value input;
      if (!node.operand) {
        input = *block_input;
      } else if (node.operand->kind == ExprKind::kFilter && block_input != nullptr) {
        input = EvalFilter(static_cast<const FilterExpr&>(*node.operand), scope, block_input);
      } else {
        input = Eval(*node.operand, scope);
      }
      return ApplyFilter(node.name, input, EvalArgs(node.args, scope));
    } catch (RenderError& error) {
      error.set_line(node.line);
      throw;
    }
  }

  Value EvalUnary(const UnaryExpr& node, const ScopePtr& scope) {
    const Value operand = Eval(*node.operand, scope);
    switch (node.op) {
      case UnaryOp::kNot: return Value::Bool(!Truthy(operand));
      case UnaryOp::kNegate: return Negate(operand);
      case UnaryOp::kPositive: return Positive(operand);
    }
    return operand;
  }

  Value EvalBinary(const BinaryExpr& node, const ScopePtr& scope) {
    Value left = Eval(*node.left, scope);
    switch (node.op) {
      case BinaryOp::kAnd: return Truthy(left) ? Eval(*node.right, scope) : left;
      case BinaryOp::kOr: return Truthy(left) ? left : Eval(*node.right, scope);
      default: break;
    }
    const Value right = Eval(*node.right, scope);
    switch (node.op) {
      case BinaryOp::kAdd: return Add(left, right);
      case BinaryOp::kSub: return Subtract(left, right);
      case BinaryOp::kMul: return Multiply(left, right);
      case BinaryOp::kDiv: return TrueDivide(left, right);
      case BinaryOp::kFloorDiv: return FloorDivide(left, right);
      case BinaryOp::kMod: return Modulo(left, right);
      case BinaryOp::kPow: return Power(left, right);
      case BinaryOp::kConcat: return Value::String(Str(left) + Str(right));
      default: break;
    }
    ThrowUnsupported("unknown operator");
  }

  // Python's chained comparison: each operand evaluated once, stopping at
  // the first false link.
  Value EvalCompare(const CompareExpr& node, const ScopePtr& scope) {
    Value left = Eval(*node.first, scope);
    for (const auto& [kind, right_expr] : node.rest) {
      Value right = Eval(*right_expr, scope);
      bool holds;
      switch (kind) {
        case CompareKind::kEq: holds = Compare(CompareOp::kEq, left, right); break;
        case CompareKind::kNe: holds = Compare(CompareOp::kNe, left, right); break;
        case CompareKind::kLt: holds = Compare(CompareOp::kLt, left, right); break;
        case CompareKind::kLe: holds = Compare(CompareOp::kLe, left, right); break;
        case CompareKind::kGt: holds = Compare(CompareOp::kGt, left, right); break;
        case CompareKind::kGe: holds = Compare(CompareOp::kGe, left, right); break;
        case CompareKind::kIn: holds = Contains(right, left); break;
        case CompareKind::kNotIn: holds = !Contains(right, left); break;
        default: holds = false;
      }
      if (!holds) return Value::Bool(false);
      left = std::move(right);
    }
    return Value::Bool(true);
  }

  ScopePtr NewScope(ScopePtr parent) {
    scopes_.push_back(std::make_shared<Scope>(std::move(parent)));
    return scopes_.back();
  }

  std::vector<ScopePtr> scopes_;
  int macro_depth_ = 0;
};

Value Macro::Call(CallArgs args) const {
  return interpreter_->CallMacro(*definition_, closure_, std::move(args));
}

}  // namespace

std::string Evaluate(const Program& program, const Dict& variables) {
  Interpreter interpreter;
  return interpreter.Render(program, variables);
}

}  // namespace kappa::tasks::jinja
