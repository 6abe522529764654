// The values a Jinja template computes with, with Python's semantics.
//
// Lists and dicts are immutable once built (the templates run in jinja2's
// immutable sandbox, which refuses append/update), so they are shared by
// pointer. Namespaces are the one mutable object; they and macros are owned
// by the render that created them (an arena), which rules out reference
// cycles and leaks. Dicts keep insertion order, as Python's do, because
// `tojson` of a tool definition must print keys in the order given.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace qtk::jinja {

class Value;

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;  // nesting depth of lists/dicts, this one included
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, unique keys
  int depth = 1;
  // note: a for loop's `loop` object is held as a dict of its attributes
  // but behaves as jinja2's LoopContext (not a mapping, prints as
  // <LoopContext i/n>).
  bool is_loop = false;
  const Value* find(std::string_view key) const;
};

// A namespace(): attributes in assignment order.
struct NamespaceData {
  std::vector<std::pair<std::string, Value>> attrs;
  Value* find(std::string_view key);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

// A macro or a global function (namespace, raise_exception, range, ...).
struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// note: nesting deeper than this is refused (a template could otherwise
// build `[[[...]]]` in a loop and make str()/tojson recurse off the stack).
constexpr int kMaxValueDepth = 256;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(std::vector<std::pair<std::string, Value>> items);
  static Value loop_context(std::vector<std::pair<std::string, Value>> attrs);
  static Value ns(NamespaceData* data);
  // note: macros and globals live in the render's arena (not owned here);
  // bound methods (`"a".startswith`) are owned by the value.
  static Value callable(const Callable* fn);
  static Value callable(std::shared_ptr<const Callable> fn);
  // Converts parsed JSON (objects keep their key order).
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict && !dict_->is_loop; }
  bool is_loop() const { return kind_ == Kind::kDict && dict_->is_loop; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return int_; }  // kInt or kBool
  double as_double() const;                // any number
  const std::string& as_string() const { return str_; }
  // The jinja2 error a use of this undefined value raises.
  const std::string& undefined_hint() const { return str_; }
  const ListData& list_data() const { return *list_; }
  const std::vector<Value>& items() const { return list_->items; }
  const DictData& dict_data() const { return *dict_; }
  NamespaceData* namespace_data() const { return ns_; }
  const Callable* callable_ptr() const { return fn_.get(); }
  int depth() const;

 private:
  static Value from_json_at(const nlohmann::ordered_json& j, int depth);

  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string str_;  // kString; kUndefined: the error message of using it
  std::shared_ptr<const ListData> list_;
  std::shared_ptr<const DictData> dict_;
  NamespaceData* ns_ = nullptr;
  std::shared_ptr<const Callable> fn_;
};

// Python's type(x).__name__ ("str", "list", "dict", "NoneType", ...).
std::string python_type_name(const Value& v);
// jinja2's object_type_repr ("list object", "None", ...), used in
// "'list object' has no attribute 'x'".
std::string object_type_repr(const Value& v);

bool truthy(const Value& v);
// Python ==.
bool equals(const Value& a, const Value& b);

// Python str() (undefined: "", as jinja2's Undefined prints) and repr().
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
std::string py_float_repr(double d);

struct JsonDumpOptions {
  bool ensure_ascii = false;  // transformers' tojson passes ensure_ascii=False
  bool sort_keys = false;
  bool has_indent = false;
  std::string indent;                 // when has_indent
  std::string item_separator = ", ";  // json.dumps' defaults (", " / ",\n" with indent)
  std::string key_separator = ": ";
};
// Python json.dumps(v, ...). Throws EvalError (TypeError) for a value JSON
// cannot hold.
std::string json_dumps(const Value& v, const JsonDumpOptions& o);

}  // namespace qtk::jinja
