// Every field a generate request line may carry: the one list that decides
// what "unknown field" means (runtime/prompt_jsonl.cpp rejects any other
// field unless --allow-unknown-fields is given).
#pragma once

#include <array>
#include <string_view>

namespace qtk {

// note: the chat fields (messages .. chat_template_kwargs) belong to chat
// requests; they are known here so that they never count as unknown.
inline constexpr std::array<std::string_view, 13> kRequestFields = {"id",
                                                                    "prompt",
                                                                    "prompt_token_ids",
                                                                    "max_tokens",
                                                                    "max_new_tokens",
                                                                    "ignore_eos",
                                                                    "stop_token_ids",
                                                                    "mrope_position_ids",
                                                                    "messages",
                                                                    "tools",
                                                                    "add_generation_prompt",
                                                                    "enable_thinking",
                                                                    "chat_template_kwargs"};

inline bool is_request_field(std::string_view name) {
  for (std::string_view f : kRequestFields)
    if (f == name) return true;
  return false;
}

}  // namespace qtk
