#include "tokenizer/chat/chat_request.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace qtk::chat {

namespace {

using ojson = nlohmann::ordered_json;

std::string type_of(const ojson& j) { return j.type_name(); }

// note: a template picks what to render by the role ("user", "assistant",
// ...); a message without one matches no branch and would vanish from the
// prompt without a word.
std::string check_role(const ojson& message, size_t i) {
  auto it = message.find("role");
  if (it == message.end())
    return fmt::format(
        "field 'messages[{}].role': missing; expected a string such as \"user\" or "
        "\"assistant\"",
        i);
  if (!it->is_string())
    return fmt::format("field 'messages[{}].role': expected a string, found {}", i, type_of(*it));
  return {};
}

}  // namespace

int json_nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

bool is_chat_request(const ojson& line) { return line.is_object() && line.contains("messages"); }

std::string read_chat_request(const ojson& line, ChatRequest& out) {
  const auto& m = line["messages"];
  if (!m.is_array())
    return fmt::format("field 'messages': expected an array of message objects, found {}",
                       type_of(m));
  for (size_t i = 0; i < m.size(); ++i) {
    if (!m[i].is_object()) {
      return fmt::format("field 'messages'[{}]: expected a message object, found {}", i,
                         type_of(m[i]));
    }
    if (auto e = check_role(m[i], i); !e.empty()) return e;
  }
  out.messages = m;
  // note: transformers accepts a JSON schema (dict) per tool and refuses
  // anything else with this ValueError; tools=[] renders as no tools.
  for (const char* field : {"tools", "documents"}) {
    auto it = line.find(field);
    ojson& dst = std::string(field) == "tools" ? out.tools : out.documents;
    dst = nullptr;
    if (it == line.end() || it->is_null()) continue;
    if (!it->is_array())
      return fmt::format("field '{}': expected an array of objects, found {}", field, type_of(*it));
    for (size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_object()) {
        return fmt::format("field '{}'[{}]: expected an object (a JSON schema), found {}", field, i,
                           type_of((*it)[i]));
      }
    }
    dst = *it;
  }
  if (auto it = line.find("add_generation_prompt"); it != line.end()) {
    if (!it->is_boolean())
      return fmt::format("field 'add_generation_prompt': expected true or false, found {}",
                         type_of(*it));
    out.add_generation_prompt = it->get<bool>();
  }
  if (auto it = line.find("continue_final_message"); it != line.end()) {
    if (!it->is_boolean() || it->get<bool>())
      return "field 'continue_final_message': only false is supported";
  }
  auto set_kwarg = [&out](const std::string& k, const ojson& v) {
    for (auto& [name, value] : out.kwargs) {
      if (name == k) {
        value = v;
        return;
      }
    }
    out.kwargs.emplace_back(k, v);
  };
  for (const char* k : kTopLevelTemplateKwargs) {
    if (auto it = line.find(k); it != line.end()) set_kwarg(k, *it);
  }
  if (auto it = line.find("chat_template_kwargs"); it != line.end()) {
    if (!it->is_object())
      return fmt::format("field 'chat_template_kwargs': expected an object, found {}",
                         type_of(*it));
    for (const auto& [k, v] : it->items()) {
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") {
        return fmt::format(
            "field 'chat_template_kwargs'.'{}': give '{}' at the top level of the request", k, k);
      }
      set_kwarg(k, v);
    }
  }
  return {};
}

std::optional<std::string> template_from_config(const nlohmann::json* config,
                                                const std::string& config_source,
                                                const std::optional<std::string>& jinja_file) {
  if (jinja_file) return jinja_file;
  if (config == nullptr || !config->is_object()) return std::nullopt;
  auto it = config->find("chat_template");
  if (it == config->end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    // note: transformers' named templates; apply_chat_template uses "default".
    for (const auto& e : *it) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
    }
    fail("{}: field 'chat_template': a list of named templates without one named 'default'",
         config_source);
  }
  fail("{}: field 'chat_template': expected a string, found {}", config_source, it->type_name());
}

std::vector<std::pair<std::string, ojson>> special_tokens_from_config(
    const nlohmann::json* config) {
  std::vector<std::pair<std::string, ojson>> out;
  if (config == nullptr || !config->is_object()) return out;
  for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto it = config->find(k);
    if (it == config->end()) continue;
    if (it->is_string()) {
      out.emplace_back(k, it->get<std::string>());
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      out.emplace_back(k, (*it)["content"].get<std::string>());
    }
  }
  return out;
}

std::string render_chat(const jinja::Template& tmpl, const ChatRequest& request,
                        const std::vector<std::pair<std::string, ojson>>& special_tokens) {
  if (request.messages.empty()) {
    throw jinja::TemplateError(
        "ValueError",
        "Cannot apply chat template to an empty conversation. Provide at least one message.",
        "apply_chat_template", 0, 0);
  }
  std::vector<std::pair<std::string, jinja::Value>> context;
  auto put = [&context](const std::string& k, jinja::Value v) {
    for (auto& [name, value] : context) {
      if (name == k) {
        value = std::move(v);
        return;
      }
    }
    context.emplace_back(k, std::move(v));
  };
  try {
    // note: the order transformers builds the render call in: special
    // tokens, then the caller's kwargs over them, then the named arguments.
    for (const auto& [k, v] : special_tokens) put(k, jinja::Value::from_json(v));
    for (const auto& [k, v] : request.kwargs) put(k, jinja::Value::from_json(v));
    put("messages", jinja::Value::from_json(request.messages));
    put("tools", jinja::Value::from_json(request.tools));
    put("documents", jinja::Value::from_json(request.documents));
    put("add_generation_prompt", jinja::Value::boolean(request.add_generation_prompt));
  } catch (const jinja::EvalError& e) {
    throw jinja::TemplateError(e.kind, e.message, "request", 0, 0);
  }
  return tmpl.render(context);
}

std::string describe_template_error(const jinja::TemplateError& e) {
  std::string s = fmt::format("chat template: {}", e.python_form());
  if (e.line() > 0) s += fmt::format(" ({} line {} column {})", e.source(), e.line(), e.column());
  return s;
}

}  // namespace qtk::chat
