// Fuzz entry: the chat template renderer (tokenizer/chat).
//
// Byte 0 chooses the mode; the rest is the payload:
//   even: the payload is a template, parsed and rendered with a fixed chat
//         request (messages with reasoning, tool calls and parts, tools).
//   odd:  the payload is a request line ({"messages", "tools", ...}) rendered
//         with each of the three real Qwen templates of tests/data/chat.
// A jinja::TemplateError is the expected answer to anything bad (syntax,
// runtime errors, raise_exception, the safety caps); any other exception,
// a crash, a hang past -timeout or a sanitizer report is a finding. A
// successful render must be valid UTF-8 within the output cap.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/chat/chat_request.h"
#include "tokenizer/chat/py_string.h"

namespace qtk::fuzz {

namespace {

using ojson = nlohmann::ordered_json;

// note: tighter caps than the defaults keep each execution fast; the caps
// themselves are what is under test, not their size.
jinja::RenderLimits fuzz_limits() {
  jinja::RenderLimits l;
  l.max_output_bytes = 1 << 20;
  l.max_loop_iterations = 100000;
  l.max_steps = 1000000;
  return l;
}

const chat::ChatRequest& fixed_request() {
  static const chat::ChatRequest req = [] {
    const ojson line = ojson::parse(R"({
      "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image"}]},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello", "reasoning_content": null,
         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5]}}}]},
        {"role": "tool", "content": "{\"ok\": true}"},
        {"role": "user", "content": "Thanks \u00e9 \ud83d\ude00"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "enable_thinking": false})");
    chat::ChatRequest r;
    if (!chat::read_chat_request(line, r).empty()) fuzz_check_failed("fixed request refused");
    return r;
  }();
  return req;
}

const std::vector<jinja::Template>& real_templates() {
  static const std::vector<jinja::Template> t = [] {
    std::vector<jinja::Template> out;
    for (const char* name : {"qwen3", "qwen3_5", "qwen3_thinking_2507"}) {
      const std::string path = std::string(QTK_SOURCE_DIR) + "/tests/data/chat/" + name + ".jinja";
      std::ifstream in(path, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      out.push_back(jinja::Template::parse(ss.str(), path));
    }
    return out;
  }();
  return t;
}

void check_rendering(const std::string& text, const jinja::RenderLimits& limits) {
  fuzz_check(jinja::find_invalid_utf8_at(text) == std::string_view::npos,
             "rendering is not valid UTF-8");
  fuzz_check(text.size() <= limits.max_output_bytes, "rendering over the output cap");
}

}  // namespace

int chat_template(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view payload = as_text(data + 1, size - 1);
  const jinja::RenderLimits limits = fuzz_limits();
  if ((data[0] & 1) == 0) {
    try {
      const jinja::Template t = jinja::Template::parse(payload, "fuzz.jinja");
      const std::string text = chat::render_chat(t, fixed_request());
      check_rendering(text, jinja::RenderLimits{});
      // the same template with the fuzz caps, straight through render()
      std::vector<std::pair<std::string, jinja::Value>> ctx = {
          {"messages", jinja::Value::from_json(fixed_request().messages)}};
      check_rendering(t.render(ctx, limits), limits);
    } catch (const jinja::TemplateError&) {
    }
    return 0;
  }
  ojson line;
  if (chat::json_nesting_depth(payload) > chat::kMaxRequestNesting) return 0;
  try {
    line = ojson::parse(payload);
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  if (!chat::is_chat_request(line)) return 0;
  chat::ChatRequest req;
  if (!chat::read_chat_request(line, req).empty()) return 0;
  for (const jinja::Template& t : real_templates()) {
    try {
      check_rendering(chat::render_chat(t, req), jinja::RenderLimits{});
    } catch (const jinja::TemplateError&) {
    }
  }
  return 0;
}

}  // namespace qtk::fuzz
