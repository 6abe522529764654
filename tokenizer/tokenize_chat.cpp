#include "tokenizer/tokenize_chat.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/json.h"
#include "tokenizer/chat/chat_request.h"

namespace qtk {

namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

TokenizedLine error_out(const ojson& id, const std::string& message) {
  ojson out;
  out["id"] = id;
  out["error"] = message;
  return {dump(out), true};
}

}  // namespace

TokenizedLine chat_tokenize_line(const ChatLineContext& c, const std::string& line,
                                 size_t line_number) {
  ojson id = line_number;
  ojson input;
  // note: the strict parse (generate's: UTF-8 checked, duplicate keys and
  // nesting past 128 levels refused) decides validity and words the error;
  // the line is parsed again with its key order kept for the template.
  try {
    parse_json_strict(line, fmt::format("line {}", line_number), WideIntegers::kRefuse);
    input = ojson::parse(line);
  } catch (const Error& e) {
    return error_out(id, e.what());
  }
  if (!input.is_object()) {
    return error_out(id, fmt::format("line {}: expected a JSON object with \"messages\", found {}",
                                     line_number, input.type_name()));
  }
  if (auto it = input.find("id"); it != input.end()) {
    if (!it->is_string() && !it->is_number_integer()) {
      return error_out(id, fmt::format("line {}: field 'id': expected a string or an integer, "
                                       "found {}",
                                       line_number, it->type_name()));
    }
    id = *it;
  }
  if (!chat::is_chat_request(input))
    return error_out(id, fmt::format("line {}: missing field 'messages'", line_number));
  chat::ChatRequest req;
  if (auto e = chat::read_chat_request(input, req); !e.empty())
    return error_out(id, fmt::format("line {}: {}", line_number, e));
  std::string text;
  try {
    text = chat::render_chat(*c.tmpl, req, c.special_tokens);
  } catch (const jinja::TemplateError& e) {
    return error_out(id, fmt::format("line {}: {}", line_number, chat::describe_template_error(e)));
  }
  std::vector<int32_t> ids;
  try {
    ids = c.tokenizer->encode(text);
  } catch (const Error& e) {
    return error_out(id, fmt::format("line {}: {}", line_number, e.what()));
  }
  ojson out;
  out["id"] = id;
  out["text"] = text;
  out["ids"] = ids;
  return {dump(out), false};
}

}  // namespace qtk
