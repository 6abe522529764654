// Python str methods on UTF-8 text, by code point as Python counts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qtk::jinja {

// Code points of valid UTF-8 (the text comes from validated JSON or the
// template, itself validated).
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
bool is_ascii(std::string_view s);
// Byte offset of the first invalid UTF-8 sequence (overlong forms and
// surrogates included), or npos.
size_t find_invalid_utf8_at(std::string_view s);
int64_t py_len(std::string_view s);

// Python str.isspace() for one code point.
bool py_isspace(char32_t c);
// Python str.isprintable() for one code point (what repr() escapes).
bool py_isprintable(char32_t c);

// str.strip/lstrip/rstrip(chars); no chars: Unicode whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split(sep, maxsplit); no sep: runs of whitespace. Throws EvalError
// (ValueError) for an empty separator.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl,
                       int64_t count);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
// repr() of a str: quotes and escapes as Python prints them.
std::string py_str_repr(std::string_view s);

}  // namespace qtk::jinja
