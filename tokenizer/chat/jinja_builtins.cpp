#include "tokenizer/chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "tokenizer/chat/jinja_error.h"
#include "tokenizer/chat/py_string.h"

namespace qtk::jinja {

namespace {

void check_string_size(size_t n) {
  if (n > kMaxStringBytes)
    throw_eval("LimitError", fmt::format("a string longer than {} bytes", kMaxStringBytes));
}

// The undefined value's own error, as jinja2 raises it on use.
[[noreturn]] void fail_undefined(const Value& v) { throw_eval("UndefinedError", v.undefined_hint()); }

const Value* arg(CallArgs& a, size_t index, std::string_view name) {
  if (index < a.positional.size()) return &a.positional[index];
  for (const auto& [k, v] : a.named)
    if (k == name) return &v;
  return nullptr;
}

void check_arity(CallArgs& a, std::string_view what, size_t max_positional,
                 std::initializer_list<std::string_view> names) {
  if (a.positional.size() > max_positional) {
    throw_eval("TypeError", fmt::format("{} takes at most {} positional argument(s) ({} given)",
                                        what, max_positional, a.positional.size()));
  }
  for (const auto& [k, v] : a.named) {
    if (std::find(names.begin(), names.end(), k) == names.end())
      throw_eval("TypeError", fmt::format("{} got an unexpected keyword argument '{}'", what, k));
  }
}

std::optional<std::string> opt_str_arg(CallArgs& a, size_t index, std::string_view name,
                                       std::string_view what) {
  const Value* v = arg(a, index, name);
  if (v == nullptr || v->is_none()) return std::nullopt;
  if (!v->is_string())
    throw_eval("TypeError", fmt::format("{} arg must be None or str, not {}", what,
                                        python_type_name(*v)));
  return v->as_string();
}

int64_t int_arg(CallArgs& a, size_t index, std::string_view name, int64_t dflt,
                std::string_view what) {
  const Value* v = arg(a, index, name);
  if (v == nullptr) return dflt;
  if (!v->is_int() && !v->is_bool())
    throw_eval("TypeError", fmt::format("{}: expected an integer, found {}", what,
                                        python_type_name(*v)));
  return v->as_int();
}

const std::string& str_arg(CallArgs& a, size_t index, std::string_view name,
                           std::string_view what) {
  const Value* v = arg(a, index, name);
  if (v == nullptr) throw_eval("TypeError", fmt::format("{} missing argument '{}'", what, name));
  if (!v->is_string()) {
    throw_eval("TypeError", fmt::format("{} argument '{}' must be str, not {}", what, name,
                                        python_type_name(*v)));
  }
  return v->as_string();
}

Value to_list(const Value& v) {
  std::vector<Value> items = iterate(v);
  return Value::list(std::move(items));
}

// jinja2's tojson with transformers' override: json.dumps(x,
// ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value filter_tojson(const Value& v, CallArgs& a) {
  check_arity(a, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  if (const Value* e = arg(a, 0, "ensure_ascii")) o.ensure_ascii = truthy(*e);
  if (const Value* i = arg(a, 1, "indent"); i != nullptr && !i->is_none()) {
    o.has_indent = true;
    if (i->is_string()) {
      o.indent = i->as_string();
    } else if (i->is_int()) {
      o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(i->as_int(), 0, 64)), ' ');
    } else {
      throw_eval("TypeError", "tojson: indent must be an integer or a string");
    }
    o.item_separator = ",";
  }
  if (const Value* s = arg(a, 2, "separators"); s != nullptr && !s->is_none()) {
    if (!s->is_list() || s->items().size() != 2 || !s->items()[0].is_string() ||
        !s->items()[1].is_string())
      throw_eval("TypeError", "tojson: separators must be a pair of strings");
    o.item_separator = s->items()[0].as_string();
    o.key_separator = s->items()[1].as_string();
  }
  if (const Value* k = arg(a, 3, "sort_keys")) o.sort_keys = truthy(*k);
  std::string out = json_dumps(v, o);
  check_string_size(out.size());
  return Value::string(std::move(out));
}

Value filter_items(const Value& v) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw_eval("TypeError", "Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [k, e] : v.dict_data().items)
    pairs.push_back(Value::list({Value::string(k), e}, true));
  return Value::list(std::move(pairs));
}

Value filter_join(const Value& v, CallArgs& a) {
  check_arity(a, "join", 2, {"d", "attribute"});
  if (arg(a, 1, "attribute") != nullptr) throw_eval("TypeError", "join(attribute=) is not supported");
  std::string sep;
  if (const Value* d = arg(a, 0, "d")) sep = py_str(*d);
  std::string out;
  bool first = true;
  for (const Value& e : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += py_str(e);
    check_string_size(out.size());
  }
  return Value::string(std::move(out));
}

}  // namespace

bool is_known_filter(std::string_view name) {
  static const char* kNames[] = {"length", "count",  "tojson", "trim",   "items",   "safe",
                                 "string", "lower",  "upper",  "default", "d",      "join",
                                 "first",  "last",   "list",   "int",    "float",   "abs",
                                 "capitalize", "title", "replace", "reverse", "e", "escape"};
  return std::any_of(std::begin(kNames), std::end(kNames),
                     [&](const char* n) { return name == n; });
}

bool is_known_test(std::string_view name) {
  static const char* kNames[] = {"defined",  "undefined", "none",     "string",  "mapping",
                                 "iterable", "sequence",  "false",    "true",    "number",
                                 "integer",  "float",     "boolean",  "callable", "eq",
                                 "equalto",  "ne",        "odd",      "even",    "in",
                                 "lower",    "upper",     "divisibleby", "sameas"};
  return std::any_of(std::begin(kNames), std::end(kNames),
                     [&](const char* n) { return name == n; });
}

Value apply_filter(std::string_view name, const Value& v, CallArgs& a) {
  if (name == "length" || name == "count") {
    check_arity(a, name, 0, {});
    return Value::integer(length_of(v));
  }
  if (name == "tojson") return filter_tojson(v, a);
  if (name == "trim") {
    check_arity(a, "trim", 1, {"chars"});
    return Value::string(py_strip(py_str(v), opt_str_arg(a, 0, "chars", "trim"), true, true));
  }
  if (name == "items") {
    check_arity(a, "items", 0, {});
    return filter_items(v);
  }
  if (name == "safe" || name == "e" || name == "escape") {
    // note: autoescape is off in transformers' environment, so Markup
    // behaves as str: safe returns its input (str() of it); escape is
    // refused rather than guessed.
    check_arity(a, name, 0, {});
    if (name != "safe") throw_eval("TypeError", "the escape filter is not supported");
    return v.is_string() ? v : Value::string(py_str(v));
  }
  if (name == "string") {
    check_arity(a, "string", 0, {});
    return v.is_string() ? v : Value::string(py_str(v));
  }
  if (name == "lower" || name == "upper" || name == "capitalize" || name == "title") {
    check_arity(a, name, 0, {});
    const std::string s = py_str(v);
    if (name == "lower") return Value::string(py_lower(s));
    if (name == "upper") return Value::string(py_upper(s));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    return Value::string(py_title(s));
  }
  if (name == "default" || name == "d") {
    check_arity(a, name, 2, {"default_value", "boolean"});
    const Value* dv = arg(a, 0, "default_value");
    const Value* b = arg(a, 1, "boolean");
    const bool use_default = v.is_undefined() || (b != nullptr && truthy(*b) && !truthy(v));
    if (!use_default) return v;
    return dv != nullptr ? *dv : Value::string("");
  }
  if (name == "join") return filter_join(v, a);
  if (name == "first" || name == "last") {
    check_arity(a, name, 0, {});
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", name));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    check_arity(a, "list", 0, {});
    return to_list(v);
  }
  if (name == "reverse") {
    check_arity(a, "reverse", 0, {});
    if (v.is_string()) {
      std::u32string cs = utf8_decode(v.as_string());
      std::reverse(cs.begin(), cs.end());
      return Value::string(utf8_encode(cs));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "replace") {
    check_arity(a, "replace", 3, {"old", "new", "count"});
    const std::string s = py_str(v);
    return Value::string(py_replace(s, str_arg(a, 0, "old", "replace"),
                                    str_arg(a, 1, "new", "replace"),
                                    int_arg(a, 2, "count", -1, "replace")));
  }
  if (name == "abs") {
    check_arity(a, "abs", 0, {});
    if (v.is_int() || v.is_bool()) {
      if (v.as_int() == std::numeric_limits<int64_t>::min())
        throw_eval("OverflowError", "integer overflow");
      return Value::integer(std::abs(v.as_int()));
    }
    if (v.is_float()) return Value::number(std::fabs(v.as_double()));
    throw_eval("TypeError", fmt::format("bad operand type for abs(): '{}'", python_type_name(v)));
  }
  if (name == "int" || name == "float") {
    check_arity(a, name, 1, {"default"});
    throw_eval("TypeError", fmt::format("the {} filter is not supported", name));
  }
  throw_eval("TemplateRuntimeError", fmt::format("no filter named '{}'", name));
}

bool apply_test(std::string_view name, const Value& v, CallArgs& a) {
  auto one_arg = [&]() -> const Value& {
    if (a.positional.size() != 1 || !a.named.empty())
      throw_eval("TypeError", fmt::format("test '{}' takes one argument", name));
    return a.positional[0];
  };
  if (name != "eq" && name != "equalto" && name != "ne" && name != "in" &&
      name != "divisibleby" && name != "sameas" && (!a.positional.empty() || !a.named.empty()))
    throw_eval("TypeError", fmt::format("test '{}' takes no arguments", name));
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "boolean") return v.is_bool();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "callable") return v.is_callable();
  if (name == "lower" || name == "upper") {
    const std::string s = py_str(v);
    // Python: at least one cased character and none of the other case.
    const std::string other = name == "lower" ? py_upper(s) : py_lower(s);
    return other != s && (name == "lower" ? py_lower(s) : py_upper(s)) == s;
  }
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool())
      throw_eval("TypeError", fmt::format("test '{}' expects an integer", name));
    const bool odd = (v.as_int() % 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "eq" || name == "equalto") return equals(v, one_arg());
  if (name == "ne") return !equals(v, one_arg());
  if (name == "in") return contains(one_arg(), v);
  if (name == "sameas") {
    const Value& o = one_arg();
    if (v.is_none() || v.is_bool() || v.is_undefined()) return v.kind() == o.kind() && equals(v, o);
    if (v.is_namespace() || v.is_callable()) return equals(v, o);
    throw_eval("TypeError", "the sameas test is only supported for None, booleans and objects");
  }
  if (name == "divisibleby") {
    const Value& o = one_arg();
    if (!(v.is_int() || v.is_bool()) || !(o.is_int() || o.is_bool()))
      throw_eval("TypeError", "divisibleby expects integers");
    if (o.as_int() == 0) throw_eval("ZeroDivisionError", "integer modulo by zero");
    if (o.as_int() == -1) return true;
    return v.as_int() % o.as_int() == 0;
  }
  throw_eval("TemplateRuntimeError", fmt::format("no test named '{}'", name));
}

bool has_method(const Value& v, std::string_view name) {
  static const char* kStr[] = {"startswith", "endswith", "split",   "strip",   "lstrip",
                               "rstrip",     "replace",  "upper",   "lower",   "capitalize",
                               "title",      "find",     "count",   "join",    "isdigit",
                               "isspace",    "format"};
  static const char* kDict[] = {"items", "keys", "values", "get"};
  if (v.is_string())
    return std::any_of(std::begin(kStr), std::end(kStr), [&](const char* n) { return name == n; });
  if (v.is_dict())
    return std::any_of(std::begin(kDict), std::end(kDict),
                       [&](const char* n) { return name == n; });
  return false;
}

namespace {

// startswith/endswith accept a str or a tuple of str.
bool affix_match(const std::string& s, const Value& p, bool start) {
  auto one = [&](const Value& x) {
    if (!x.is_string()) {
      throw_eval("TypeError",
                 fmt::format("{} first arg must be str or a tuple of str, not {}",
                             start ? "startswith" : "endswith", python_type_name(x)));
    }
    const std::string& a = x.as_string();
    if (a.size() > s.size()) return false;
    return start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (p.is_list() && p.list_data().is_tuple) {
    for (const Value& x : p.items())
      if (one(x)) return true;
    return false;
  }
  return one(p);
}

Value str_method(const std::string& s, std::string_view name, CallArgs& a) {
  const std::string what = fmt::format("str.{}", name);
  if (name == "startswith" || name == "endswith") {
    check_arity(a, what, 1, {});
    if (a.positional.empty()) throw_eval("TypeError", what + "() takes at least 1 argument (0 given)");
    return Value::boolean(affix_match(s, a.positional[0], name == "startswith"));
  }
  if (name == "split") {
    check_arity(a, what, 2, {"sep", "maxsplit"});
    std::vector<Value> parts;
    for (auto& p : py_split(s, opt_str_arg(a, 0, "sep", what), int_arg(a, 1, "maxsplit", -1, what)))
      parts.push_back(Value::string(std::move(p)));
    if (parts.size() > kMaxListItems) throw_eval("LimitError", "split produced too many parts");
    return Value::list(std::move(parts));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    check_arity(a, what, 1, {});
    return Value::string(py_strip(s, opt_str_arg(a, 0, "chars", what), name != "rstrip",
                                  name != "lstrip"));
  }
  if (name == "replace") {
    check_arity(a, what, 3, {"count"});
    std::string out = py_replace(s, str_arg(a, 0, "old", what), str_arg(a, 1, "new", what),
                                 int_arg(a, 2, "count", -1, what));
    check_string_size(out.size());
    return Value::string(std::move(out));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title" ||
      name == "isdigit" || name == "isspace") {
    check_arity(a, what, 0, {});
    if (name == "upper") return Value::string(py_upper(s));
    if (name == "lower") return Value::string(py_lower(s));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    if (name == "title") return Value::string(py_title(s));
    const std::u32string cs = utf8_decode(s);
    if (cs.empty()) return Value::boolean(false);
    if (name == "isspace")
      return Value::boolean(std::all_of(cs.begin(), cs.end(), py_isspace));
    // note: ASCII digits only; Python also counts other Unicode digits.
    if (!is_ascii(s)) throw_eval("TypeError", "str.isdigit() of non-ASCII text is not supported");
    return Value::boolean(std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
  }
  if (name == "find" || name == "count") {
    check_arity(a, what, 1, {});
    const std::string& sub = str_arg(a, 0, "sub", what);
    if (name == "find") {
      const size_t p = s.find(sub);
      return Value::integer(p == std::string::npos ? -1 : py_len(std::string_view(s).substr(0, p)));
    }
    if (sub.empty()) return Value::integer(py_len(s) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    check_arity(a, what, 1, {});
    if (a.positional.empty()) throw_eval("TypeError", "str.join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& e : iterate(a.positional[0])) {
      if (!e.is_string()) {
        throw_eval("TypeError", fmt::format("sequence item: expected str instance, {} found",
                                            python_type_name(e)));
      }
      if (!first) out += s;
      first = false;
      out += e.as_string();
      check_string_size(out.size());
    }
    return Value::string(std::move(out));
  }
  throw_eval("TypeError", fmt::format("str.{}() is not supported", name));
}

Value dict_method(const Value& d, std::string_view name, CallArgs& a) {
  const std::string what = fmt::format("dict.{}", name);
  if (name == "get") {
    check_arity(a, what, 2, {});
    if (a.positional.empty()) throw_eval("TypeError", "get expected at least 1 argument, got 0");
    const Value& key = a.positional[0];
    if (key.is_string())
      if (const Value* v = d.dict_data().find(key.as_string())) return *v;
    return a.positional.size() > 1 ? a.positional[1] : Value::none();
  }
  check_arity(a, what, 0, {});
  if (name == "items") return filter_items(d);
  std::vector<Value> out;
  for (const auto& [k, v] : d.dict_data().items)
    out.push_back(name == "keys" ? Value::string(k) : v);
  return Value::list(std::move(out));
}

}  // namespace

bool call_method(const Value& v, std::string_view name, CallArgs& a, Value& result) {
  if (!has_method(v, name)) return false;
  result = v.is_string() ? str_method(v.as_string(), name, a) : dict_method(v, name, a);
  return true;
}

namespace {

[[noreturn]] void unsupported_operands(std::string_view op, const Value& a, const Value& b) {
  throw_eval("TypeError", fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op,
                                      python_type_name(a), python_type_name(b)));
}

bool is_intlike(const Value& v) { return v.is_int() || v.is_bool(); }

Value int_result(__int128 r) {
  if (r > std::numeric_limits<int64_t>::max() || r < std::numeric_limits<int64_t>::min())
    throw_eval("OverflowError", "integer result out of the supported 64-bit range");
  return Value::integer(static_cast<int64_t>(r));
}

Value arithmetic(std::string_view op, const Value& a, const Value& b) {
  if (is_intlike(a) && is_intlike(b)) {
    const __int128 x = a.as_int(), y = b.as_int();
    if (op == "+") return int_result(x + y);
    if (op == "-") return int_result(x - y);
    if (op == "*") return int_result(x * y);
    if (op == "/") {
      if (y == 0) throw_eval("ZeroDivisionError", "division by zero");
      return Value::number(static_cast<double>(a.as_int()) / static_cast<double>(b.as_int()));
    }
    if (op == "//" || op == "%") {
      if (y == 0)
        throw_eval("ZeroDivisionError",
                   op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
      __int128 q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
        q -= 1;
        r += y;
      }
      return int_result(op == "//" ? q : r);
    }
    if (op == "**") {
      if (y < 0) return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
      __int128 r = 1;
      for (__int128 i = 0; i < y; ++i) {
        r *= x;
        if (r > std::numeric_limits<int64_t>::max() || r < std::numeric_limits<int64_t>::min())
          throw_eval("OverflowError", "integer result out of the supported 64-bit range");
        if (r == 0 || r == 1) break;
      }
      if (r == 1 && x == -1 && (y % 2) != 0) r = -1;
      return int_result(r);
    }
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value::number(x + y);
  if (op == "-") return Value::number(x - y);
  if (op == "*") return Value::number(x * y);
  if (op == "**") return Value::number(std::pow(x, y));
  if (y == 0) throw_eval("ZeroDivisionError", "float division by zero");
  if (op == "/") return Value::number(x / y);
  const double q = std::floor(x / y);
  if (op == "//") return Value::number(q);
  double r = std::fmod(x, y);
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return Value::number(r);
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = py_str(a) + py_str(b);
    check_string_size(s.size());
    return Value::string(std::move(s));
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_string_size(a.as_string().size() + b.as_string().size());
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.list_data().is_tuple == b.list_data().is_tuple) {
      if (a.items().size() + b.items().size() > kMaxListItems)
        throw_eval("LimitError", "a list longer than the limit");
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.list_data().is_tuple);
    }
    if (a.is_string() || a.is_list()) {
      throw_eval("TypeError", fmt::format("can only concatenate {} (not \"{}\") to {}",
                                          python_type_name(a), python_type_name(b),
                                          python_type_name(a)));
    }
  }
  if (op == "*" && ((a.is_string() || a.is_list()) && is_intlike(b))) {
    const int64_t n = std::max<int64_t>(0, b.as_int());
    if (a.is_string()) {
      if (n > 0 && a.as_string().size() > kMaxStringBytes / static_cast<size_t>(n))
        throw_eval("LimitError", "a string longer than the limit");
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += a.as_string();
      return Value::string(std::move(out));
    }
    if (n > 0 && a.items().size() > kMaxListItems / static_cast<size_t>(n))
      throw_eval("LimitError", "a list longer than the limit");
    std::vector<Value> items;
    for (int64_t i = 0; i < n; ++i) items.insert(items.end(), a.items().begin(), a.items().end());
    return Value::list(std::move(items), a.list_data().is_tuple);
  }
  if (op == "*" && is_intlike(a) && (b.is_string() || b.is_list())) return binary_op(op, b, a);
  if (op == "%" && a.is_string())
    throw_eval("TypeError", "printf-style formatting with % is not supported");
  unsupported_operands(op, a, b);
}

namespace {

// -1, 0, 1 as Python orders numbers, strings and sequences.
int order(std::string_view op, const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) throw_eval("LimitError", "comparison nested too deeply");
  if (a.is_number() && b.is_number()) {
    if (is_intlike(a) && is_intlike(b)) return (a.as_int() > b.as_int()) - (a.as_int() < b.as_int());
    const double x = a.as_double(), y = b.as_double();
    if (std::isnan(x) || std::isnan(y)) return 2;  // every comparison false
    return (x > y) - (x < y);
  }
  if (a.is_string() && b.is_string()) {
    // note: byte order of UTF-8 equals code point order, as Python compares.
    const int c = a.as_string().compare(b.as_string());
    return (c > 0) - (c < 0);
  }
  if (a.is_list() && b.is_list() && a.list_data().is_tuple == b.list_data().is_tuple) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (equals(x[i], y[i])) continue;
      return order(op, x[i], y[i], depth + 1);
    }
    return (x.size() > y.size()) - (x.size() < y.size());
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  throw_eval("TypeError", fmt::format("'{}' not supported between instances of '{}' and '{}'", op,
                                      python_type_name(a), python_type_name(b)));
}

}  // namespace

bool compare_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  const int c = order(op, a, b, 0);
  if (c == 2) return false;
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;  // ">="
}

bool contains(const Value& c, const Value& item) {
  if (c.is_string()) {
    if (item.is_undefined()) fail_undefined(item);
    if (!item.is_string()) {
      throw_eval("TypeError", fmt::format("'in <string>' requires string as left operand, not {}",
                                          python_type_name(item)));
    }
    return c.as_string().find(item.as_string()) != std::string::npos;
  }
  if (c.is_list()) {
    for (const Value& e : c.items())
      if (equals(e, item)) return true;
    return false;
  }
  if (c.is_dict()) {
    if (!item.is_string()) {
      if (item.is_list() && !item.list_data().is_tuple)
        throw_eval("TypeError", "unhashable type: 'list'");
      if (item.is_dict()) throw_eval("TypeError", "unhashable type: 'dict'");
      return false;
    }
    return c.dict_data().find(item.as_string()) != nullptr;
  }
  if (c.is_undefined()) return false;  // jinja2's Undefined iterates as empty
  if (c.is_loop()) throw_eval("TypeError", "'in' on a loop object is not supported");
  throw_eval("TypeError",
             fmt::format("argument of type '{}' is not iterable", python_type_name(c)));
}

namespace {

// Python's public methods of str and dict; the ones has_method() lacks are
// refused by name rather than looked up as items.
bool is_python_method(const Value& v, std::string_view name) {
  static const char* kStr[] = {
      "capitalize", "casefold",   "center",     "count",      "encode",       "endswith",
      "expandtabs", "find",       "format",     "format_map", "index",        "isalnum",
      "isalpha",    "isascii",    "isdecimal",  "isdigit",    "isidentifier", "islower",
      "isnumeric",  "isprintable", "isspace",   "istitle",    "isupper",      "join",
      "ljust",      "lower",      "lstrip",     "maketrans",  "partition",    "removeprefix",
      "removesuffix", "replace",  "rfind",      "rindex",     "rjust",        "rpartition",
      "rsplit",     "rstrip",     "split",      "splitlines", "startswith",   "strip",
      "swapcase",   "title",      "translate",  "upper",      "zfill"};
  static const char* kDict[] = {"clear", "copy",   "fromkeys", "get",    "items",
                                "keys",  "pop",    "popitem",  "setdefault", "update", "values"};
  auto in = [&](auto& list) {
    return std::any_of(std::begin(list), std::end(list), [&](const char* n) { return name == n; });
  };
  if (v.is_string()) return in(kStr);
  if (v.is_dict()) return in(kDict);
  return false;
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  // note: jinja2 looks up a Python attribute first, so `d.items` is the
  // method even when the dict has a key "items".
  if (has_method(obj, name)) {
    auto fn = std::make_shared<Callable>();
    fn->name = name;
    fn->call = [obj, name](CallArgs& a) {
      Value result;
      call_method(obj, name, a, result);
      return result;
    };
    return Value::callable(std::shared_ptr<const Callable>(std::move(fn)));
  }
  if (is_python_method(obj, name)) {
    throw_eval("TypeError",
               fmt::format("{}.{} is not supported", python_type_name(obj), name));
  }
  if (obj.is_dict() || obj.is_loop()) {
    if (const Value* v = obj.dict_data().find(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.namespace_data()->find(name)) return *v;
  }
  return Value::undefined(
      fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

namespace {

// Python index normalisation; false when out of range.
bool normalise_index(int64_t& i, int64_t n) {
  if (i < 0) i += n;
  return i >= 0 && i < n;
}

}  // namespace

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict_data().find(key.as_string())) return *v;
    }
    return Value::undefined(fmt::format("'{}' has no attribute {}", object_type_repr(obj),
                                        py_repr(key)));
  }
  if ((obj.is_list() || obj.is_string()) && is_intlike(key)) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      if (normalise_index(i, static_cast<int64_t>(obj.items().size())))
        return obj.items()[static_cast<size_t>(i)];
    } else {
      const std::u32string cs = utf8_decode(obj.as_string());
      if (normalise_index(i, static_cast<int64_t>(cs.size())))
        return Value::string(utf8_encode(std::u32string(1, cs[static_cast<size_t>(i)])));
    }
    return Value::undefined(fmt::format("{} object has no element {}", python_type_name(obj),
                                        key.as_int()));
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(fmt::format("'{}' has no attribute {}", object_type_repr(obj),
                                      py_repr(key)));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!is_intlike(v)) {
      throw_eval("TypeError", fmt::format("slice {} must be an integer or None, not {}", what,
                                          python_type_name(v)));
    }
    return v.as_int();
  };
  const auto b = bound(start, "start"), e = bound(stop, "stop"), s = bound(step, "step");
  const int64_t st = s.value_or(1);
  if (st == 0) throw_eval("ValueError", "slice step cannot be zero");
  if (!obj.is_list() && !obj.is_string())
    throw_eval("TypeError", fmt::format("'{}' object is not subscriptable", python_type_name(obj)));
  const std::u32string cs = obj.is_string() ? utf8_decode(obj.as_string()) : std::u32string();
  const int64_t n = obj.is_string() ? static_cast<int64_t>(cs.size())
                                    : static_cast<int64_t>(obj.items().size());
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t lo = adjust(b, st < 0 ? n - 1 : 0);
  const int64_t hi = adjust(e, st < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) picks.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::u32string out;
    for (size_t i : picks) out += cs[i];
    return Value::string(utf8_encode(out));
  }
  std::vector<Value> out;
  for (size_t i : picks) out.push_back(obj.items()[i]);
  return Value::list(std::move(out), obj.list_data().is_tuple);
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.items();
    case Value::Kind::kDict: {
      if (v.is_loop()) throw_eval("TypeError", "iterating a loop object is not supported");
      std::vector<Value> keys;
      for (const auto& [k, e] : v.dict_data().items) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> out;
      for (char32_t c : utf8_decode(v.as_string()))
        out.push_back(Value::string(utf8_encode(std::u32string(1, c))));
      return out;
    }
    default:
      throw_eval("TypeError",
                 fmt::format("'{}' object is not iterable", python_type_name(v)));
  }
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return py_len(v.as_string());
    case Value::Kind::kList: return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict:
      if (v.is_loop()) return v.dict_data().find("length")->as_int();
      return static_cast<int64_t>(v.dict_data().items.size());
    default:
      throw_eval("TypeError",
                 fmt::format("object of type '{}' has no len()", python_type_name(v)));
  }
}

}  // namespace qtk::jinja
