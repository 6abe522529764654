// Every (template, case) of tests/data/chat/reference.jsonl, rendered by
// transformers 5.17 + jinja2 3.1.6: our rendering must equal `text` and
// tokenize to `ids`, or fail where transformers failed with the same
// exception and message.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat/chat_request.h"
#include "tokenizer/tokenizer.h"

namespace qtk {
namespace {

using ojson = nlohmann::ordered_json;

std::string data_path(const std::string& rel) { return std::string(QTK_SOURCE_DIR) + "/" + rel; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer t =
      Tokenizer::from_file(data_path("tests/data/tokenizer/qwen3/tokenizer.json"));
  return t;
}

struct Fixtures {
  std::map<std::string, ojson> cases;
  std::vector<ojson> reference;
  std::map<std::string, jinja::Template> templates;
};

const Fixtures& fixtures() {
  static const Fixtures f = [] {
    Fixtures f;
    for (auto& c : ojson::parse(read_text(data_path("tests/data/chat/cases.json"))))
      f.cases[c["id"].get<std::string>()] = c;
    std::istringstream lines(read_text(data_path("tests/data/chat/reference.jsonl")));
    std::string line;
    while (std::getline(lines, line))
      if (!line.empty()) f.reference.push_back(ojson::parse(line));
    for (const char* name : {"qwen3", "qwen3_5", "qwen3_thinking_2507"}) {
      const std::string file = data_path(std::string("tests/data/chat/") + name + ".jinja");
      f.templates.emplace(name, jinja::Template::parse(read_text(file), file));
    }
    return f;
  }();
  return f;
}

TEST(ChatReference, FixturesCoverEveryTemplateAndCase) {
  const Fixtures& f = fixtures();
  EXPECT_EQ(f.cases.size(), 39u);
  EXPECT_EQ(f.reference.size(), f.cases.size() * f.templates.size());
}

// One test per template so that a failure names it.
void check_template(const std::string& name) {
  const Fixtures& f = fixtures();
  const jinja::Template& tmpl = f.templates.at(name);
  int checked = 0, texts = 0, errors = 0;
  for (const ojson& ref : f.reference) {
    if (ref["template"] != name) continue;
    const std::string id = ref["id"].get<std::string>();
    SCOPED_TRACE("template " + name + ", case " + id);
    ASSERT_TRUE(f.cases.count(id)) << "reference names an unknown case";
    chat::ChatRequest req;
    ASSERT_EQ(chat::read_chat_request(f.cases.at(id), req), "");
    ++checked;
    if (ref.contains("error")) {
      ++errors;
      try {
        const std::string text = chat::render_chat(tmpl, req);
        ADD_FAILURE() << "rendered although transformers failed with " << ref["error"]
                      << "; we rendered: " << text;
      } catch (const jinja::TemplateError& e) {
        EXPECT_EQ(e.python_form(), ref["error"].get<std::string>()) << e.what();
        if (ref["error_kind"] == "raise_exception") {
          EXPECT_EQ(e.kind(), "TemplateError");
        }
      }
      continue;
    }
    ++texts;
    std::string text;
    try {
      text = chat::render_chat(tmpl, req);
    } catch (const jinja::TemplateError& e) {
      ADD_FAILURE() << "render failed: " << e.what();
      continue;
    }
    EXPECT_EQ(text, ref["text"].get<std::string>());
    const std::vector<int32_t> ids = qwen3_tokenizer().encode(text);
    EXPECT_EQ(ids, ref["ids"].get<std::vector<int32_t>>());
  }
  EXPECT_EQ(checked, 39);
  std::printf("[ template %s: %d cases, %d renderings, %d expected failures ]\n", name.c_str(),
              checked, texts, errors);
}

TEST(ChatReference, Qwen3) { check_template("qwen3"); }
TEST(ChatReference, Qwen3_5) { check_template("qwen3_5"); }
TEST(ChatReference, Qwen3Thinking2507) { check_template("qwen3_thinking_2507"); }

}  // namespace
}  // namespace qtk
