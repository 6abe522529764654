// Python operators, item access, slicing and iteration on values.
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
      throw_eval("TypeError",
                 fmt::format("can only concatenate {} (not \"{}\") to {}", python_type_name(a),
                             python_type_name(b), python_type_name(a)));
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
    if (is_intlike(a) && is_intlike(b))
      return (a.as_int() > b.as_int()) - (a.as_int() < b.as_int());
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
    return Value::undefined(
        fmt::format("'{}' has no attribute {}", object_type_repr(obj), py_repr(key)));
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
    return Value::undefined(
        fmt::format("{} object has no element {}", python_type_name(obj), key.as_int()));
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(
      fmt::format("'{}' has no attribute {}", object_type_repr(obj), py_repr(key)));
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
  const int64_t n =
      obj.is_string() ? static_cast<int64_t>(cs.size()) : static_cast<int64_t>(obj.items().size());
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
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.items();
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
      throw_eval("TypeError", fmt::format("'{}' object is not iterable", python_type_name(v)));
  }
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return py_len(v.as_string());
    case Value::Kind::kList:
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict:
      if (v.is_loop()) return v.dict_data().find("length")->as_int();
      return static_cast<int64_t>(v.dict_data().items.size());
    default:
      throw_eval("TypeError", fmt::format("object of type '{}' has no len()", python_type_name(v)));
  }
}

}  // namespace qtk::jinja
