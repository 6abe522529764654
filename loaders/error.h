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

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws qtk::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Throws qtk::Error for a failed system call, appending strerror(errno).
[[noreturn]] void fail_errno(const std::string& what);

}  // namespace qtk
