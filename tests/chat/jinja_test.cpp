// The Jinja renderer against jinja2 itself: tests/chat/jinja_cases.jsonl
// holds small templates rendered by jinja2 3.1.6 in transformers' chat
// environment (made by make_jinja_cases.py). Every case must render to the
// same text, or fail with the same exception (and, for runtime errors, the
// same message; syntax error messages are worded differently).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat/jinja_template.h"

namespace qtk::jinja {
namespace {

using ojson = nlohmann::ordered_json;

std::vector<ojson> load_cases() {
  const std::string path = std::string(QTK_SOURCE_DIR) + "/tests/chat/jinja_cases.jsonl";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<ojson> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(ojson::parse(line));
  return rows;
}

std::vector<std::pair<std::string, Value>> context_of(const ojson& j) {
  std::vector<std::pair<std::string, Value>> ctx;
  for (const auto& [k, v] : j.items()) ctx.emplace_back(k, Value::from_json(v));
  return ctx;
}

TEST(Jinja, MatchesJinja2OnEveryCase) {
  const std::vector<ojson> cases = load_cases();
  ASSERT_GE(cases.size(), 70u);
  int texts = 0, errors = 0;
  for (const ojson& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE("case " + name + ": " + c["template"].get<std::string>());
    std::string text;
    try {
      text =
          Template::parse(c["template"].get<std::string>(), name).render(context_of(c["context"]));
    } catch (const TemplateError& e) {
      if (!c.contains("error")) {
        ADD_FAILURE() << "failed: " << e.what();
        continue;
      }
      ++errors;
      const std::string expected = c["error"].get<std::string>();
      if (e.kind() == "TemplateSyntaxError" || e.kind() == "TemplateAssertionError") {
        EXPECT_EQ(expected.substr(0, expected.find(':')), e.kind()) << e.what();
      } else {
        EXPECT_EQ(e.python_form(), expected) << e.what();
      }
      continue;
    }
    if (c.contains("error")) {
      ADD_FAILURE() << "rendered although jinja2 failed with " << c["error"] << "; got " << text;
      continue;
    }
    ++texts;
    EXPECT_EQ(text, c["text"].get<std::string>());
  }
  std::printf("[ %d renderings and %d failures compared with jinja2 ]\n", texts, errors);
}

}  // namespace
}  // namespace qtk::jinja
