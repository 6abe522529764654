// One line of generate's --batch input, parsed and validated. A bad line is
// not an exception: it carries an error message that becomes that line's
// {"id", "error"} output, and the other lines still run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/utf8.h"  // without_byte_order_mark
#include "runtime/scheduler.h"

namespace qtk {

class Tokenizer;
namespace jinja {
class Template;
}

struct PromptDefaults {
  int64_t max_tokens = 256;
  bool ignore_eos = false;
  std::vector<int32_t> eos_ids;          // the model's EOS ids (stop unless ignore_eos)
  int64_t vocab_size = 0;                // valid token ids are [0, vocab_size)
  int64_t max_context = 0;               // prompt + 1 must fit
  bool allow_mrope = false;              // the model uses M-RoPE positions
  bool allow_unknown_fields = false;     // ignore fields not in kRequestFields (else an error)
  const Tokenizer* tokenizer = nullptr;  // for "prompt"; nullptr: pack has none
  // For "messages" (chat requests): the chat template, or nullptr and why
  // there is none (the pack has no template, or it does not parse).
  const jinja::Template* chat_template = nullptr;
  std::string chat_template_missing;
  std::vector<std::pair<std::string, nlohmann::ordered_json>> chat_special_tokens;
};

struct PromptLine {
  int64_t line_no = 0;      // 1-based
  nlohmann::json id;        // as given, or the line number
  bool id_given = false;    // the line's own "id" (else the line number stands for it)
  std::string error;        // non-empty: the line is rejected
  std::string chat_prompt;  // a "messages" line: the rendered text (the output's "prompt")
  bool is_chat = false;
  std::vector<std::string> ignored_fields;  // unknown fields (with allow_unknown_fields)
  SequenceRequest request;
};

// What read_input_text accepts besides a regular file.
enum class InputFile {
  kAny,          // also a pipe, a FIFO, a terminal, stdin ("-"): the prompts
  kRegularOnly,  // a regular file only (the chat template)
};

// The whole text of `path` ("-": stdin) for `what` ("the batch file"). A
// pipe, FIFO or terminal is waited on in core/interrupt.h's
// wait_for_input, so that a SIGINT/SIGTERM/SIGHUP stops a run still waiting
// for its input: that throws qtk::Error("PATH: interrupted by SIGINT while
// reading WHAT; nothing was written"). Throws qtk::Error naming the file for
// a directory, a file that cannot be read, and with kRegularOnly for anything
// but a regular file.
std::string read_input_text(const std::string& path, const char* what,
                            InputFile accept = InputFile::kAny);

// True when the text of `path` can be read only once: stdin ("-"), a pipe,
// a FIFO, a terminal or another device, a socket.
bool reads_once(const std::string& path);

// Parses line `line_no` (1-based) of `source`. Never throws for bad content.
PromptLine parse_prompt_line(std::string_view text, int64_t line_no, const PromptDefaults& d);

// The output lines (without the trailing newline). `prompt_text`, when
// given (chat requests), is written as "prompt" after the id.
std::string result_line(const nlohmann::json& id, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, bool stopped, const std::string* text,
                        const std::vector<float>* margins,
                        const std::string* prompt_text = nullptr);
// Appends "logprobs": [[[id, logprob] x k] per step] before the closing '}'
// of a result line (generate --logprobs K).
void append_logprobs(std::string& line, const std::vector<int32_t>& ids,
                     const std::vector<float>& logprobs, int k);
std::string error_line(const nlohmann::json& id, const std::string& error);

}  // namespace qtk
