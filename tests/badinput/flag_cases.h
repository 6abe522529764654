// Shared by the bad-flag cases (flag_cases_test.cpp,
// flag_runtime_cases_test.cpp): one case is a list of extra arguments and
// the words its error line must contain.
#pragma once

#include <string>
#include <vector>

#include "tests/badinput/run_util.h"

namespace qtk::testing {

struct FlagCase {
  std::vector<std::string> flags;    // appended to an otherwise valid command line
  std::vector<std::string> needles;  // each must appear in the stderr line

  std::string describe() const {
    std::string s = "flags:";
    for (const std::string& f : flags) s += " [" + f + "]";
    return s;
  }
};

// The CLI contract for a bad flag: exit 1, one stderr line "<program>: ..."
// holding every needle, and nothing on stdout (no partial output).
inline void expect_flag_failure(const RunResult& r, const std::string& program_name,
                                const std::vector<std::string>& needles) {
  expect_clean_failure(r, program_name, needles);
  EXPECT_EQ(r.out, "") << program_name << " wrote to stdout";
}

}  // namespace qtk::testing
