// Every field a generate request line may carry: the one list that decides
// what "unknown field" means (runtime/prompt_jsonl.cpp rejects any other
// field unless --allow-unknown-fields is given).
#pragma once

#include <array>
#include <string_view>

#include "tokenizer/chat/chat_request.h"

namespace qtk {

// The plain (non-chat) request fields.
inline constexpr std::array<std::string_view, 8> kRequestFields = {
    "id",         "prompt",         "prompt_token_ids",  "max_tokens", "max_new_tokens",
    "ignore_eos", "stop_token_ids", "mrope_position_ids"};

// note: the chat fields (messages, tools, add_generation_prompt, template
// keyword arguments, ...) are chat::kChatRequestFields, the list the chat
// reader itself reads; they never count as unknown.
inline bool is_chat_field(std::string_view name) {
  for (std::string_view f : chat::kChatRequestFields)
    if (f == name) return true;
  return false;
}

inline bool is_request_field(std::string_view name) {
  for (std::string_view f : kRequestFields)
    if (f == name) return true;
  return is_chat_field(name);
}

}  // namespace qtk
