// compare EXPECTED ACTUAL [--near-tie 1e-3] [--only-present] [--verbose]
// Exit 0 when no case diverged for real and none is missing or failed.
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <cxxopts.hpp>

#include "core/error.h"
#include "core/plural.h"
#include "core/stdout_check.h"
#include "loaders/cli_args.h"
#include "runtime/compare.h"

int main(int argc, char** argv) {
  qtk::ignore_file_size_signal();
  try {
    cxxopts::Options opts("compare",
                          "Compare generate results against expected results (JSONL or a fixtures "
                          "golden.json), matching cases by id. Exit status: 0 when every case is "
                          "identical or a near-tie, 1 when one diverged, is missing, has an error "
                          "line in one file only (or other errors in the two), or another prompt, "
                          "on bad input, and when the report cannot be written to stdout.");
    opts.add_options()("expected", "expected results (JSONL, or golden.json with \"cases\")",
                       cxxopts::value<std::string>())("actual", "actual results (generate's JSONL)",
                                                      cxxopts::value<std::string>())(
        "near-tie",
        "a divergence at or after a step whose expected top1_margin is below this is a near-tie",
        cxxopts::value<std::string>()->default_value("1e-3"))(
        "only-present",
        "compare only the expected cases whose id is in ACTUAL (e.g. a run over part of a golden "
        "file's prompts); the others are counted as skipped, not missing")(
        "v,verbose", "also list identical cases")("h,help", "show this help");
    opts.parse_positional({"expected", "actual"});
    opts.positional_help("EXPECTED ACTUAL");
    auto args = qtk::cli::parse_flags(opts, argc, argv);
    if (args.count("help")) {
      qtk::write_stdout(opts.help());
      qtk::finish_stdout();
      return 0;
    }
    if (!args.count("expected") || !args.count("actual")) {
      throw qtk::Error("expected two files: EXPECTED ACTUAL (see --help)");
    }
    qtk::cli::no_extra_arguments(args);
    // note: 0 turns near-ties off (no margin is below it).
    const double thr =
        qtk::cli::parse_real_flag("--near-tie", args["near-tie"].as<std::string>(), 0.0,
                                  std::numeric_limits<double>::max(), "a non-negative number");
    const auto expected = qtk::read_compare_file(args["expected"].as<std::string>());
    const auto actual = qtk::read_compare_file(args["actual"].as<std::string>());
    // note: two empty files would otherwise compare "OK" with nothing checked.
    if (expected.empty()) {
      throw qtk::Error(fmt::format("{}: expected at least one case, found none (an empty file?)",
                                   args["expected"].as<std::string>()));
    }
    const bool only_present = args.count("only-present") > 0;
    const auto rep = qtk::compare_cases(expected, actual, thr, only_present);
    // note: with nothing in common every case would be skipped and the run
    // would pass having checked nothing.
    if (only_present && rep.cases.empty()) {
      throw qtk::Error(fmt::format(
          "--only-present: expected at least one id of {} in {}, found none ({} expected ids, "
          "first {}; {} actual ids, first {})",
          args["expected"].as<std::string>(), args["actual"].as<std::string>(), expected.size(),
          expected.front().id, actual.size(), actual.empty() ? "none" : actual.front().id));
    }
    const bool verbose = args.count("verbose") > 0;
    // note: the report is built here, written with write_stdout() and
    // checked once: fmt::print would throw its own "cannot write to file"
    // halfway through, or leave a buffered report to be lost at exit.
    std::string report;
    auto out = std::back_inserter(report);
    for (const auto& c : rep.cases) {
      if (c.verdict == qtk::CaseVerdict::kIdentical && !verbose) continue;
      fmt::format_to(out, "{}: {}\n", c.id, c.detail);
    }
    if (!rep.extra_ids.empty()) {
      fmt::format_to(out, "note: {} case(s) only in the actual file (ignored), first: {}\n",
                     rep.extra_ids.size(), rep.extra_ids.front());
    }
    // note: "with another prompt" only when some case has one, so the
    // usual summary line keeps its form.
    fmt::format_to(
        out,
        "compare: {}: {} identical, {} near-tie, {} diverged, {} missing, {}{}{} -> "
        "{}\n",
        qtk::count_of(static_cast<int64_t>(rep.cases.size()), "case"), rep.identical, rep.near_tie,
        rep.diverged, rep.missing, qtk::count_of(rep.errors, "error"),
        rep.other_prompt ? fmt::format(", {} with another prompt", rep.other_prompt) : "",
        only_present ? fmt::format(", {} skipped", rep.skipped) : "", rep.ok() ? "OK" : "FAIL");
    qtk::write_stdout(report);
    // note: a report that did not reach stdout is a failure whatever it says.
    qtk::finish_stdout();
    return rep.ok() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare: %s\n", e.what());
    return 1;
  }
}
