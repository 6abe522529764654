// Argument helpers shared by the builtins (filters, tests, methods and
// operators): Python-style positional/keyword lookup and the errors jinja2
// raises for bad arguments.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "tokenizer/chat/jinja_builtins.h"
#include "tokenizer/chat/jinja_error.h"

namespace qtk::jinja::builtin {

inline void check_string_size(size_t n) {
  if (n > kMaxStringBytes)
    throw_eval("LimitError", fmt::format("a string longer than {} bytes", kMaxStringBytes));
}

// The undefined value's own error, as jinja2 raises it on use.
[[noreturn]] inline void fail_undefined(const Value& v) {
  throw_eval("UndefinedError", v.undefined_hint());
}

inline const Value* arg(CallArgs& a, size_t index, std::string_view name) {
  if (index < a.positional.size()) return &a.positional[index];
  for (const auto& [k, v] : a.named)
    if (k == name) return &v;
  return nullptr;
}

inline void check_arity(CallArgs& a, std::string_view what, size_t max_positional,
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

inline std::optional<std::string> opt_str_arg(CallArgs& a, size_t index, std::string_view name,
                                              std::string_view what) {
  const Value* v = arg(a, index, name);
  if (v == nullptr || v->is_none()) return std::nullopt;
  if (!v->is_string())
    throw_eval("TypeError",
               fmt::format("{} arg must be None or str, not {}", what, python_type_name(*v)));
  return v->as_string();
}

inline int64_t int_arg(CallArgs& a, size_t index, std::string_view name, int64_t dflt,
                       std::string_view what) {
  const Value* v = arg(a, index, name);
  if (v == nullptr) return dflt;
  if (!v->is_int() && !v->is_bool())
    throw_eval("TypeError",
               fmt::format("{}: expected an integer, found {}", what, python_type_name(*v)));
  return v->as_int();
}

inline const std::string& str_arg(CallArgs& a, size_t index, std::string_view name,
                                  std::string_view what) {
  const Value* v = arg(a, index, name);
  if (v == nullptr) throw_eval("TypeError", fmt::format("{} missing argument '{}'", what, name));
  if (!v->is_string()) {
    throw_eval("TypeError", fmt::format("{} argument '{}' must be str, not {}", what, name,
                                        python_type_name(*v)));
  }
  return v->as_string();
}

}  // namespace qtk::jinja::builtin
