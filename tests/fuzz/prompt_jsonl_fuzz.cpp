// Fuzz entry: one line of generate's --batch input (runtime/prompt_jsonl.h).
// parse_prompt_line never throws; a line it accepts must satisfy what the
// scheduler relies on, and the output line built for it must be valid JSON.
#include <nlohmann/json.hpp>

#include "runtime/prompt_jsonl.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace qtk::fuzz {

namespace {

const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer tok =
      Tokenizer::from_file(std::string(QTK_SOURCE_DIR) + "/tests/data/tokenizer/qwen3/tokenizer.json");
  return tok;
}

void check_line(std::string_view text, const PromptDefaults& d) {
  const PromptLine line = parse_prompt_line(text, 7, d);
  fuzz_check(line.line_no == 7, "line number not kept");
  fuzz_check(line.id.is_string() || line.id.is_number_integer(), "id is neither string nor integer");
  std::string out;
  if (!line.error.empty()) {
    out = error_line(line.id, line.error);
  } else {
    const SequenceRequest& r = line.request;
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    fuzz_check(n >= 1, "empty prompt accepted");
    fuzz_check(n + 1 <= d.max_context, "prompt over the context accepted");
    for (int32_t id : r.prompt) fuzz_check(id >= 0 && id < d.vocab_size, "prompt id out of range");
    for (int32_t id : r.stop_ids) fuzz_check(id >= 0 && id < d.vocab_size, "stop id out of range");
    fuzz_check(r.max_tokens >= 1, "max_tokens < 1 accepted");
    fuzz_check(r.mrope_positions.empty() || static_cast<int64_t>(r.mrope_positions.size()) == 3 * n,
               "mrope positions of the wrong size");
    fuzz_check(d.allow_mrope || r.mrope_positions.empty(), "mrope positions for a non-M-RoPE model");
    for (int32_t p : r.mrope_positions) fuzz_check(p >= 0 && p < d.max_context, "mrope position out of range");
    const std::string decoded = "x";
    const std::vector<float> margins = {1.5f};
    out = result_line(line.id, r.prompt, r.prompt, false, &decoded, &margins);
  }
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(out);
  } catch (const nlohmann::json::exception&) {
    fuzz_check_failed("output line is not valid JSON: " + out.substr(0, 200));
  }
  fuzz_check(parsed.is_object() && parsed["id"] == line.id, "output line does not carry the id");
}

}  // namespace

int prompt_jsonl(const uint8_t* data, size_t size) {
  const std::string_view text = as_text(data, size);
  // A pack with the Qwen3 tokenizer and a model vocabulary smaller than the
  // tokenizer's (so text prompts can produce ids the model lacks), M-RoPE on.
  PromptDefaults with_tok;
  with_tok.max_tokens = 16;
  with_tok.eos_ids = {0, 2};
  with_tok.vocab_size = 1000;
  with_tok.max_context = 64;
  with_tok.allow_mrope = true;
  with_tok.tokenizer = &qwen3_tokenizer();
  check_line(text, with_tok);
  // A pack without a tokenizer.
  PromptDefaults bare;
  bare.max_tokens = 3;
  bare.ignore_eos = true;
  bare.vocab_size = 512;
  bare.max_context = 8;
  check_line(text, bare);
  return 0;
}

}  // namespace qtk::fuzz
