// Reading the chat fields of a request line, and where the template comes
// from; renderings compared with tests/data/chat/reference.jsonl.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/chat/chat_request.h"

namespace qtk::chat {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_text(const std::string& rel) {
  std::ifstream in(std::string(QTK_SOURCE_DIR) + "/" + rel, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ojson reference(const std::string& tmpl, const std::string& id) {
  std::istringstream in(read_text("tests/data/chat/reference.jsonl"));
  for (std::string line; std::getline(in, line);) {
    ojson r = ojson::parse(line);
    if (r["template"] == tmpl && r["id"] == id) return r;
  }
  throw std::runtime_error("no reference " + tmpl + " " + id);
}

ojson case_of(const std::string& id) {
  for (auto& c : ojson::parse(read_text("tests/data/chat/cases.json")))
    if (c["id"] == id) return c;
  throw std::runtime_error("no case " + id);
}

std::string render(const std::string& tmpl_name, const ojson& line) {
  const jinja::Template t =
      jinja::Template::parse(read_text("tests/data/chat/" + tmpl_name + ".jinja"), tmpl_name);
  ChatRequest req;
  const std::string err = read_chat_request(line, req);
  if (!err.empty()) throw std::runtime_error(err);
  return render_chat(t, req);
}

TEST(ChatRequest, ChatTemplateKwargsOverrideTopLevelOnes) {
  ojson line = case_of("multi_turn_think_off");
  ASSERT_EQ(line["enable_thinking"], false);
  line["enable_thinking"] = true;
  line["chat_template_kwargs"] = {{"enable_thinking", false}};
  EXPECT_EQ(render("qwen3", line), reference("qwen3", "multi_turn_think_off")["text"]);
  // and with only chat_template_kwargs
  line.erase("enable_thinking");
  EXPECT_EQ(render("qwen3_5", line), reference("qwen3_5", "multi_turn_think_off")["text"]);
}

TEST(ChatRequest, AddGenerationPromptDefaultsToTrue) {
  ojson with = case_of("user_single");
  ASSERT_EQ(with["add_generation_prompt"], true);
  with.erase("add_generation_prompt");
  EXPECT_EQ(render("qwen3", with), reference("qwen3", "user_single")["text"]);
}

TEST(ChatRequest, BadFieldsAreNamed) {
  const ojson msgs = ojson::array({{{"role", "user"}, {"content", "hi"}}});
  struct Bad {
    ojson line;
    const char* expected;
  };
  const std::vector<Bad> bad = {
      {{{"messages", "hi"}}, "field 'messages': expected an array"},
      {{{"messages", ojson::array({1})}}, "field 'messages'[0]: expected a message object"},
      // A message without a role would match no branch of a template and vanish.
      {{{"messages", ojson::array({{{"role", "user"}}, {{"content", "hi"}}})}},
       "field 'messages[1].role': missing; expected a string such as \"user\" or "
       "\"assistant\""},
      {{{"messages", ojson::array({{{"role", nullptr}, {"content", "hi"}}})}},
       "field 'messages[0].role': expected a string, found null"},
      {{{"messages", msgs}, {"tools", {{"a", 1}}}}, "field 'tools': expected an array"},
      {{{"messages", msgs}, {"tools", ojson::array({"x"})}}, "field 'tools'[0]"},
      {{{"messages", msgs}, {"documents", 3}}, "field 'documents'"},
      {{{"messages", msgs}, {"add_generation_prompt", 1}}, "field 'add_generation_prompt'"},
      {{{"messages", msgs}, {"continue_final_message", true}}, "continue_final_message"},
      {{{"messages", msgs}, {"chat_template_kwargs", ojson::array()}},
       "field 'chat_template_kwargs': expected an object"},
      {{{"messages", msgs}, {"chat_template_kwargs", {{"messages", ojson::array()}}}},
       "'chat_template_kwargs'.'messages'"},
  };
  for (const Bad& b : bad) {
    ChatRequest req;
    const std::string err = read_chat_request(b.line, req);
    EXPECT_NE(err.find(b.expected), std::string::npos) << b.line.dump() << " -> " << err;
  }
}

TEST(ChatRequest, TemplateSourceOrder) {
  const nlohmann::json config = {{"chat_template", "from config"}};
  EXPECT_EQ(template_from_config(&config, "c", std::nullopt), "from config");
  EXPECT_EQ(template_from_config(&config, "c", std::string("from file")), "from file");
  EXPECT_EQ(template_from_config(nullptr, "c", std::nullopt), std::nullopt);
  const nlohmann::json named = {
      {"chat_template",
       {{{"name", "tool_use"}, {"template", "t"}}, {{"name", "default"}, {"template", "d"}}}}};
  EXPECT_EQ(template_from_config(&named, "c", std::nullopt), "d");
  const nlohmann::json no_default = {{"chat_template", {{{"name", "x"}, {"template", "t"}}}}};
  EXPECT_THROW(template_from_config(&no_default, "c", std::nullopt), Error);
  const nlohmann::json wrong = {{"chat_template", 5}};
  EXPECT_THROW(template_from_config(&wrong, "c", std::nullopt), Error);
}

TEST(ChatRequest, SpecialTokensOfTheConfig) {
  const nlohmann::json config = {{"eos_token", "<|im_end|>"},
                                 {"bos_token", nullptr},
                                 {"pad_token", {{"content", "<|endoftext|>"}}}};
  const auto tokens = special_tokens_from_config(&config);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(tokens[0].first, "eos_token");
  EXPECT_EQ(tokens[0].second, "<|im_end|>");
  EXPECT_EQ(tokens[1].first, "pad_token");
  EXPECT_EQ(tokens[1].second, "<|endoftext|>");
  // and a template sees them
  const jinja::Template t = jinja::Template::parse("{{ eos_token }}|{{ bos_token is none }}", "t");
  ChatRequest req;
  ASSERT_EQ(read_chat_request({{"messages", ojson::array({{{"role", "user"}}})}}, req), "");
  EXPECT_EQ(render_chat(t, req, tokens), "<|im_end|>|False");
}

}  // namespace
}  // namespace qtk::chat
