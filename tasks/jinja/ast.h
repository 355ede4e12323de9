// The parsed template: expression and statement nodes mirroring
// jinja2.nodes for the subset kappa implements. Every node keeps its
// 1-based template line for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tasks/jinja/value.h"

namespace kappa::tasks::jinja {

enum class ExprKind {
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,
  kGetAttr,
  kGetItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kUnary,
  kBinary,
  kCompare,
  kCondition,
};

struct Expr {
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  ExprKind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct CallArguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct LiteralExpr : Expr {
  LiteralExpr(int l, Value v) : Expr(ExprKind::kLiteral, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(int l, std::string n) : Expr(ExprKind::kName, l), name(std::move(n)) {}
  std::string name;
};

// [a, b], (a, b) and {k: v}.
struct SequenceExpr : Expr {
  SequenceExpr(ExprKind k, int l) : Expr(k, l) {}
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(ExprKind::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(int l, ExprPtr o, std::string n)
      : Expr(ExprKind::kGetAttr, l), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

struct GetItemExpr : Expr {
  GetItemExpr(int l, ExprPtr o, ExprPtr k)
      : Expr(ExprKind::kGetItem, l), object(std::move(o)), key(std::move(k)) {}
  ExprPtr object;
  ExprPtr key;
};

// object[start:stop:step]; omitted parts are null.
struct SliceExpr : Expr {
  SliceExpr(int l, ExprPtr o) : Expr(ExprKind::kSlice, l), object(std::move(o)) {}
  ExprPtr object;
  ExprPtr start, stop, step;
};

struct CallExpr : Expr {
  CallExpr(int l, ExprPtr c) : Expr(ExprKind::kCall, l), callee(std::move(c)) {}
  ExprPtr callee;
  CallArguments args;
};

// operand|name(args). In a filter block or `{% set x | f %}` the innermost
// operand is null: the rendered body.
struct FilterExpr : Expr {
  FilterExpr(int l, ExprPtr o, std::string n)
      : Expr(ExprKind::kFilter, l), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  CallArguments args;
};

// operand is name(args); `is not` wraps it in a `not`.
struct TestExpr : Expr {
  TestExpr(int l, ExprPtr o, std::string n)
      : Expr(ExprKind::kTest, l), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  CallArguments args;
};

enum class UnaryOp { kNot, kNegate, kPositive };
struct UnaryExpr : Expr {
  UnaryExpr(int l, UnaryOp o, ExprPtr e) : Expr(ExprKind::kUnary, l), op(o), operand(std::move(e)) {}
  UnaryOp op;
  ExprPtr operand;
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat, kAnd, kOr };
struct BinaryExpr : Expr {
  BinaryExpr(int l, BinaryOp o, ExprPtr a, ExprPtr b)
      : Expr(ExprKind::kBinary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinaryOp op;
  ExprPtr left, right;
};

// a < b <= c: Python's chained comparison.
enum class CompareKind { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };
struct CompareExpr : Expr {
  CompareExpr(int l, ExprPtr f) : Expr(ExprKind::kCompare, l), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CompareKind, ExprPtr>> rest;
};

// `then if test else otherwise`; otherwise may be null (Undefined).
struct ConditionExpr : Expr {
  ConditionExpr(int l, ExprPtr t, ExprPtr a, ExprPtr b)
      : Expr(ExprKind::kCondition, l), test(std::move(t)), then(std::move(a)), otherwise(std::move(b)) {}
  ExprPtr test, then, otherwise;
};

// An assignment target: a name, a (nested) tuple of names, or ns.attr.
struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttribute };
  Kind kind = Kind::kName;
  std::string name;       // kName, and the namespace variable of kNamespaceAttribute
  std::string attribute;  // kNamespaceAttribute
  std::vector<Target> items;  // kTuple
  int line = 0;
};

enum class StmtKind {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kBreak,
  kContinue,
  kFilterBlock,
  kWith,
  kScope,  // {% generation %}: a scoped pass-through block
};

struct Stmt {
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  TextStmt(int l, std::string t) : Stmt(StmtKind::kText, l), text(std::move(t)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(int l, ExprPtr e) : Stmt(StmtKind::kOutput, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(StmtKind::kIf, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body otherwise;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(StmtKind::kFor, l) {}
  Target target;
  ExprPtr iterable;
  ExprPtr filter;  // `for x in xs if cond`; may be null.
  Body body;
  Body otherwise;  // {% else %}: runs when nothing was iterated.
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(StmtKind::kSet, l) {}
  Target target;
  ExprPtr value;
};

// {% set x [| filters] %}body{% endset %}; also {% filter f %}body{% endfilter %}
// (kFilterBlock, no target).
struct BlockStmt : Stmt {
  BlockStmt(StmtKind k, int l) : Stmt(k, l) {}
  Target target;
  ExprPtr filter;  // A FilterExpr chain over the body, or null.
  Body body;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(StmtKind::kMacro, l) {}
  std::string name;
  std::vector<std::string> parameters;
  std::vector<ExprPtr> defaults;  // For the last defaults.size() parameters.
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(StmtKind::kWith, l) {}
  std::vector<Target> targets;
  std::vector<ExprPtr> values;
  Body body;
};

// A body run in its own scope ({% generation %}...{% endgeneration %}).
struct ScopeStmt : Stmt {
  explicit ScopeStmt(int l) : Stmt(StmtKind::kScope, l) {}
  Body body;
};

struct Program {
  Body body;
};

}  // namespace kappa::tasks::jinja
