// The Jinja renderer on small templates: semantics the chat templates
// rely on, with expectations from jinja2 3.1 / Python behaviour.
#include <gtest/gtest.h>

#include "tokenizer/chat/jinja_template.h"

namespace qtk::jinja {
namespace {

std::string render(const std::string& src, std::vector<std::pair<std::string, Value>> ctx = {}) {
  return Template::parse(src, "t").render(ctx);
}

TEST(Jinja, Text) { EXPECT_EQ(render("hello"), "hello"); }

}  // namespace
}  // namespace qtk::jinja
