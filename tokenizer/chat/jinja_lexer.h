// Splits template source into text and tag tokens, applying jinja2's
// whitespace control as transformers configures it: trim_blocks=True (the
// first newline after a block or comment tag is dropped), lstrip_blocks=True
// (spaces and tabs before a block or comment tag at the start of a line are
// dropped), `-` on a tag side strips all whitespace on that side, `+` turns
// lstrip/trim off for that side, and one trailing newline of the template is
// dropped (keep_trailing_newline=False).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat/jinja_error.h"

namespace qtk::jinja {

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,  // value: the decoded string
    kInt,
    kFloat,
    kOp,
    kEof,
  };
  Type type;
  std::string value;
  SourcePos pos;
};

// Throws TemplateError (TemplateSyntaxError) naming `source`, line and column.
std::vector<Token> lex_template(std::string_view text, const std::string& source);

}  // namespace qtk::jinja
