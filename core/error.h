// Error type for bad user input and failed system calls.
//
// Library code throws qtk::Error with a message that names the file, the field,
// what was expected and what was found. Command-line programs catch it, print
// one line on stderr and exit with status 1. Library code never calls exit().
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace qtk {

// A message made printable as one line: control bytes (a NUL, a newline
// from user data) become escapes such as \x00 and \n.
// note: what() is a C string, so an embedded NUL would cut every printed
// message there; escaping at construction keeps all of it.
// (Inline: the tokenizer uses this header without linking loaders.)
inline bool is_control_byte(unsigned char u) { return u < 0x20 || u == 0x7f; }

// Appends the control byte u as every message writes it: \n, \t, \r, else
// \xHH.
inline void append_control_escape(std::string& out, unsigned char u) {
  static constexpr char kHex[] = "0123456789abcdef";
  if (u == '\n') {
    out += "\\n";
  } else if (u == '\t') {
    out += "\\t";
  } else if (u == '\r') {
    out += "\\r";
  } else {
    out += "\\x";
    out += kHex[u >> 4];
    out += kHex[u & 15];
  }
}

inline std::string printable_message(const std::string& message) {
  bool plain = true;
  for (char c : message) plain = plain && !is_control_byte(static_cast<unsigned char>(c));
  if (plain) return message;
  std::string out;
  out.reserve(message.size() + 16);
  for (char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (is_control_byte(u))
      append_control_escape(out, u);
    else
      out += c;
  }
  return out;
}

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(printable_message(message)) {}
};

// Throws qtk::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Throws qtk::Error for a failed system call, appending strerror(errno).
[[noreturn]] void fail_errno(const std::string& what);

}  // namespace qtk
