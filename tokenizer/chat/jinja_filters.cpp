// Filters and tests (jinja2 3.1 semantics; tojson as transformers overrides it).
#include "tokenizer/chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "tokenizer/chat/jinja_args.h"
#include "tokenizer/chat/jinja_error.h"
#include "tokenizer/chat/py_string.h"

namespace qtk::jinja {

using namespace builtin;  // NOLINT: the shared argument helpers

namespace {

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
    o.item_separator.assign(
        1, ',');  // note: assign, not = ",": dodges a GCC 12 -Wrestrict false positive
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

}  // namespace

Value items_of(const Value& v) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw_eval("TypeError", "Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [k, e] : v.dict_data().items)
    pairs.push_back(Value::list({Value::string(k), e}, true));
  return Value::list(std::move(pairs));
}

namespace {

Value filter_join(const Value& v, CallArgs& a) {
  check_arity(a, "join", 2, {"d", "attribute"});
  if (arg(a, 1, "attribute") != nullptr)
    throw_eval("TypeError", "join(attribute=) is not supported");
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
  static const char* kNames[] = {"length",     "count", "tojson",  "trim",    "items", "safe",
                                 "string",     "lower", "upper",   "default", "d",     "join",
                                 "first",      "last",  "list",    "int",     "float", "abs",
                                 "capitalize", "title", "replace", "reverse", "e",     "escape"};
  return std::any_of(std::begin(kNames), std::end(kNames),
                     [&](const char* n) { return name == n; });
}

bool is_known_test(std::string_view name) {
  static const char* kNames[] = {
      "defined", "undefined", "none",    "string", "mapping", "iterable", "sequence",    "false",
      "true",    "number",    "integer", "float",  "boolean", "callable", "eq",          "equalto",
      "ne",      "odd",       "even",    "in",     "lower",   "upper",    "divisibleby", "sameas"};
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
    return items_of(v);
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
    if (items.empty())
      return Value::undefined(fmt::format("No {} item, sequence was empty.", name));
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
  if (name != "eq" && name != "equalto" && name != "ne" && name != "in" && name != "divisibleby" &&
      name != "sameas" && (!a.positional.empty() || !a.named.empty()))
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

}  // namespace qtk::jinja
