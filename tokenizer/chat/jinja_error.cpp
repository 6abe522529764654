#include "tokenizer/chat/jinja_error.h"

#include <fmt/format.h>

namespace qtk::jinja {

namespace {

std::string full_message(const std::string& kind, const std::string& message,
                         const std::string& source, int line, int column) {
  std::string where = source;
  if (line > 0) where += fmt::format(" line {} column {}", line, column);
  return fmt::format("{}: {}: {}", where, kind, message);
}

}  // namespace

TemplateError::TemplateError(std::string kind, std::string message, std::string source, int line,
                             int column)
    : std::runtime_error(full_message(kind, message, source, line, column)),
      kind_(std::move(kind)),
      message_(std::move(message)),
      source_(std::move(source)),
      line_(line),
      column_(column) {}

std::string TemplateError::python_form() const { return fmt::format("{}: {}", kind_, message_); }

}  // namespace qtk::jinja
