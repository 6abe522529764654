// Parses template tokens into statements (jinja2's grammar, the subset
// listed in jinja_template.h). Anything else is a TemplateSyntaxError that
// names the template line and column.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/chat/jinja_ast.h"
#include "tokenizer/chat/jinja_lexer.h"

namespace qtk::jinja {

// note: caps how deeply tags and expressions may nest; the parser and the
// renderer recurse once per level, and templates come from checkpoints.
constexpr int kMaxParseDepth = 100;

Body parse_tokens(const std::vector<Token>& tokens, const std::string& source);

}  // namespace qtk::jinja
