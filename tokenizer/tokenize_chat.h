// tokenize --chat: one request line ({"id", "messages", "tools",
// "add_generation_prompt", "enable_thinking", "chat_template_kwargs", ...})
// to {"id", "text", "ids"} (the rendered prompt and its token ids) or
// {"id", "error"}.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat/jinja_template.h"
#include "tokenizer/tokenizer.h"

namespace qtk {

struct ChatLineContext {
  const Tokenizer* tokenizer = nullptr;
  const jinja::Template* tmpl = nullptr;
  std::vector<std::pair<std::string, nlohmann::ordered_json>> special_tokens;
};

// One output line of tokenize (no newline), and whether it is an error line.
struct TokenizedLine {
  std::string json;
  bool error = false;
};

// The output line for input line `line_number` (1-based; the id when the
// line has none).
TokenizedLine chat_tokenize_line(const ChatLineContext& c, const std::string& line,
                                 size_t line_number);

}  // namespace qtk
