// Filters and tests (jinja_filters.cpp), the methods of str and dict that
// templates call and attribute lookup (jinja_methods.cpp), and Python
// operators, items, slices and iteration (jinja_operators.cpp), with jinja2
// 3.1 / Python semantics. Errors are thrown as EvalError and given a
// template position by the renderer.
#pragma once

#include <string>
#include <string_view>

#include "tokenizer/chat/jinja_value.h"

namespace qtk::jinja {

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

// `subject | name(args)`.
Value apply_filter(std::string_view name, const Value& subject, CallArgs& args);
// `subject is name(args)`.
bool apply_test(std::string_view name, const Value& subject, CallArgs& args);

// `subject.name(args)` for str and dict methods; false when `subject` has no
// such method (the caller then looks the attribute up as jinja2 does).
bool call_method(const Value& subject, std::string_view name, CallArgs& args, Value& result);
bool has_method(const Value& subject, std::string_view name);

// Python operators on values.
Value binary_op(std::string_view op, const Value& a, const Value& b);
bool compare_op(std::string_view op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);  // `item in container`

// `obj.name` / `obj[key]` as jinja2's sandbox resolves them; an undefined
// value (with the error jinja2 would raise on use) when missing.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// `d|items` / `d.items()`: (key, value) tuples of a dict; TypeError for
// anything else but undefined (no items).
Value items_of(const Value& v);

// Items of a value iterated by `for` (dict: keys, str: characters).
std::vector<Value> iterate(const Value& v);
int64_t length_of(const Value& v);

// note: caps the size of any one string or list a template builds, so a
// template doubling a string in a loop fails quickly instead of exhausting
// memory.
constexpr size_t kMaxStringBytes = 32u << 20;
constexpr size_t kMaxListItems = 1u << 20;

}  // namespace qtk::jinja
