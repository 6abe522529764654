// Golden-file comparison (the `compare` program): matches expected and actual
// results by id and classifies each case by the fixtures rule — tokens must
// agree exactly up to the first step whose expected top-1 margin is below
// the near-tie threshold; from there on a divergence is a near-tie.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qtk {

struct CompareCase {
  std::string id;               // JSON text of the id ("\"len1\"", "3")
  std::vector<int32_t> prompt;  // prompt_token_ids, when the line has them
  bool has_prompt = false;
  std::vector<int32_t> tokens;
  std::vector<double> margins;  // may be empty (no margins recorded)
  std::string error;            // an {"id","error"} line in the results
};

// Reads generate's results (JSONL) or a fixtures golden.json ({"cases": [...]}).
// Throws qtk::Error naming the file and line for malformed content.
std::vector<CompareCase> read_compare_file(const std::string& path);

// kOtherPrompt: both files give the id's prompt_token_ids and they differ,
// so its tokens are not comparable. kError: an error line for the id in
// ACTUAL, or in EXPECTED (then there are no expected tokens).
enum class CaseVerdict { kIdentical, kNearTie, kDiverged, kMissing, kError, kOtherPrompt };

struct CaseReport {
  std::string id;
  CaseVerdict verdict = CaseVerdict::kIdentical;
  int64_t step = -1;           // first differing step (diverged / near-tie)
  int64_t near_tie_step = -1;  // first step with expected margin < threshold
  std::string detail;          // one short human-readable line
};

struct CompareReport {
  std::vector<CaseReport> cases;       // in the expected file's order
  std::vector<std::string> extra_ids;  // ids only in the actual file
  int64_t identical = 0, near_tie = 0, diverged = 0, missing = 0, errors = 0;
  int64_t other_prompt = 0;
  int64_t skipped = 0;  // expected cases left out by only_present
  bool ok() const { return diverged == 0 && missing == 0 && errors == 0 && other_prompt == 0; }
};

// only_present: an expected case whose id is not in `actual` is skipped
// (counted in `skipped`, not reported) instead of being missing. An id with
// a result and error lines (generate's answer to a reused id) is compared
// by its result; each id is reported once.
CompareReport compare_cases(const std::vector<CompareCase>& expected,
                            const std::vector<CompareCase>& actual, double near_tie,
                            bool only_present = false);

}  // namespace qtk
