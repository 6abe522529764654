#include "tokenizer/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "tokenizer/chat/jinja_args.h"
#include "tokenizer/chat/jinja_error.h"
#include "tokenizer/chat/py_string.h"

namespace qtk::jinja {

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* NamespaceData::find(std::string_view key) {
  for (auto& [k, v] : attrs)
    if (k == key) return &v;
  return nullptr;
}

namespace {

void check_depth(int depth) {
  if (depth > kMaxValueDepth) {
    throw_eval("LimitError",
               fmt::format("a list or dict nested deeper than {} levels", kMaxValueDepth));
  }
}

}  // namespace

Value Value::undefined(std::string hint) {
  Value v;
  v.str_ = std::move(hint);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  v.int_ = b ? 1 : 0;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.double_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::move(s);
  return v;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto d = std::make_shared<ListData>();
  int depth = 0;
  for (const auto& e : items) depth = std::max(depth, e.depth());
  d->depth = depth + 1;
  check_depth(d->depth);
  d->items = std::move(items);
  d->is_tuple = is_tuple;
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::move(d);
  return v;
}

Value Value::dict(std::vector<std::pair<std::string, Value>> items) {
  auto d = std::make_shared<DictData>();
  int depth = 0;
  for (const auto& e : items) depth = std::max(depth, e.second.depth());
  d->depth = depth + 1;
  check_depth(d->depth);
  // Python keeps the first position and the last value of a repeated key.
  for (auto& [k, val] : items) {
    bool found = false;
    for (auto& [k2, v2] : d->items) {
      if (k2 == k) {
        v2 = std::move(val);
        found = true;
        break;
      }
    }
    if (!found) d->items.emplace_back(std::move(k), std::move(val));
  }
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::move(d);
  return v;
}

Value Value::loop_context(std::vector<std::pair<std::string, Value>> attrs) {
  Value v = dict(std::move(attrs));
  auto d = std::make_shared<DictData>(*v.dict_);
  d->is_loop = true;
  v.dict_ = std::move(d);
  return v;
}

Value Value::ns(NamespaceData* data) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ns_ = data;
  return v;
}

Value Value::callable(const Callable* fn) {
  // an aliasing pointer with no owner: the arena keeps `fn` alive
  return callable(std::shared_ptr<const Callable>(std::shared_ptr<const Callable>(), fn));
}

Value Value::callable(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::move(fn);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 1); }

Value Value::from_json_at(const nlohmann::ordered_json& j, int depth) {
  check_depth(depth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      // note: Python ints are unbounded, ours are int64: a larger value
      // would print as a float (1.8446744073709552e+19, not the digits
      // transformers prints), so it is the request's error instead.
      if (u > static_cast<uint64_t>(INT64_MAX))
        throw_eval("ValueError", "integer " + std::to_string(u) +
                                     " is past the template engine's 64-bit signed integers "
                                     "(write a string for a larger number)");
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json_at(e, depth + 1));
      return dict(std::move(items));
    }
    default:
      throw_eval("TypeError", "unsupported JSON value (binary or discarded)");
  }
}

double Value::as_double() const {
  if (kind_ == Kind::kFloat) return double_;
  return static_cast<double>(int_);
}

int Value::depth() const {
  if (kind_ == Kind::kList) return list_->depth;
  if (kind_ == Kind::kDict) return dict_->depth;
  return 0;
}

std::string python_type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.list_data().is_tuple ? "tuple" : "list";
    case Value::Kind::kDict:
      return v.is_loop() ? "LoopContext" : "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_namespace()) return "jinja2.utils.Namespace object";
  return python_type_name(v) + " object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_double() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      return !v.items().empty();
    case Value::Kind::kDict:
      return !v.dict_data().items.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

namespace {

bool equals_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) throw_eval("LimitError", "comparison nested too deeply");
  if (a.is_number() && b.is_number()) {
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      // note: Python's list == tuple is False.
      if (a.list_data().is_tuple != b.list_data().is_tuple) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals_at(x[i], y[i], depth + 1)) return false;
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.dict_data().items;
      if (x.size() != b.dict_data().items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* o = b.dict_data().find(k);
        if (o == nullptr || !equals_at(v, *o, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return a.namespace_data() == b.namespace_data();
    case Value::Kind::kCallable:
      return a.callable_ptr() == b.callable_ptr();
    default:
      return false;
  }
}

std::string repr_at(const Value& v, int depth);

std::string str_at(const Value& v, int depth) {
  if (depth > kMaxValueDepth) throw_eval("LimitError", "str() of a value nested too deeply");
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return py_float_repr(v.as_double());
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kList: {
      const bool tuple = v.list_data().is_tuple;
      std::string s = tuple ? "(" : "[";
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) s += ", ";
        s += repr_at(items[i], depth + 1);
        // note: checked as it grows: a list holding itself twice per level
        // ([x, x] nested 30 deep) has 2^30 leaves in a few bytes of values.
        builtin::check_string_size(s.size());
      }
      if (tuple && items.size() == 1) s += ",";
      s += tuple ? ")" : "]";
      return s;
    }
    case Value::Kind::kDict: {
      if (v.is_loop()) {
        const Value* i = v.dict_data().find("index");
        const Value* n = v.dict_data().find("length");
        return fmt::format("<LoopContext {}/{}>", i ? i->as_int() : 0, n ? n->as_int() : 0);
      }
      std::string s = "{";
      bool first = true;
      for (const auto& [k, e] : v.dict_data().items) {
        if (!first) s += ", ";
        first = false;
        s += py_str_repr(k) + ": " + repr_at(e, depth + 1);
        builtin::check_string_size(s.size());
      }
      return s + "}";
    }
    case Value::Kind::kNamespace: {
      std::string s = "<Namespace {";
      bool first = true;
      for (const auto& [k, e] : v.namespace_data()->attrs) {
        if (!first) s += ", ";
        first = false;
        s += py_str_repr(k) + ": " + repr_at(e, depth + 1);
        builtin::check_string_size(s.size());
      }
      return s + "}>";
    }
    case Value::Kind::kCallable:
      // note: jinja2 prints "<Macro 'name'>" or a Python function with its
      // address; refused rather than imitated.
      throw_eval("TypeError", fmt::format("str() of the function '{}' is not supported",
                                          v.callable_ptr()->name));
  }
  return "";
}

std::string repr_at(const Value& v, int depth) {
  if (v.is_string()) return py_str_repr(v.as_string());
  if (v.is_undefined()) return "Undefined";
  return str_at(v, depth);
}

}  // namespace

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }

std::string py_str(const Value& v) { return str_at(v, 0); }
std::string py_repr(const Value& v) { return repr_at(v, 0); }

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest digits that read back to d, as Python's repr picks them.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e_pos = sci.find('e');
  const int exp10 = std::atoi(sci.c_str() + e_pos + 1);
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out;
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out = fmt::format("0.{}{}", std::string(static_cast<size_t>(-exp10 - 1), '0'), digits);
    } else if (static_cast<int>(digits.size()) <= exp10 + 1) {
      out = fmt::format("{}{}.0", digits,
                        std::string(static_cast<size_t>(exp10 + 1) - digits.size(), '0'));
    } else {
      out = fmt::format("{}.{}", digits.substr(0, static_cast<size_t>(exp10 + 1)),
                        digits.substr(static_cast<size_t>(exp10 + 1)));
    }
  } else {
    out = digits.size() > 1 ? fmt::format("{}.{}", digits.substr(0, 1), digits.substr(1)) : digits;
    out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  }
  return neg ? fmt::format("-{}", out) : out;
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            const uint32_t v = static_cast<uint32_t>(c) - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
          }
        } else {
          utf8_append(out, c);
        }
    }
  }
  out += '"';
}

void dump_at(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  if (level > kMaxValueDepth) throw_eval("LimitError", "tojson of a value nested too deeply");
  // note: checked as it grows (every value visited adds to it), not once
  // at the end: shared lists can unfold into far more than the cap.
  builtin::check_string_size(out.size());
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float_repr(d);
      return;
    }
    case Value::Kind::kString:
      json_string(out, v.as_string(), o.ensure_ascii);
      return;
    case Value::Kind::kList: {
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        if (o.has_indent) newline(level + 1);
        dump_at(out, items[i], o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.is_loop())
        throw_eval("TypeError", "Object of type LoopContext is not JSON serializable");
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict_data().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) {
          return utf8_decode(a->first) < utf8_decode(b->first);
        });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        if (o.has_indent) newline(level + 1);
        json_string(out, items[i]->first, o.ensure_ascii);
        out += o.key_separator;
        dump_at(out, items[i]->second, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default:
      throw_eval("TypeError",
                 fmt::format("Object of type {} is not JSON serializable", python_type_name(v)));
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& o) {
  std::string out;
  dump_at(out, v, o, 0);
  return out;
}

}  // namespace qtk::jinja
