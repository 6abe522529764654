// A chat request (`messages`, `tools`, `add_generation_prompt`, template
// keyword arguments) and its rendering with the model's chat template, as
// transformers' `apply_chat_template(..., tokenize=False)` does it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat/jinja_template.h"

namespace qtk::chat {

struct ChatRequest {
  nlohmann::ordered_json messages;    // an array
  nlohmann::ordered_json tools;       // null or an array of objects
  nlohmann::ordered_json documents;   // null or an array of objects
  bool add_generation_prompt = true;  // transformers' default is False; vLLM's and ours true
  // Template keyword arguments in the order given (top-level ones, then
  // chat_template_kwargs, which override).
  std::vector<std::pair<std::string, nlohmann::ordered_json>> kwargs;
};

// The top-level fields of a request line read as template keyword
// arguments (besides `chat_template_kwargs`).
inline constexpr const char* kTopLevelTemplateKwargs[] = {"enable_thinking", "add_vision_id",
                                                          "reasoning_effort", "thinking"};

// Every request-line field read by read_chat_request (for a reader that
// refuses unknown fields).
inline constexpr const char* kChatRequestFields[] = {"messages",
                                                     "tools",
                                                     "documents",
                                                     "add_generation_prompt",
                                                     "continue_final_message",
                                                     "chat_template_kwargs",
                                                     "enable_thinking",
                                                     "add_vision_id",
                                                     "reasoning_effort",
                                                     "thinking"};

// note: nlohmann::json parses iteratively but copies and converts
// recursively; a request line is checked with this before parsing so that
// a line nested a million levels deep is refused instead of overflowing the
// stack. The deepest nesting of arrays/objects in JSON text.
int json_nesting_depth(std::string_view json_text);
inline constexpr int kMaxRequestNesting = 128;  // as generate's strict line parser

// True when `line` carries `messages` (i.e. is a chat request).
bool is_chat_request(const nlohmann::ordered_json& line);

// Reads the chat fields of a request line (an object): `messages`,
// `tools`, `documents`, `add_generation_prompt`, the kTopLevelTemplateKwargs
// and `chat_template_kwargs`. Returns "" or an error naming the field, what
// was expected and what was found.
std::string read_chat_request(const nlohmann::ordered_json& line, ChatRequest& out);

// The chat template source of a model: `chat_template` of
// tokenizer_config.json (a string, or a list of {"name","template"} where
// the one named "default" is used), unless a chat_template.jinja file's
// text is given (transformers prefers that file). nullopt when neither has
// one. Throws qtk::Error naming `config_source` for a malformed entry.
std::optional<std::string> template_from_config(const nlohmann::json* tokenizer_config,
                                                const std::string& config_source,
                                                const std::optional<std::string>& jinja_file);

// Special tokens (bos_token, eos_token, pad_token, unk_token) of
// tokenizer_config.json, which transformers passes to every template.
std::vector<std::pair<std::string, nlohmann::ordered_json>> special_tokens_from_config(
    const nlohmann::json* tokenizer_config);

// Renders `request` with `tmpl`. Throws jinja::TemplateError: the
// template's own raise_exception() message (kind "TemplateError"), a
// runtime error, or transformers' ValueError for an empty conversation.
std::string render_chat(
    const jinja::Template& tmpl, const ChatRequest& request,
    const std::vector<std::pair<std::string, nlohmann::ordered_json>>& special_tokens = {});

// One line for a per-request error: "chat template: <Kind>: <message>
// (<source> line L column C)", or the template's own message for
// raise_exception().
std::string describe_template_error(const jinja::TemplateError& e);

}  // namespace qtk::chat
