#include "tasks/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>

#include "tasks/jinja/errors.h"
#include "tasks/jinja/filters.h"
#include "tasks/jinja/globals.h"
#include "tasks/jinja/methods.h"
#include "tasks/jinja/template_tests.h"

namespace kappa::tasks::jinja {
namespace {

constexpr int kMaxNesting = 200;

std::string Describe(const Token& token) {
  switch (token.type) {
    case TokenType::kName:
    case TokenType::kOperator: return token.text;
    case TokenType::kString: return "string";
    case TokenType::kInteger: return "integer";
    case TokenType::kFloat: return "float";
    case TokenType::kData: return "template data / text";
    case TokenType::kVariableBegin: return "begin of print statement";
    case TokenType::kVariableEnd: return "end of print statement";
    case TokenType::kBlockBegin: return "begin of statement block";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Program Run() {
    Program program;
    program.body = Subparse({});
    for (const auto& [name, line] : called_names_) {
      if (macro_names_.count(name) == 0) {
        throw SyntaxError(line, "kappa does not implement the global function '" + name +
                                    "' (it has range, dict, namespace, raise_exception, "
                                    "strftime_now and the template's macros)");
      }
    }
    return program;
  }

 private:
  // ---- token stream -------------------------------------------------------
  const Token& current() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  Token Next() {
    Token token = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return token;
  }
  static bool IsName(const Token& t, std::string_view name) {
    return t.type == TokenType::kName && t.text == name;
  }
  static bool IsOp(const Token& t, std::string_view op) {
    return t.type == TokenType::kOperator && t.text == op;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(current(), name)) return false;
    Next();
    return true;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(current(), op)) return false;
    Next();
    return true;
  }

  [[noreturn]] void Fail(const std::string& message, int line = 0) const {
    throw SyntaxError(line > 0 ? line : current().line, message);
  }

  void FailExpected(const std::string& expected) const {
    if (current().type == TokenType::kEof) {
      Fail("unexpected end of template, expected '" + expected + "'.");
    }
    Fail("expected token '" + expected + "', got '" + Describe(current()) + "'");
  }

  Token ExpectOp(std::string_view op) {
    if (!IsOp(current(), op)) FailExpected(std::string(op));
    return Next();
  }
  Token ExpectType(TokenType type) {
    if (current().type != type) {
      Token wanted;
      wanted.type = type;
      FailExpected(Describe(wanted));
    }
    return Next();
  }
  Token ExpectName() {
    if (current().type != TokenType::kName) FailExpected("name");
    return Next();
  }
  void ExpectName(std::string_view name) {
    if (!IsName(current(), name)) FailExpected(std::string(name));
    Next();
  }

  // ---- statements -------------------------------------------------------
  bool AtEndToken(std::initializer_list<std::string_view> end_tokens) const {
    return std::any_of(end_tokens.begin(), end_tokens.end(),
                       [&](std::string_view n) { return IsName(current(), n); });
  }

  // jinja2's subparse: template data, {{ }} and statements until one of
  // `end_tokens` opens a block (left as the current token).
  Body Subparse(std::initializer_list<std::string_view> end_tokens) {
    Body body;
    while (current().type != TokenType::kEof) {
      const Token& token = current();
      if (token.type == TokenType::kData) {
        body.push_back(std::make_unique<TextStmt>(token.line, token.text));
        Next();
      } else if (token.type == TokenType::kVariableBegin) {
        Next();
        const int line = current().line;
        body.push_back(std::make_unique<OutputStmt>(line, ParseTuple(false, true, {}, false)));
        ExpectType(TokenType::kVariableEnd);
      } else if (token.type == TokenType::kBlockBegin) {
        Next();
        if (AtEndToken(end_tokens)) return body;
        ParseStatement(&body);
        ExpectType(TokenType::kBlockEnd);
      } else {
        Fail("internal parsing error");
      }
    }
    if (end_tokens.size() != 0) {
      std::string expected;
      for (std::string_view n : end_tokens) expected += (expected.empty() ? "'" : " or '") + std::string(n) + "'";
      Fail("Unexpected end of template. Jinja was looking for the following tags: " + expected + ".");
    }
    return body;
  }

  // parse_statements: optional ':', block end, body up to an end token.
  Body ParseStatements(std::initializer_list<std::string_view> end_tokens, bool drop_needle) {
    SkipOp(":");
    ExpectType(TokenType::kBlockEnd);
    Body body = Subparse(end_tokens);
    if (drop_needle) Next();
    return body;
  }

  // One statement's nodes, appended to `out`.
  void ParseStatement(Body* out) {
    NestingGuard guard(this);
    const Token& token = current();
    if (token.type != TokenType::kName) Fail("tag name expected");
    const std::string tag = token.text;
    if (tag == "print") return ParsePrint(out);
    if (StmtPtr statement = ParseTag(tag)) {
      out->push_back(std::move(statement));
      return;
    }
    static const std::set<std::string> kRefused = {"block", "extends", "include", "import",
                                                   "from",  "call",    "autoescape"};
    if (kRefused.count(tag)) Fail("kappa does not implement the tag '" + tag + "'");
    Fail("unknown tag '" + tag +
         "' (kappa implements if, for, set, macro, filter, with, print, generation, break, "
         "continue and raw)");
  }

  // The statement a supported tag opens; null for other tags.
  StmtPtr ParseTag(const std::string& tag) {
    if (tag == "if") return ParseIf();
    if (tag == "for") return ParseFor();
    if (tag == "set") return ParseSet();
    if (tag == "macro") return ParseMacro();
    if (tag == "filter") return ParseFilterBlock();
    if (tag == "with") return ParseWith();
    if (tag == "generation") return ParseGeneration();
    if (tag == "break" || tag == "continue") return ParseLoopControl();
    return nullptr;
  }
  StmtPtr ParseIf() {
    auto node = std::make_unique<IfStmt>(Next().line);
    while (true) {
      ExprPtr test = ParseTuple(false, false, {}, false);
      Body body = ParseStatements({"elif", "else", "endif"}, false);
      node->branches.emplace_back(std::move(test), std::move(body));
      const Token token = Next();
      if (IsName(token, "elif")) continue;
      if (IsName(token, "else")) node->otherwise = ParseStatements({"endif"}, true);
      break;
    }
    return node;
  }

  StmtPtr ParseFor() {
    auto node = std::make_unique<ForStmt>(Next().line);
    node->target = ParseAssignTarget(/*with_namespace=*/false, {"in"});
    ExpectName("in");
    node->iterable = ParseTuple(false, false, {"recursive"}, false);
    if (SkipName("if")) node->filter = ParseExpression(true);
    if (IsName(current(), "recursive")) Fail("kappa does not implement recursive loops");
    ++loop_depth_;
    node->body = ParseStatements({"endfor", "else"}, false);
    --loop_depth_;
    if (IsName(Next(), "else")) node->otherwise = ParseStatements({"endfor"}, true);
    return node;
  }

  StmtPtr ParseSet() {
    const int line = Next().line;
    Target target = ParseAssignTarget(/*with_namespace=*/true, {});
    if (SkipOp("=")) {
      auto node = std::make_unique<SetStmt>(line);
      node->target = std::move(target);
      node->value = ParseTuple(false, true, {}, false);
      return node;
    }
    auto node = std::make_unique<BlockStmt>(StmtKind::kSetBlock, line);
    node->target = std::move(target);
    if (IsOp(current(), "|")) node->filter = ParseFilter(nullptr, false);
    node->body = ScopedBody({"endset"});
    return node;
  }

  StmtPtr ParseMacro() {
    auto node = std::make_unique<MacroStmt>(Next().line);
    node->name = ExpectName().text;
    macro_names_.insert(node->name);
    ExpectOp("(");
    while (!IsOp(current(), ")")) {
      if (!node->parameters.empty()) ExpectOp(",");
      node->parameters.push_back(ExpectName().text);
      if (SkipOp("=")) {
        node->defaults.push_back(ParseExpression(true));
      } else if (!node->defaults.empty()) {
        Fail("non-default argument follows default argument");
      }
    }
    ExpectOp(")");
    ++macro_depth_;
    node->body = ScopedBody({"endmacro"});
    --macro_depth_;
    return node;
  }

  // A body that is its own function in jinja2 (macro, set block, filter
  // block, generation): break/continue inside refer to no loop.
  Body ScopedBody(std::initializer_list<std::string_view> end_tokens) {
    const int saved = loop_depth_;
    loop_depth_ = 0;
    Body body = ParseStatements(end_tokens, true);
    loop_depth_ = saved;
    return body;
  }

  StmtPtr ParseFilterBlock() {
    auto node = std::make_unique<BlockStmt>(StmtKind::kFilterBlock, Next().line);
    node->filter = ParseFilter(nullptr, true);
    node->body = ScopedBody({"endfilter"});
    return node;
  }

  StmtPtr ParseWith() {
    auto node = std::make_unique<WithStmt>(Next().line);
    while (current().type != TokenType::kBlockEnd) {
      if (!node->targets.empty()) ExpectOp(",");
      node->targets.push_back(ParseAssignTarget(false, {}));
      ExpectOp("=");
      node->values.push_back(ParseExpression(true));
    }
    node->body = ParseStatements({"endwith"}, true);
    return node;
  }

  // {% print a, b %}: one output per expression.
  void ParsePrint(Body* out) {
    Next();
    bool first = true;
    while (current().type != TokenType::kBlockEnd) {
      if (!first) ExpectOp(",");
      first = false;
      const int line = current().line;
      out->push_back(std::make_unique<OutputStmt>(line, ParseExpression(true)));
    }
  }

  StmtPtr ParseGeneration() {
    auto node = std::make_unique<ScopeStmt>(Next().line);
    node->body = ScopedBody({"endgeneration"});
    return node;
  }

  StmtPtr ParseLoopControl() {
    const Token token = Next();
    if (loop_depth_ == 0) Fail("'" + token.text + "' outside loop", token.line);
    return std::make_unique<Stmt>(token.text == "break" ? StmtKind::kBreak : StmtKind::kContinue,
                                  token.line);
  }

  // ---- assignment targets -----------------------------------------------
  Target ParseAssignTarget(bool with_namespace,
                           std::initializer_list<std::string_view> extra_end) {
    Target target;
    target.line = current().line;
    if (with_namespace && IsOp(look(), ".")) {
      target.kind = Target::Kind::kNamespaceAttribute;
      target.name = ExpectName().text;
      Next();  // '.'
      target.attribute = ExpectName().text;
      return target;
    }
    // parse_tuple(simplified=True): names (or parenthesised tuples of names).
    std::vector<Target> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      items.push_back(ParseTargetPrimary());
      if (!IsOp(current(), ",")) break;
      is_tuple = true;
    }
    if (items.empty()) Fail("Expected an expression, got '" + Describe(current()) + "'");
    if (!is_tuple) return std::move(items.front());
    target.kind = Target::Kind::kTuple;
    target.items = std::move(items);
    return target;
  }

  Target ParseTargetPrimary() {
    Target target;
    target.line = current().line;
    if (SkipOp("(")) {
      target.kind = Target::Kind::kTuple;
      while (!IsOp(current(), ")")) {
        if (!target.items.empty()) ExpectOp(",");
        if (IsOp(current(), ")")) break;
        target.items.push_back(ParseTargetPrimary());
      }
      ExpectOp(")");
      return target;
    }
    const Token token = current();
    if (token.type != TokenType::kName || IsConstantName(token.text)) {
      Fail("can't assign to '" + Describe(token) + "'");
    }
    Next();
    target.name = token.text;
    return target;
  }

  static bool IsConstantName(const std::string& n) {
    return n == "true" || n == "false" || n == "True" || n == "False" || n == "none" ||
           n == "None";
  }

  // ---- expressions ------------------------------------------------------
  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end) const {
    const TokenType type = current().type;
    if (type == TokenType::kVariableEnd || type == TokenType::kBlockEnd || IsOp(current(), ")")) {
      return true;
    }
    return std::any_of(extra_end.begin(), extra_end.end(),
                       [&](std::string_view n) { return IsName(current(), n); });
  }

  // parse_tuple: an expression, or a tuple when commas separate several.
  ExprPtr ParseTuple(bool simplified, bool with_condition,
                     std::initializer_list<std::string_view> extra_end, bool parenthesised) {
    const int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      items.push_back(simplified ? ParsePrimary() : ParseExpression(with_condition));
      if (!IsOp(current(), ",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items.front());
      if (!parenthesised) Fail("Expected an expression, got '" + Describe(current()) + "'");
    }
    auto tuple = std::make_unique<SequenceExpr>(ExprKind::kTuple, line);
    tuple->items = std::move(items);
    return tuple;
  }

  ExprPtr ParseExpression(bool with_condition) {
    return with_condition ? ParseCondition() : ParseOr();
  }

  ExprPtr ParseCondition() {
    int line = current().line;
    ExprPtr expr = ParseOr();
    while (SkipName("if")) {
      ExprPtr test = ParseOr();
      ExprPtr otherwise = SkipName("else") ? ParseCondition() : nullptr;
      expr = std::make_unique<ConditionExpr>(line, std::move(test), std::move(expr),
                                             std::move(otherwise));
      line = current().line;
    }
    return expr;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (IsName(current(), "or")) {
      const int line = Next().line;
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kOr, std::move(left), ParseAnd());
    }
    return left;
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (IsName(current(), "and")) {
      const int line = Next().line;
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kAnd, std::move(left), ParseNot());
    }
    return left;
  }

  ExprPtr ParseNot() {
    if (IsName(current(), "not")) {
      const int line = Next().line;
      NestingGuard guard(this);
      return std::make_unique<UnaryExpr>(line, UnaryOp::kNot, ParseNot());
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const int line = current().line;
    ExprPtr first = ParseMath1();
    std::vector<std::pair<CompareKind, ExprPtr>> rest;
    while (true) {
      static const std::pair<const char*, CompareKind> kOps[] = {
          {"==", CompareKind::kEq}, {"!=", CompareKind::kNe}, {"<", CompareKind::kLt},
          {"<=", CompareKind::kLe}, {">", CompareKind::kGt},  {">=", CompareKind::kGe}};
      bool matched = false;
      for (const auto& [text, kind] : kOps) {
        if (IsOp(current(), text)) {
          Next();
          rest.emplace_back(kind, ParseMath1());
          matched = true;
          break;
        }
      }
      if (matched) continue;
      if (SkipName("in")) {
        rest.emplace_back(CompareKind::kIn, ParseMath1());
      } else if (IsName(current(), "not") && IsName(look(), "in")) {
        Next();
        Next();
        rest.emplace_back(CompareKind::kNotIn, ParseMath1());
      } else {
        break;
      }
    }
    if (rest.empty()) return first;
    auto node = std::make_unique<CompareExpr>(line, std::move(first));
    node->rest = std::move(rest);
    return node;
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp(current(), "+") || IsOp(current(), "-")) {
      const Token op = Next();
      left = std::make_unique<BinaryExpr>(op.line, op.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub,
                                          std::move(left), ParseConcat());
    }
    return left;
  }

  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (IsOp(current(), "~")) {
      const int line = Next().line;
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kConcat, std::move(left), ParseMath2());
    }
    return left;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (true) {
      BinaryOp op;
      if (IsOp(current(), "*")) {
        op = BinaryOp::kMul;
      } else if (IsOp(current(), "/")) {
        op = BinaryOp::kDiv;
      } else if (IsOp(current(), "//")) {
        op = BinaryOp::kFloorDiv;
      } else if (IsOp(current(), "%")) {
        op = BinaryOp::kMod;
      } else {
        break;
      }
      const int line = Next().line;
      left = std::make_unique<BinaryExpr>(line, op, std::move(left), ParsePow());
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (IsOp(current(), "**")) {
      const int line = Next().line;
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kPow, std::move(left), ParseUnary(true));
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    NestingGuard guard(this);
    const int line = current().line;
    ExprPtr node;
    if (SkipOp("-")) {
      node = std::make_unique<UnaryExpr>(line, UnaryOp::kNegate, ParseUnary(false));
    } else if (SkipOp("+")) {
      node = std::make_unique<UnaryExpr>(line, UnaryOp::kPositive, ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    NestingGuard guard(this);
    const Token token = current();
    switch (token.type) {
      case TokenType::kName: {
        Next();
        if (token.text == "true" || token.text == "True") {
          return std::make_unique<LiteralExpr>(token.line, Value::Bool(true));
        }
        if (token.text == "false" || token.text == "False") {
          return std::make_unique<LiteralExpr>(token.line, Value::Bool(false));
        }
        if (token.text == "none" || token.text == "None") {
          return std::make_unique<LiteralExpr>(token.line, Value::None());
        }
        if (macro_depth_ > 0 &&
            (token.text == "varargs" || token.text == "kwargs" || token.text == "caller")) {
          Fail("kappa does not implement the macro variable '" + token.text + "'", token.line);
        }
        return std::make_unique<NameExpr>(token.line, token.text);
      }
      case TokenType::kString: {
        std::string text;
        while (current().type == TokenType::kString) text += Next().text;
        return std::make_unique<LiteralExpr>(token.line, Value::String(std::move(text)));
      }
      case TokenType::kInteger:
        Next();
        return std::make_unique<LiteralExpr>(token.line, Value::Int(token.integer));
      case TokenType::kFloat:
        Next();
        return std::make_unique<LiteralExpr>(token.line, Value::Float(token.number));
      default: break;
    }
    if (SkipOp("(")) {
      ExprPtr inner = ParseTuple(false, true, {}, true);
      ExpectOp(")");
      return inner;
    }
    if (IsOp(token, "[")) return ParseList();
    if (IsOp(token, "{")) return ParseDict();
    Fail("unexpected '" + Describe(token) + "'", token.line);
  }

  ExprPtr ParseList() {
    auto node = std::make_unique<SequenceExpr>(ExprKind::kList, ExpectOp("[").line);
    while (!IsOp(current(), "]")) {
      if (!node->items.empty()) ExpectOp(",");
      if (IsOp(current(), "]")) break;
      node->items.push_back(ParseExpression(true));
    }
    ExpectOp("]");
    return node;
  }

  ExprPtr ParseDict() {
    auto node = std::make_unique<DictExpr>(ExpectOp("{").line);
    while (!IsOp(current(), "}")) {
      if (!node->items.empty()) ExpectOp(",");
      if (IsOp(current(), "}")) break;
      ExprPtr key = ParseExpression(true);
      ExpectOp(":");
      node->items.emplace_back(std::move(key), ParseExpression(true));
    }
    ExpectOp("}");
    return node;
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(current(), ".") || IsOp(current(), "[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp(current(), "(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp(current(), "|")) {
        node = ParseFilter(std::move(node), false);
      } else if (IsName(current(), "is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp(current(), "(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    const Token token = Next();
    if (IsOp(token, ".")) {
      const Token attribute = Next();
      if (attribute.type == TokenType::kName) {
        return std::make_unique<GetAttrExpr>(token.line, std::move(node), attribute.text);
      }
      if (attribute.type != TokenType::kInteger) Fail("expected name or number", attribute.line);
      return std::make_unique<GetItemExpr>(
          token.line, std::move(node),
          std::make_unique<LiteralExpr>(attribute.line, Value::Int(attribute.integer)));
    }
    // '[': one subscript or slice; a comma (tuple subscript) is refused.
    ExprPtr result = ParseSubscribed(std::move(node), token.line);
    if (IsOp(current(), ",")) Fail("kappa does not implement tuple subscripts (a[b, c])");
    ExpectOp("]");
    return result;
  }

  ExprPtr ParseSubscribed(ExprPtr object, int line) {
    ExprPtr start;
    if (!IsOp(current(), ":")) {
      start = ParseExpression(true);
      if (!IsOp(current(), ":")) {
        return std::make_unique<GetItemExpr>(line, std::move(object), std::move(start));
      }
    }
    Next();  // ':'
    auto slice = std::make_unique<SliceExpr>(line, std::move(object));
    slice->start = std::move(start);
    auto at_end = [&] { return IsOp(current(), "]") || IsOp(current(), ","); };
    if (!IsOp(current(), ":") && !at_end()) slice->stop = ParseExpression(true);
    if (SkipOp(":") && !at_end()) slice->step = ParseExpression(true);
    return slice;
  }

  CallArguments ParseCallArgs() {
    const int line = ExpectOp("(").line;
    CallArguments args;
    bool require_comma = false;
    while (!IsOp(current(), ")")) {
      if (require_comma) {
        ExpectOp(",");
        if (IsOp(current(), ")")) break;
      }
      if (IsOp(current(), "*") || IsOp(current(), "**")) {
        Fail("kappa does not implement *args/**kwargs in calls");
      }
      if (current().type == TokenType::kName && IsOp(look(), "=")) {
        std::string key = Next().text;
        Next();
        args.keyword.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!args.keyword.empty()) Fail("invalid syntax for function call expression", line);
        args.positional.push_back(ParseExpression(true));
      }
      require_comma = true;
    }
    ExpectOp(")");
    return args;
  }

  ExprPtr ParseCall(ExprPtr callee) {
    const int line = current().line;
    CheckCallable(*callee, line);
    auto node = std::make_unique<CallExpr>(line, std::move(callee));
    node->args = ParseCallArgs();
    return node;
  }

  // What a template may call: globals and macros by name, supported methods.
  void CheckCallable(const Expr& callee, int line) {
    if (callee.kind == ExprKind::kName) {
      const std::string& name = static_cast<const NameExpr&>(callee).name;
      if (!IsGlobalFunction(name)) called_names_.emplace_back(name, line);
      return;
    }
    if (callee.kind == ExprKind::kGetAttr) {
      const std::string& method = static_cast<const GetAttrExpr&>(callee).name;
      if (!IsCallableMethodName(method)) {
        Fail("kappa does not implement the method '" + method + "'", line);
      }
      return;
    }
    Fail("kappa calls only global functions, macros and methods", line);
  }

  // parse_filter: `| name(args)` repeatedly (or one inline name for filter
  // blocks). `node` null stands for a block's rendered body.
  ExprPtr ParseFilter(ExprPtr node, bool start_inline) {
    while (IsOp(current(), "|") || start_inline) {
      if (!start_inline) Next();
      start_inline = false;
      const Token name = ExpectName();
      if (IsOp(current(), ".")) Fail("kappa does not implement dotted filter names", name.line);
      if (!IsKnownFilter(name.text)) {
        Fail("kappa does not implement the filter '" + name.text + "'", name.line);
      }
      auto filter = std::make_unique<FilterExpr>(name.line, std::move(node), name.text);
      if (IsOp(current(), "(")) filter->args = ParseCallArgs();
      CheckNamedArguments(*filter);
      node = std::move(filter);
    }
    return node;
  }

  // map('upper'), select('odd'), selectattr('role', 'equalto', ...): the
  // filter or test named by a literal argument must exist too.
  void CheckNamedArguments(const FilterExpr& filter) {
    size_t index;
    bool names_filter = false;
    if (filter.name == "map") {
      index = 0;
      names_filter = true;
    } else if (filter.name == "select" || filter.name == "reject") {
      index = 0;
    } else if (filter.name == "selectattr" || filter.name == "rejectattr") {
      index = 1;
    } else {
      return;
    }
    if (index >= filter.args.positional.size()) return;
    const Expr& argument = *filter.args.positional[index];
    if (argument.kind != ExprKind::kLiteral) return;
    const Value& value = static_cast<const LiteralExpr&>(argument).value;
    if (!value.is_string()) return;
    const std::string& name = value.as_string();
    if (names_filter && !IsKnownFilter(name)) {
      Fail("kappa does not implement the filter '" + name + "'", filter.line);
    }
    if (!names_filter && !IsKnownTest(name)) {
      Fail("kappa does not implement the test '" + name + "'", filter.line);
    }
  }

  ExprPtr ParseTest(ExprPtr node) {
    const int line = Next().line;  // 'is'
    const bool negated = SkipName("not");
    const Token name = ExpectName();
    if (IsOp(current(), ".")) Fail("kappa does not implement dotted test names", name.line);
    if (!IsKnownTest(name.text)) Fail("kappa does not implement the test '" + name.text + "'", line);
    auto test = std::make_unique<TestExpr>(line, std::move(node), name.text);
    const Token& next = current();
    const bool argument_follows =
        next.type == TokenType::kName || next.type == TokenType::kString ||
        next.type == TokenType::kInteger || next.type == TokenType::kFloat ||
        IsOp(next, "(") || IsOp(next, "[") || IsOp(next, "{");
    if (IsOp(next, "(")) {
      test->args = ParseCallArgs();
    } else if (argument_follows && !IsName(next, "else") && !IsName(next, "or") &&
               !IsName(next, "and")) {
      if (IsName(next, "is")) Fail("You cannot chain multiple tests with is");
      test->args.positional.push_back(ParsePostfix(ParsePrimary()));
    }
    if (!negated) return test;
    return std::make_unique<UnaryExpr>(line, UnaryOp::kNot, std::move(test));
  }

  // Bounds recursion on deeply nested expressions.
  class NestingGuard {
   public:
    explicit NestingGuard(Parser* parser) : parser_(parser) {
      if (++parser_->nesting_ > kMaxNesting) parser_->Fail("expression nested too deeply");
    }
    ~NestingGuard() { --parser_->nesting_; }

   private:
    Parser* parser_;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int macro_depth_ = 0;
  int nesting_ = 0;
  std::set<std::string> macro_names_;
  std::vector<std::pair<std::string, int>> called_names_;
};

}  // namespace

Program Parse(std::vector<Token> tokens) { return Parser(std::move(tokens)).Run(); }

}  // namespace kappa::tasks::jinja
