// Renders a parsed template: scopes, statements and expressions.
#include <algorithm>
#include <deque>
#include <optional>

#include <fmt/format.h>

#include "tokenizer/chat/jinja_ast.h"
#include "tokenizer/chat/jinja_builtins.h"
#include "tokenizer/chat/jinja_lexer.h"
#include "tokenizer/chat/jinja_parser.h"
#include "tokenizer/chat/jinja_template.h"
#include "tokenizer/chat/py_string.h"

namespace qtk::jinja {

namespace {

// Variables of one frame. note: as in jinja2, a for loop's body gets a fresh
// frame per iteration (assignments inside do not leak out of the loop nor
// into the next iteration), `if` shares its enclosing frame, and a macro's
// frame sees the variables of the frame it was defined in.
struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent)
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const std::string& source, const RenderLimits& limits)
      : source_(source), limits_(limits) {
    globals_.parent = nullptr;
    add_global("namespace", [this](CallArgs& a) { return make_namespace(a); });
    add_global("raise_exception", [](CallArgs& a) -> Value {
      const std::string msg = a.positional.empty() ? std::string() : py_str(a.positional[0]);
      throw_eval("TemplateError", msg);
    });
    add_global("range", [](CallArgs& a) { return make_range(a); });
  }

  std::string run(const Body& body, const std::vector<std::pair<std::string, Value>>& context) {
    Scope* root = new_scope(&globals_);
    for (const auto& [k, v] : context) root->set(k, v);
    std::string out;
    exec_body(body, root, out);
    return out;
  }

 private:
  // --- helpers ---
  Scope* new_scope(Scope* parent) {
    scopes_.emplace_back();
    scopes_.back().parent = parent;
    return &scopes_.back();
  }

  void add_global(const std::string& name, std::function<Value(CallArgs&)> fn) {
    callables_.push_back(Callable{name, std::move(fn)});
    globals_.set(name, Value::callable(&callables_.back()));
  }

  [[noreturn]] void fail_at(const SourcePos& pos, const std::string& kind,
                            const std::string& message) const {
    throw TemplateError(kind, message, source_, pos.line, pos.column);
  }

  struct DepthGuard {
    Renderer& r;
    DepthGuard(Renderer& renderer, const SourcePos& pos) : r(renderer) {
      if (++r.depth_ > r.limits_.max_depth) {
        r.fail_at(pos, "LimitError",
                  fmt::format("evaluation nested deeper than {} levels (recursive macro?)",
                              r.limits_.max_depth));
      }
    }
    ~DepthGuard() { --r.depth_; }
  };

  void append(std::string& out, std::string_view s, const SourcePos& pos) {
    if (out.size() + s.size() > limits_.max_output_bytes) {
      fail_at(pos, "LimitError",
              fmt::format("output longer than {} bytes", limits_.max_output_bytes));
    }
    out += s;
  }

  Value make_namespace(CallArgs& a) {
    namespaces_.emplace_back();
    NamespaceData& ns = namespaces_.back();
    for (const Value& p : a.positional) {
      if (!p.is_dict()) throw_eval("TypeError", "namespace() takes a dict or keyword arguments");
      for (const auto& [k, v] : p.dict_data().items) ns_set(ns, k, v);
    }
    for (auto& [k, v] : a.named) ns_set(ns, k, v);
    return Value::ns(&ns);
  }

  static void ns_set(NamespaceData& ns, const std::string& k, Value v) {
    if (Value* old = ns.find(k)) {
      *old = std::move(v);
    } else {
      ns.attrs.emplace_back(k, std::move(v));
    }
  }

  static Value make_range(CallArgs& a) {
    if (!a.named.empty() || a.positional.empty() || a.positional.size() > 3)
      throw_eval("TypeError", "range() takes 1 to 3 positional integer arguments");
    int64_t v[3] = {0, 0, 1};
    for (const Value& p : a.positional) {
      if (!p.is_int() && !p.is_bool())
        throw_eval("TypeError", fmt::format("'{}' object cannot be interpreted as an integer",
                                            python_type_name(p)));
    }
    if (a.positional.size() == 1) {
      v[1] = a.positional[0].as_int();
    } else {
      v[0] = a.positional[0].as_int();
      v[1] = a.positional[1].as_int();
      if (a.positional.size() == 3) v[2] = a.positional[2].as_int();
    }
    if (v[2] == 0) throw_eval("ValueError", "range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
      // note: jinja2's sandbox caps range() at 100000 items (MAX_RANGE).
      if (out.size() >= 100000)
        throw_eval("OverflowError",
                   "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      out.push_back(Value::integer(i));
    }
    return Value::list(std::move(out));
  }

  // --- statements ---
  Flow exec_body(const Body& body, Scope* scope, std::string& out) {
    for (const auto& n : body) {
      const Flow f = exec(*n, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& n, Scope* scope, std::string& out) {
    DepthGuard guard(*this, n.pos);
    switch (n.kind) {
      case Node::Kind::kText:
        append(out, n.text, n.pos);
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        const Value v = eval(*n.expr, scope);
        if (v.is_string()) {
          append(out, v.as_string(), n.pos);
        } else {
          append(out, wrap([&] { return py_str(v); }, n.pos), n.pos);
        }
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (truthy(eval(*cond, scope))) return exec_body(body, scope, out);
        }
        return exec_body(n.else_body, scope, out);
      case Node::Kind::kFor:
        return exec_for(n, scope, out);
      case Node::Kind::kSet: {
        Value v = eval(*n.expr, scope);
        if (!n.attr.empty()) {
          const Value* target = scope->find(n.targets[0]);
          if (target == nullptr || !target->is_namespace()) {
            fail_at(
                n.pos, "TemplateRuntimeError",
                fmt::format("cannot assign attribute on non-namespace object '{}'", n.targets[0]));
          }
          ns_set(*target->namespace_data(), n.attr, std::move(v));
        } else {
          assign(n.targets, std::move(v), scope, n.pos);
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string text;
        exec_body(n.body, scope, text);
        Value v = Value::string(std::move(text));
        for (const auto& f : n.filters) v = apply_filter_node(*f, std::move(v), scope);
        scope->set(n.targets[0], std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        scope->set(n.name, Value::callable(make_macro(n, scope)));
        return Flow::kNormal;
      case Node::Kind::kCallBlock: {
        const Callable* caller = make_macro(n, scope, "caller");
        const Value v = wrap([&] { return eval_call(*n.expr, scope, caller); }, n.expr->pos);
        append(out, wrap([&] { return py_str(v); }, n.pos), n.pos);
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kScope:
        return exec_body(n.body, scope, out);
    }
    return Flow::kNormal;
  }

  template <typename F>
  auto wrap(F f, const SourcePos& pos) -> decltype(f()) {
    try {
      return f();
    } catch (const EvalError& e) {
      fail_at(pos, e.kind, e.message);
    }
  }

  void assign(const std::vector<std::string>& targets, Value v, Scope* scope,
              const SourcePos& pos) {
    if (targets.size() == 1) {
      scope->set(targets[0], std::move(v));
      return;
    }
    const std::vector<Value> items = wrap([&] { return iterate(v); }, pos);
    if (items.size() != targets.size()) {
      fail_at(pos, "ValueError",
              items.size() < targets.size()
                  ? fmt::format("not enough values to unpack (expected {}, got {})", targets.size(),
                                items.size())
                  : fmt::format("too many values to unpack (expected {})", targets.size()));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->set(targets[i], items[i]);
  }

  void count_iteration(const SourcePos& pos) {
    if (++iterations_ > limits_.max_loop_iterations) {
      fail_at(pos, "LimitError",
              fmt::format("more than {} loop iterations", limits_.max_loop_iterations));
    }
  }

  Flow exec_for(const Node& n, Scope* scope, std::string& out) {
    const Value seq = eval(*n.expr, scope);
    std::vector<Value> items = wrap([&] { return iterate(seq); }, n.expr->pos);
    if (n.cond) {
      std::vector<Value> kept;
      for (auto& item : items) {
        count_iteration(n.pos);
        const size_t mark = scopes_.size(), closures = closures_;
        Scope* s = new_scope(scope);
        assign(n.targets, item, s, n.pos);
        if (truthy(eval(*n.cond, s))) kept.push_back(std::move(item));
        release_scopes(mark, closures);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_body(n.else_body, scope, out);
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      count_iteration(n.pos);
      const size_t mark = scopes_.size(), closures = closures_;
      Scope* s = new_scope(scope);
      assign(n.targets, items[static_cast<size_t>(i)], s, n.pos);
      std::vector<std::pair<std::string, Value>> loop = {
          {"index", Value::integer(i + 1)},      {"index0", Value::integer(i)},
          {"revindex", Value::integer(len - i)}, {"revindex0", Value::integer(len - i - 1)},
          {"first", Value::boolean(i == 0)},     {"last", Value::boolean(i == len - 1)},
          {"length", Value::integer(len)},       {"depth", Value::integer(1)},
          {"depth0", Value::integer(0)},
      };
      if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < len) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      s->set("loop", Value::loop_context(std::move(loop)));
      const Flow f = exec_body(n.body, s, out);
      release_scopes(mark, closures);
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  // --- macros ---
  // Drops the frames allocated since `mark` unless a macro was defined
  // meanwhile (a macro keeps its defining frame alive).
  void release_scopes(size_t mark, size_t closures_before) {
    if (closures_ != closures_before) return;
    while (scopes_.size() > mark) scopes_.pop_back();
  }

  const Callable* make_macro(const Node& n, Scope* def_scope, const char* name = nullptr) {
    ++closures_;
    const std::string macro_name = name ? name : n.name;
    callables_.push_back(Callable{macro_name, [this, &n, def_scope, macro_name](CallArgs& a) {
                                    return call_macro(n, def_scope, macro_name, a);
                                  }});
    return &callables_.back();
  }

  Value call_macro(const Node& n, Scope* def_scope, const std::string& name, CallArgs& a) {
    if (++macro_depth_ > 100) {
      --macro_depth_;
      throw_eval("LimitError", "macro calls nested deeper than 100 levels");
    }
    struct Dec {
      int& d;
      ~Dec() { --d; }
    } dec{macro_depth_};
    if (a.positional.size() > n.params.size()) {
      throw_eval("TypeError", fmt::format("macro '{}' takes not more than {} argument(s)", name,
                                          n.params.size()));
    }
    const size_t mark = scopes_.size(), closures = closures_;
    Scope* s = new_scope(def_scope);
    for (size_t i = 0; i < n.params.size(); ++i) {
      const MacroParam& p = n.params[i];
      const Value* given = i < a.positional.size() ? &a.positional[i] : nullptr;
      for (const auto& [k, v] : a.named) {
        if (k != p.name) continue;
        if (given != nullptr)
          throw_eval("TypeError",
                     fmt::format("macro '{}' got multiple values for argument '{}'", name, p.name));
        given = &v;
      }
      if (given != nullptr) {
        s->set(p.name, *given);
      } else if (p.default_value) {
        s->set(p.name, eval(*p.default_value, s));
      } else {
        s->set(p.name, Value::undefined(fmt::format("parameter '{}' was not provided", p.name)));
      }
    }
    for (const auto& kv : a.named) {
      const std::string& k = kv.first;
      const bool known =
          k == "caller" || std::any_of(n.params.begin(), n.params.end(),
                                       [&k](const MacroParam& p) { return p.name == k; });
      if (!known)
        throw_eval("TypeError", fmt::format("macro '{}' takes no keyword argument '{}'", name, k));
      if (k == "caller") s->set("caller", kv.second);
    }
    std::string text;
    exec_body(n.body, s, text);
    release_scopes(mark, closures);
    return Value::string(std::move(text));
  }

  // --- expressions ---
  Value eval(const Expr& e, Scope* scope) {
    DepthGuard guard(*this, e.pos);
    if (++steps_ > limits_.max_steps) {
      fail_at(e.pos, "LimitError", fmt::format("more than {} evaluation steps", limits_.max_steps));
    }
    try {
      return eval_node(e, scope);
    } catch (const EvalError& err) {
      fail_at(e.pos, err.kind, err.message);
    }
  }

  CallArgs eval_args(const Expr& e, Scope* scope, size_t first_arg) {
    CallArgs a;
    for (size_t i = first_arg; i < e.children.size(); ++i)
      a.positional.push_back(eval(*e.children[i], scope));
    for (const auto& [k, v] : e.named) a.named.emplace_back(k, eval(*v, scope));
    return a;
  }

  Value apply_filter_node(const Expr& f, Value subject, Scope* scope) {
    CallArgs a = eval_args(f, scope, 1);
    return wrap([&] { return apply_filter(f.name, subject, a); }, f.pos);
  }

  Value eval_call(const Expr& e, Scope* scope, const Callable* caller = nullptr) {
    const Expr& callee = *e.children[0];
    if (callee.kind == Expr::Kind::kAttr) {
      const Value obj = eval(*callee.children[0], scope);
      if (has_method(obj, callee.name)) {
        CallArgs a = eval_args(e, scope, 1);
        Value result;
        call_method(obj, callee.name, a, result);
        return result;
      }
      return call_value(get_attr(obj, callee.name), e, scope, caller);
    }
    return call_value(eval(callee, scope), e, scope, caller);
  }

  Value call_value(const Value& f, const Expr& e, Scope* scope, const Callable* caller) {
    if (f.is_undefined()) throw_eval("UndefinedError", f.undefined_hint());
    if (!f.is_callable())
      throw_eval("TypeError", fmt::format("'{}' object is not callable", python_type_name(f)));
    CallArgs a = eval_args(e, scope, 1);
    if (caller != nullptr) a.named.emplace_back("caller", Value::callable(caller));
    return f.callable_ptr()->call(a);
  }

  Value eval_node(const Expr& e, Scope* scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        if (const Value* v = scope->find(e.name)) return *v;
        return Value::undefined(fmt::format("'{}' is undefined", e.name));
      }
      case Expr::Kind::kAttr:
        return get_attr(eval(*e.children[0], scope), e.name);
      case Expr::Kind::kItem: {
        const Value obj = eval(*e.children[0], scope);
        return get_item(obj, eval(*e.children[1], scope));
      }
      case Expr::Kind::kSlice: {
        const Value obj = eval(*e.children[0], scope);
        Value parts[3] = {Value::none(), Value::none(), Value::none()};
        for (int i = 0; i < 3; ++i)
          if (e.children[static_cast<size_t>(i + 1)])
            parts[i] = eval(*e.children[static_cast<size_t>(i + 1)], scope);
        return get_slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::kCall:
        return eval_call(e, scope);
      case Expr::Kind::kFilter:
        return apply_filter_node(e, eval(*e.children[0], scope), scope);
      case Expr::Kind::kTest: {
        const Value subject = eval(*e.children[0], scope);
        CallArgs a = eval_args(e, scope, 1);
        return Value::boolean(apply_test(e.name, subject, a) != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        const Value v = eval(*e.children[0], scope);
        if (v.is_undefined()) throw_eval("UndefinedError", v.undefined_hint());
        if (e.kind == Expr::Kind::kPos && v.is_number())
          return v.is_float() ? v : Value::integer(v.as_int());
        if (v.is_float()) return Value::number(-v.as_double());
        if (v.is_int() || v.is_bool()) return binary_op("-", Value::integer(0), v);
        throw_eval("TypeError",
                   fmt::format("bad operand type for unary {}: '{}'",
                               e.kind == Expr::Kind::kNeg ? "-" : "+", python_type_name(v)));
      }
      case Expr::Kind::kNot:
        return Value::boolean(!truthy(eval(*e.children[0], scope)));
      case Expr::Kind::kBinary: {
        const Value a = eval(*e.children[0], scope);
        return binary_op(e.name, a, eval(*e.children[1], scope));
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.children[0], scope);
        return truthy(a) ? eval(*e.children[1], scope) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.children[0], scope);
        return truthy(a) ? a : eval(*e.children[1], scope);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.children[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.children[i + 1], scope);
          if (!compare_op(e.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kCond: {
        if (truthy(eval(*e.children[0], scope))) return eval(*e.children[1], scope);
        if (e.children[2]) return eval(*e.children[2], scope);
        return Value::undefined(fmt::format(
            "the inline if-expression on line {} evaluated to false and no else section was "
            "defined.",
            e.pos.line));
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        for (const auto& c : e.children) items.push_back(eval(*c, scope));
        return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        std::vector<std::pair<std::string, Value>> items;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          const Value k = eval(*e.children[i], scope);
          if (!k.is_string())
            throw_eval("TypeError", "dict keys other than strings are not supported");
          items.emplace_back(k.as_string(), eval(*e.children[i + 1], scope));
        }
        return Value::dict(std::move(items));
      }
    }
    throw_eval("TemplateRuntimeError", "unknown expression");
  }

  const std::string& source_;
  const RenderLimits& limits_;
  Scope globals_;
  std::deque<Scope> scopes_;
  std::deque<NamespaceData> namespaces_;
  std::deque<Callable> callables_;
  int depth_ = 0;
  int macro_depth_ = 0;
  int64_t iterations_ = 0;
  int64_t steps_ = 0;
  size_t closures_ = 0;  // macros created so far
};

}  // namespace

Template Template::parse(std::string_view text, std::string source) {
  Template t;
  // note: Python reads a template as str; bytes that are not UTF-8 never
  // get this far in transformers.
  if (const size_t bad = find_invalid_utf8_at(text); bad != std::string_view::npos) {
    throw TemplateError("TemplateSyntaxError",
                        fmt::format("invalid UTF-8 at byte {} of the template", bad), source, 0, 0);
  }
  const std::vector<Token> tokens = lex_template(text, source);
  t.body_ = std::make_shared<const Body>(parse_tokens(tokens, source));
  t.source_ = std::move(source);
  return t;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& context,
                             const RenderLimits& limits) const {
  Renderer r(source_, limits);
  try {
    return r.run(*body_, context);
  } catch (const EvalError& e) {
    // note: a backstop; errors are normally given their position where the
    // expression is evaluated.
    throw TemplateError(e.kind, e.message, source_, 0, 0);
  }
}

}  // namespace qtk::jinja
