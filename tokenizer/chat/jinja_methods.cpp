// Methods of str and dict that templates call, and attribute lookup.
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

bool has_method(const Value& v, std::string_view name) {
  static const char* kStr[] = {
      "startswith", "endswith", "split", "strip", "lstrip", "rstrip",  "replace", "upper", "lower",
      "capitalize", "title",    "find",  "count", "join",   "isdigit", "isspace", "format"};
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
      throw_eval("TypeError", fmt::format("{} first arg must be str or a tuple of str, not {}",
                                          start ? "startswith" : "endswith", python_type_name(x)));
    }
    const std::string& a = x.as_string();
    if (a.size() > s.size()) return false;
    return start ? s.compare(0, a.size(), a) == 0
                 : s.compare(s.size() - a.size(), a.size(), a) == 0;
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
    if (a.positional.empty())
      throw_eval("TypeError", what + "() takes at least 1 argument (0 given)");
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
    return Value::string(
        py_strip(s, opt_str_arg(a, 0, "chars", what), name != "rstrip", name != "lstrip"));
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
    if (name == "isspace") return Value::boolean(std::all_of(cs.begin(), cs.end(), py_isspace));
    // note: ASCII digits only; Python also counts other Unicode digits.
    if (!is_ascii(s)) throw_eval("TypeError", "str.isdigit() of non-ASCII text is not supported");
    return Value::boolean(
        std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
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
  if (name == "items") return items_of(d);
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

// Python's public methods of str and dict; the ones has_method() lacks are
// refused by name rather than looked up as items.
bool is_python_method(const Value& v, std::string_view name) {
  static const char* kStr[] = {
      "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
      "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
      "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
      "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
      "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
      "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
      "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
      "swapcase",     "title",       "translate", "upper",      "zfill"};
  static const char* kDict[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                "pop",   "popitem", "setdefault", "update", "values"};
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
    throw_eval("TypeError", fmt::format("{}.{} is not supported", python_type_name(obj), name));
  }
  if (obj.is_dict() || obj.is_loop()) {
    if (const Value* v = obj.dict_data().find(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.namespace_data()->find(name)) return *v;
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

}  // namespace qtk::jinja
