// --resume's checks: an interrupted run is continued only with the same
// pack, the same results-changing settings and the same prompts file (a
// digest of every input line is kept in the run header).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tuning.h"
#include "runtime/prompt_jsonl.h"
#include "runtime/results_file.h"

namespace qtk {

// XXH64 of every input line, as one string of 16 hex digits per line (the
// run header's "input_line_xxh64").
std::string input_line_digests(const std::vector<std::string_view>& lines);

// The run header's "tuning": every QTK_* switch of `t` by name (numbers and
// 0/1 switches as integers), QTK_CPU_PATH as the path used (the best this
// CPU has when the switch is unset).
nlohmann::json tuning_header(const Tuning& t);

// The first switch of tuning_header that changes tokens or margins on the
// device of `meta`'s settings and differs between the two run headers (a
// header without a switch, from an older qtk, counts as that build's value);
// an empty name where none does. --resume and merge refuse such a pair.
struct TuningDifference {
  std::string name;
  nlohmann::json was, now;
};
TuningDifference result_tuning_difference(const nlohmann::json& old, const nlohmann::json& meta);

struct ResumePoint {
  size_t lines_done = 0;        // result lines already there
  uint64_t keep_bytes = 0;      // their bytes (a partial last line is dropped)
  int64_t run_error_lines = 0;  // of them, error lines the run gave (non-finite logits)
  // The kept result lines' prompt and output tokens (from their records).
  int64_t kept_prompt_tokens = 0, kept_generated_tokens = 0;
  // The header being resumed and those it resumed, oldest first, each as
  // {"status", "settings", "stats"} (and "error" where it has one).
  nlohmann::json earlier = nlohmann::json::array();
};

// Checks that `source` (an interrupted or complete run) was made from the
// same pack, settings, result-changing tuning switches (core/tuning.h) and
// prompts as the run header `meta` describes, and that its lines are the
// results of the first input lines. Throws qtk::Error naming what differs.
ResumePoint check_resume(const ResumeSource& source, const nlohmann::json& meta,
                         const std::vector<PromptLine>& lines, const std::string& batch_path,
                         int64_t vocab_size);

// Splits into lines; a final line without '\n' counts, a final empty one does not.
std::vector<std::string_view> split_lines(std::string_view text);

}  // namespace qtk
