// Hostile or broken templates (they come from checkpoints) end with a
// clear error naming the place, never a hang, a crash or a silent render.
#include <gtest/gtest.h>

#include <string>

#include "tokenizer/chat/jinja_template.h"

namespace qtk::jinja {
namespace {

// Renders `src` and returns the error it raised ("" when none).
TemplateError render_error(const std::string& src, const RenderLimits& limits = {}) {
  try {
    Template::parse(src, "t.jinja").render({}, limits);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "rendered without error: " << src.substr(0, 200);
  return TemplateError("none", "", "", 0, 0);
}

TEST(JinjaLimits, RecursiveMacro) {
  const TemplateError e = render_error("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}");
  EXPECT_EQ(e.kind(), "LimitError") << e.what();
}

TEST(JinjaLimits, LoopIterations) {
  const TemplateError e = render_error(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(e.kind(), "LimitError") << e.what();
  EXPECT_EQ(e.line(), 1);
}

TEST(JinjaLimits, StringDoubling) {
  const TemplateError e = render_error(
      "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}");
  EXPECT_EQ(e.kind(), "LimitError") << e.what();
}

TEST(JinjaLimits, NestedListsBuiltInALoop) {
  const TemplateError e = render_error(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}{{ ns.x }}");
  EXPECT_EQ(e.kind(), "LimitError") << e.what();
}

// A list holding the same list twice, 40 levels deep: a few hundred bytes
// of values, 2^40 leaves when printed. |string, |tojson and printing it stop
// at the string cap as the text grows (|string had no cap, |tojson checked
// only the finished text: minutes and gigabytes before the error).
TEST(JinjaLimits, SharedListsUnfoldedByStringAndTojson) {
  const std::string build =
      "{% set ns = namespace(s=[1]) %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s] %}"
      "{% endfor %}";
  for (const char* use :
       {"{{ ns.s|string|length }}", "{{ ns.s|tojson|length }}",
        "{{ ns.s|tojson(indent=2)|length }}", "{{ ns.s }}", "{{ {'a': ns.s}|string|length }}"}) {
    const TemplateError e = render_error(build + use);
    EXPECT_EQ(e.kind(), "LimitError") << use << ": " << e.what();
  }
}

TEST(JinjaLimits, OutputSize) {
  RenderLimits small;
  small.max_output_bytes = 1000;
  const TemplateError e = render_error("{% for i in range(1000) %}abcdef{% endfor %}", small);
  EXPECT_EQ(e.kind(), "LimitError") << e.what();
}

TEST(JinjaLimits, DeepExpressionNesting) {
  const TemplateError e =
      render_error("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}");
  EXPECT_EQ(e.kind(), "TemplateSyntaxError") << e.what();
}

TEST(JinjaLimits, DeepTagNesting) {
  std::string src;
  for (int i = 0; i < 10000; ++i) src += "{% if true %}";
  const TemplateError e = render_error(src);
  EXPECT_EQ(e.kind(), "TemplateSyntaxError") << e.what();
}

TEST(JinjaLimits, LongNotAndMinusChains) {
  EXPECT_EQ(render_error("{{ " + std::string(100000, '-') + "1 }}").kind(), "TemplateSyntaxError");
  std::string nots;
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_EQ(render_error("{{ " + nots + "1 }}").kind(), "TemplateSyntaxError");
}

TEST(JinjaErrors, UnknownTagNamesLineAndColumn) {
  const TemplateError e = render_error("line one\n  {{ 1 }} {% frobnicate %}");
  EXPECT_EQ(e.kind(), "TemplateSyntaxError");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.column(), 14);  // the tag name
  EXPECT_NE(std::string(e.what()).find("frobnicate"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("t.jinja line 2 column 14"), std::string::npos) << e.what();
}

TEST(JinjaErrors, UnsupportedConstructsAreRefused) {
  for (const char* src :
       {"{% for x in l recursive %}{% endfor %}", "{% with a = 1 %}{% endwith %}",
        "{% include 'x' %}", "{{ x|nosuch }}", "{{ x is nosuch }}", "{% extends 'base' %}",
        "{{ f(*args) }}", "{{ 'a'.zfill(3) }}", "{{ {}.update }}", "{{ 'x'|escape }}"}) {
    SCOPED_TRACE(src);
    const TemplateError e = render_error(src);
    EXPECT_NE(e.kind(), "none");
  }
}

TEST(JinjaErrors, RuntimeErrorNamesTheExpression) {
  const TemplateError e = render_error("a\nb {{ 1 + 'x' }}");
  EXPECT_EQ(e.kind(), "TypeError");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.column(), 8);  // the operator
}

}  // namespace
}  // namespace qtk::jinja
