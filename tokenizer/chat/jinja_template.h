// A Jinja template, parsed once and rendered with jinja2 3.1 semantics as
// transformers configures its environment (trim_blocks, lstrip_blocks,
// autoescape off, loopcontrols, raise_exception, tojson with
// ensure_ascii=False).
//
// Supported: text, {{ }}, {# #}, {% raw %}, whitespace control (- and +);
// tags if/elif/else, for (tuple targets, `if` filter, else; loop.index,
// index0, revindex, revindex0, first, last, length, previtem, nextitem),
// set (names, tuples, namespace attributes, block set), macro (defaults,
// output as a value, caller via {% call %}), break/continue, generation;
// literals, lists, tuples, dicts; arithmetic, ~, comparisons, in / not in,
// and/or/not, inline if, attribute and item access, slices, negative
// indexes; the filters and tests listed in jinja_builtins.cpp; str methods
// (startswith endswith split strip lstrip rstrip replace upper lower ...),
// dict methods (items keys values get); globals namespace(),
// raise_exception(), range(). Anything else is a TemplateSyntaxError or a
// runtime TemplateError naming the line and column; never a silent
// approximation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/chat/jinja_error.h"
#include "tokenizer/chat/jinja_value.h"

namespace qtk::jinja {

struct Node;

// note: a template comes from a checkpoint, i.e. from anyone; these caps
// keep a hostile or broken one from hanging or exhausting the process.
struct RenderLimits {
  size_t max_output_bytes = 16u << 20;    // the rendered text
  int64_t max_loop_iterations = 1000000;  // all loops of one render together
  int64_t max_steps = 20000000;           // expression evaluations
  int max_depth = 400;                    // nested evaluation (macro calls included)
};

class Template {
 public:
  // Throws TemplateError (TemplateSyntaxError) naming `source`, the line
  // and the column.
  static Template parse(std::string_view text, std::string source);

  // Renders with `context` as the template's variables. Throws
  // TemplateError: kind "TemplateError" for raise_exception(msg) (message
  // = msg), Python's exception names for runtime errors, "LimitError" when
  // a RenderLimits cap is reached.
  std::string render(const std::vector<std::pair<std::string, Value>>& context,
                     const RenderLimits& limits = {}) const;

  const std::string& source() const { return source_; }

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> body_;
  std::string source_;
};

}  // namespace qtk::jinja
