#include "tokenizer/chat/jinja_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "tokenizer/chat/jinja_builtins.h"

namespace qtk::jinja {

namespace {

using TT = Token::Type;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& source)
      : t_(tokens), source_(source) {}

  Body parse_all() {
    std::string ended;
    Body body = parse_body({}, ended);
    return body;
  }

 private:
  // --- token helpers ---
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == TT::kOp && cur().value == op; }
  bool is_name(const char* name) const { return cur().type == TT::kName && cur().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TT::kText:
        return "text";
      case TT::kVarBegin:
        return "'{{'";
      case TT::kVarEnd:
        return "'}}'";
      case TT::kBlockBegin:
        return "'{%'";
      case TT::kBlockEnd:
        return "'%}'";
      case TT::kName:
        return fmt::format("'{}'", t.value);
      case TT::kString:
        return "a string";
      case TT::kInt:
      case TT::kFloat:
        return fmt::format("the number {}", t.value);
      case TT::kOp:
        return fmt::format("'{}'", t.value);
      case TT::kEof:
        return "the end of the template";
    }
    return "?";
  }

  [[noreturn]] void fail_at(const Token& t, const std::string& message) const {
    throw TemplateError("TemplateSyntaxError", message, source_, t.pos.line, t.pos.column);
  }
  // jinja2 reports unknown filters and tests as TemplateAssertionError.
  [[noreturn]] void fail_assert(const Token& t, const std::string& message) const {
    throw TemplateError("TemplateAssertionError", message, source_, t.pos.line, t.pos.column);
  }
  [[noreturn]] void fail_expected(const std::string& what) const {
    fail_at(cur(), fmt::format("expected {}, found {}", what, describe(cur())));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_expected(fmt::format("'{}'", op));
  }
  std::string expect_name(const char* what) {
    if (cur().type != TT::kName) fail_expected(what);
    std::string n = cur().value;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TT::kBlockEnd) fail_expected("'%}'");
    next();
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxParseDepth) {
        p.fail_at(p.cur(), fmt::format("template nested deeper than {} levels", kMaxParseDepth));
      }
    }
    ~DepthGuard() { --p.depth_; }
  };

  ExprPtr make(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = at.pos;
    return e;
  }

  // --- statements ---
  Body parse_body(std::vector<std::string> ends, std::string& ended_by) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TT::kEof) {
        if (!ends.empty()) {
          fail_at(t, fmt::format("unexpected end of template; expected {{% {} %}}",
                                 fmt::join(ends, " %} or {% ")));
        }
        return body;
      }
      if (t.type == TT::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->pos = t.pos;
        n->text = t.value;
        body.push_back(std::move(n));
        next();
      } else if (t.type == TT::kVarBegin) {
        next();
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->pos = t.pos;
        n->expr = parse_tuple(true);
        if (cur().type != TT::kVarEnd) fail_expected("'}}'");
        next();
        body.push_back(std::move(n));
      } else if (t.type == TT::kBlockBegin) {
        const Token& tag = peek();
        if (tag.type != TT::kName) {
          next();
          fail_expected("a tag name");
        }
        if (std::find(ends.begin(), ends.end(), tag.value) != ends.end()) {
          ended_by = tag.value;
          next();
          next();
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        fail_at(t, fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  NodePtr parse_statement() {
    const Token tag = cur();
    next();
    auto n = std::make_unique<Node>();
    n->pos = tag.pos;
    const std::string& name = tag.value;
    std::string ended;
    if (name == "if") {
      n->kind = Node::Kind::kIf;
      ExprPtr cond = parse_tuple(true);
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, ended);
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (ended == "elif") {
          cond = parse_tuple(true);
          expect_block_end();
          continue;
        }
        if (ended == "else") {
          expect_block_end();
          n->else_body = parse_body({"endif"}, ended);
        }
        expect_block_end();
        return n;
      }
    }
    if (name == "for") {
      n->kind = Node::Kind::kFor;
      const bool paren = skip_op("(");
      n->targets.push_back(expect_name("a loop variable name"));
      while (skip_op(",")) {
        if (paren && is_op(")")) break;
        n->targets.push_back(expect_name("a loop variable name"));
      }
      if (paren) expect_op(")");
      if (!skip_name("in")) fail_expected("'in'");
      n->expr = parse_tuple(false);
      if (skip_name("if")) n->cond = parse_tuple(true);
      if (is_name("recursive")) fail_at(cur(), "recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      n->body = parse_body({"else", "endfor"}, ended);
      --loop_depth_;
      if (ended == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"}, ended);
      }
      expect_block_end();
      return n;
    }
    if (name == "set") {
      n->targets.push_back(expect_name("a variable name"));
      if (skip_op(".")) {
        n->attr = expect_name("an attribute name");
      } else {
        while (skip_op(",")) n->targets.push_back(expect_name("a variable name"));
      }
      if (skip_op("=")) {
        n->kind = Node::Kind::kSet;
        n->expr = parse_tuple(true);
        expect_block_end();
        return n;
      }
      if (n->targets.size() != 1 || !n->attr.empty())
        fail_expected("'=' (a block set assigns one plain name)");
      n->kind = Node::Kind::kSetBlock;
      while (is_op("|")) {
        next();
        n->filters.push_back(parse_filter(nullptr));
      }
      expect_block_end();
      n->body = parse_body({"endset"}, ended);
      expect_block_end();
      return n;
    }
    if (name == "macro") {
      n->kind = Node::Kind::kMacro;
      n->name = expect_name("a macro name");
      parse_params(n->params);
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      n->body = parse_body({"endmacro"}, ended);
      loop_depth_ = saved;
      expect_block_end();
      return n;
    }
    if (name == "call") {
      n->kind = Node::Kind::kCallBlock;
      if (is_op("(")) parse_params(n->params);
      n->expr = parse_expression(true);
      if (n->expr->kind != Expr::Kind::kCall) fail_at(tag, "{% call %} expects a macro call");
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      n->body = parse_body({"endcall"}, ended);
      loop_depth_ = saved;
      expect_block_end();
      return n;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(tag, fmt::format("'{}' outside a for loop", name));
      n->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
      return n;
    }
    if (name == "generation") {
      // transformers' AssistantTracker tag: renders its body in place.
      n->kind = Node::Kind::kScope;
      expect_block_end();
      n->body = parse_body({"endgeneration"}, ended);
      expect_block_end();
      return n;
    }
    static const char* kEnds[] = {"elif",     "else",    "endif",         "endfor", "endset",
                                  "endmacro", "endcall", "endgeneration", "endraw"};
    for (const char* e : kEnds) {
      if (name == e) fail_at(tag, fmt::format("unexpected '{}' (no open tag it closes)", name));
    }
    fail_at(tag, fmt::format("unknown or unsupported tag '{}'", name));
  }

  void parse_params(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name("a parameter name");
      if (skip_op("="))
        p.default_value = parse_expression(true);
      else if (std::any_of(params.begin(), params.end(),
                           [](const MacroParam& q) { return q.default_value != nullptr; }))
        fail_at(cur(), "a parameter without a default follows one with a default");
      params.push_back(std::move(p));
    }
    next();
  }

  // --- expressions ---
  // An expression, or a tuple of them separated by commas.
  ExprPtr parse_tuple(bool with_cond) {
    const Token start = cur();
    ExprPtr first = parse_expression(with_cond);
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::kTuple, start);
    t->children.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == TT::kBlockEnd || cur().type == TT::kVarEnd || is_op(")")) break;
      t->children.push_back(parse_expression(with_cond));
    }
    return t;
  }

  ExprPtr parse_expression(bool with_cond) {
    DepthGuard guard(*this);
    if (!with_cond) return parse_or();
    const Token start = cur();
    ExprPtr e = parse_or();
    while (skip_name("if")) {
      auto c = make(Expr::Kind::kCond, start);
      c->children.push_back(parse_or());
      c->children.push_back(std::move(e));
      c->children.push_back(skip_name("else") ? parse_expression(true) : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto n = make(Expr::Kind::kOr, cur());
      next();
      n->children.push_back(std::move(e));
      n->children.push_back(parse_and());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto n = make(Expr::Kind::kAnd, cur());
      next();
      n->children.push_back(std::move(e));
      n->children.push_back(parse_not());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto n = make(Expr::Kind::kNot, cur());
      next();
      n->children.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token start = cur();
    ExprPtr e = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TT::kOp &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == ">" ||
           cur().value == "<=" || cur().value == ">=")) {
        op = cur().value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == TT::kName && peek().value == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, start);
        cmp->children.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }

  ExprPtr binary(std::string_view op, ExprPtr a, ExprPtr b, const Token& at) {
    auto n = make(Expr::Kind::kBinary, at);
    n->name = std::string(op);
    n->children.push_back(std::move(a));
    n->children.push_back(std::move(b));
    return n;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token op = cur();
      next();
      e = binary(op.value, std::move(e), parse_concat(), op);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token op = cur();
      next();
      e = binary("~", std::move(e), parse_math2(), op);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = cur();
      next();
      e = binary(op.value, std::move(e), parse_pow(), op);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token op = cur();
      next();
      e = binary("**", std::move(e), parse_unary(true), op);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, cur());
      next();
      e->children.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    switch (t.type) {
      case TT::kName: {
        next();
        if (t.value == "true" || t.value == "True") return literal(Value::boolean(true), t);
        if (t.value == "false" || t.value == "False") return literal(Value::boolean(false), t);
        if (t.value == "none" || t.value == "None") return literal(Value::none(), t);
        auto n = make(Expr::Kind::kName, t);
        n->name = t.value;
        return n;
      }
      case TT::kString: {
        std::string s;
        while (cur().type == TT::kString) {
          s += cur().value;
          next();
        }
        return literal(Value::string(std::move(s)), t);
      }
      case TT::kInt: {
        next();
        errno = 0;
        const long long v = std::strtoll(t.value.c_str(), nullptr, 10);
        if (errno == ERANGE) fail_at(t, "integer literal out of range");
        return literal(Value::integer(v), t);
      }
      case TT::kFloat:
        next();
        return literal(Value::number(std::strtod(t.value.c_str(), nullptr)), t);
      case TT::kOp:
        if (t.value == "(") {
          next();
          if (skip_op(")")) return make(Expr::Kind::kTuple, t);
          ExprPtr e = parse_tuple(true);
          // note: "(a,)" is a one-element tuple; "(a)" is a.
          if (e->kind != Expr::Kind::kTuple && is_op(",")) {
            auto tup = make(Expr::Kind::kTuple, t);
            tup->children.push_back(std::move(e));
            e = std::move(tup);
            next();
          }
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          next();
          auto l = make(Expr::Kind::kList, t);
          while (!is_op("]")) {
            if (!l->children.empty()) expect_op(",");
            if (is_op("]")) break;
            l->children.push_back(parse_expression(true));
          }
          next();
          return l;
        }
        if (t.value == "{") {
          next();
          auto d = make(Expr::Kind::kDict, t);
          while (!is_op("}")) {
            if (!d->children.empty()) expect_op(",");
            if (is_op("}")) break;
            d->children.push_back(parse_expression(true));
            expect_op(":");
            d->children.push_back(parse_expression(true));
          }
          next();
          return d;
        }
        break;
      default:
        break;
    }
    fail_at(t, fmt::format("unexpected {} in an expression", describe(t)));
  }

  ExprPtr literal(Value v, const Token& at) {
    auto n = make(Expr::Kind::kLiteral, at);
    n->literal = std::move(v);
    return n;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Token t = cur();
      if (is_op(".")) {
        next();
        if (cur().type == TT::kInt) {
          auto n = make(Expr::Kind::kItem, t);
          n->children.push_back(std::move(e));
          n->children.push_back(parse_primary());
          e = std::move(n);
        } else {
          auto n = make(Expr::Kind::kAttr, t);
          n->name = expect_name("an attribute name");
          n->children.push_back(std::move(e));
          e = std::move(n);
        }
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, const Token& at) {
    ExprPtr parts[3];
    int colons = 0;
    if (!is_op(":")) parts[0] = parse_expression(true);
    while (colons < 2 && skip_op(":")) {
      ++colons;
      if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression(true);
    }
    expect_op("]");
    if (colons == 0) {
      auto n = make(Expr::Kind::kItem, at);
      n->children.push_back(std::move(obj));
      n->children.push_back(std::move(parts[0]));
      return n;
    }
    auto n = make(Expr::Kind::kSlice, at);
    n->children.push_back(std::move(obj));
    for (auto& p : parts) n->children.push_back(std::move(p));
    return n;
  }

  // "(" args ")" after `callee` (args appended to children after it).
  void parse_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail_at(cur(), "*args and **kwargs are not supported");
      if (cur().type == TT::kName && peek().type == TT::kOp && peek().value == "=") {
        std::string key = cur().value;
        next();
        next();
        e.named.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.named.empty()) fail_at(cur(), "a positional argument follows a keyword argument");
        e.children.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto n = make(Expr::Kind::kCall, cur());
    n->children.push_back(std::move(callee));
    parse_args(*n);
    return n;
  }

  // A filter after its "|"; `subject` may be null (block set filters).
  ExprPtr parse_filter(ExprPtr subject) {
    const Token t = cur();
    auto n = make(Expr::Kind::kFilter, t);
    n->name = expect_name("a filter name");
    if (!is_known_filter(n->name)) fail_assert(t, fmt::format("no filter named '{}'", n->name));
    n->children.push_back(std::move(subject));
    if (is_op("(")) parse_args(*n);
    return n;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        const Token at = cur();
        next();
        auto n = make(Expr::Kind::kTest, at);
        n->negated = skip_name("not");
        const Token name_tok = cur();
        n->name = expect_name("a test name");
        if (!is_known_test(n->name))
          fail_assert(name_tok, fmt::format("no test named '{}'", n->name));
        n->children.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*n);
        } else if ((cur().type == TT::kName || cur().type == TT::kString ||
                    cur().type == TT::kInt || cur().type == TT::kFloat || is_op("(") ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail_at(cur(), "tests cannot be chained with 'is'");
          n->children.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const std::string& source_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_tokens(const std::vector<Token>& tokens, const std::string& source) {
  return Parser(tokens, source).parse_all();
}

}  // namespace qtk::jinja
