// Errors raised while parsing or rendering a Jinja template.
//
// `kind` follows the Python exception a jinja2 render would raise
// ("TemplateSyntaxError", "TemplateError" for raise_exception(), "TypeError",
// "UndefinedError", "ValueError", ...) so that a failure can be compared with
// what transformers reports; "LimitError" is ours (a safety cap was reached).
#pragma once

#include <stdexcept>
#include <string>

namespace qtk::jinja {

class TemplateError : public std::runtime_error {
 public:
  TemplateError(std::string kind, std::string message, std::string source, int line, int column);

  const std::string& kind() const { return kind_; }
  // The message alone, as the Python exception would carry it.
  const std::string& message() const { return message_; }
  // "Kind: message", as transformers prints the exception.
  std::string python_form() const;
  const std::string& source() const { return source_; }
  int line() const { return line_; }      // 1-based; 0 when unknown
  int column() const { return column_; }  // 1-based; 0 when unknown

 private:
  std::string kind_, message_, source_;
  int line_, column_;
};

// A position in the template source (1-based line and column).
struct SourcePos {
  int line = 0;
  int column = 0;
};

// An error raised by a builtin (filter, method, operator) before the
// renderer knows the template position; the renderer rethrows it as a
// TemplateError at the node being evaluated.
struct EvalError {
  std::string kind;
  std::string message;
};

[[noreturn]] inline void throw_eval(std::string kind, std::string message) {
  throw EvalError{std::move(kind), std::move(message)};
}

}  // namespace qtk::jinja
