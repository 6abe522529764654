// One line of generate's --batch input, parsed and validated. A bad line is
// not an exception: it carries an error message that becomes that line's
// {"id", "error"} output, and the other lines still run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/scheduler.h"

namespace qtk {

class Tokenizer;

struct PromptDefaults {
  int64_t max_tokens = 256;
  bool ignore_eos = false;
  std::vector<int32_t> eos_ids;          // the model's EOS ids (stop unless ignore_eos)
  int64_t vocab_size = 0;                // valid token ids are [0, vocab_size)
  int64_t max_context = 0;               // prompt + 1 must fit
  bool allow_mrope = false;              // the model uses M-RoPE positions
  bool allow_unknown_fields = false;     // ignore fields not in kRequestFields (else an error)
  const Tokenizer* tokenizer = nullptr;  // for "prompt"; nullptr: pack has none
};

struct PromptLine {
  int64_t line_no = 0;                      // 1-based
  nlohmann::json id;                        // as given, or the line number
  std::string error;                        // non-empty: the line is rejected
  std::vector<std::string> ignored_fields;  // unknown fields (with allow_unknown_fields)
  SequenceRequest request;
};

// Parses line `line_no` (1-based) of `source`. Never throws for bad content.
PromptLine parse_prompt_line(std::string_view text, int64_t line_no, const PromptDefaults& d);

// The output lines (without the trailing newline).
std::string result_line(const nlohmann::json& id, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, bool stopped, const std::string* text,
                        const std::vector<float>* margins);
// Appends "logprobs": [[[id, logprob] x k] per step] before the closing '}'
// of a result line (generate --logprobs K).
void append_logprobs(std::string& line, const std::vector<int32_t>& ids,
                     const std::vector<float>& logprobs, int k);
std::string error_line(const nlohmann::json& id, const std::string& error);

}  // namespace qtk
