// The compare program: identical / diverged / near-tie / missing / error,
// its exit status, and fixtures golden.json accepted as EXPECTED.
#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

std::string line(const std::string& id, const std::vector<int>& toks,
                 const std::vector<double>& margins = {}) {
  nlohmann::json j = {{"id", id}, {"output_token_ids", toks}};
  if (!margins.empty()) j["top1_margin"] = margins;
  return j.dump() + "\n";
}

RunResult compare(const std::string& expected, const std::string& actual,
                  const std::string& flags = "") {
  static int n = 0;
  const std::string e = fmt::format("{}/cmp{}.expected.jsonl", work_dir(), n);
  const std::string a = fmt::format("{}/cmp{}.actual.jsonl", work_dir(), n++);
  write_text(e, expected);
  write_text(a, actual);
  return run(fmt::format("{} {} {} {}", QTK_COMPARE_BIN, e, a, flags));
}

TEST(Compare, IdenticalExitsZero) {
  RunResult r = compare(line("a", {1, 2, 3}, {1, 1, 1}) + line("b", {4}, {1}),
                        line("b", {4}) + line("a", {1, 2, 3}));  // order does not matter
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("2 identical"), std::string::npos) << r.out;
}

TEST(Compare, RealDivergenceFails) {
  RunResult r = compare(line("a", {1, 2, 3, 4}, {1, 1, 1, 1}), line("a", {1, 2, 9, 4}));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("\"a\": DIVERGED at step 2: expected 3, got 9"), std::string::npos) << r.out;
}

TEST(Compare, DivergenceAfterNearTieIsNotAFailure) {
  // Margin below 1e-3 at step 1; divergence at step 2.
  RunResult r = compare(line("a", {1, 2, 3, 4}, {1, 5e-4, 1, 1}), line("a", {1, 2, 7, 8}));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("near-tie: diverged at step 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("near-tie at step 1"), std::string::npos) << r.out;
  // A stricter threshold makes the same case a real divergence.
  RunResult s =
      compare(line("a", {1, 2, 3, 4}, {1, 5e-4, 1, 1}), line("a", {1, 2, 7, 8}), "--near-tie 1e-4");
  EXPECT_EQ(s.status, 1) << s.out;
}

TEST(Compare, NearTieAfterTheDivergenceDoesNotExcuseIt) {
  RunResult r = compare(line("a", {1, 2, 3, 4}, {1, 1, 1, 1e-5}), line("a", {1, 9, 3, 4}));
  EXPECT_EQ(r.status, 1) << r.out;
}

TEST(Compare, MissingAndErrorCasesFail) {
  RunResult m = compare(line("a", {1}) + line("b", {2}), line("a", {1}));
  EXPECT_EQ(m.status, 1);
  EXPECT_NE(m.out.find("\"b\": missing"), std::string::npos) << m.out;
  RunResult e = compare(line("a", {1}), "{\"id\": \"a\", \"error\": \"empty prompt\"}\n");
  EXPECT_EQ(e.status, 1);
  EXPECT_NE(e.out.find("error: empty prompt"), std::string::npos) << e.out;
}

// An error line in EXPECTED has no tokens to compare: an error naming the
// expected file, not "expected 0 tokens". An id's error line before its
// result (a reused id) does not hide the result, and the id counts once.
TEST(Compare, ErrorLineInExpectedIsAnErrorNotADivergence) {
  const std::string err_line = "{\"id\": \"a\", \"error\": \"prompt too long\"}\n";
  RunResult r = compare(err_line + line("b", {2}), line("a", {1}) + line("b", {2}));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("\"a\": error in the expected file (no expected tokens), a result in the "
                       "actual one: prompt too long"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("expected 0 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compare: 2 cases: 1 identical, 0 near-tie, 0 diverged, 0 missing, 1 error"),
            std::string::npos)
      << r.out;
  const std::string reused = "{\"id\": \"a\", \"error\": \"id reused\"}\n";
  RunResult ok = compare(reused + line("a", {1}), reused + line("a", {1}) + reused);
  EXPECT_EQ(ok.status, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("compare: 1 case: 1 identical"), std::string::npos) << ok.out;
  // A golden file with an error line passes against itself: the same error
  // line is the same outcome; another error is not.
  const std::string golden = err_line + line("b", {2});
  RunResult self = compare(golden, golden);
  EXPECT_EQ(self.status, 0) << self.out;
  EXPECT_NE(self.out.find("compare: 2 cases: 2 identical"), std::string::npos) << self.out;
  RunResult other =
      compare(golden, "{\"id\": \"a\", \"error\": \"unknown token id 7\"}\n" + line("b", {2}));
  EXPECT_EQ(other.status, 1) << other.out;
  EXPECT_NE(other.out.find("\"a\": error lines differ: expected \"prompt too long\", got "
                           "\"unknown token id 7\""),
            std::string::npos)
      << other.out;
}

// Both files give the id's prompt and they differ: the tokens are of
// another prompt, reported as such (not as a model divergence).
TEST(Compare, DifferentPromptForAnIdIsReportedAsSuch) {
  auto with_prompt = [](const std::string& id, const std::vector<int>& prompt,
                        const std::vector<int>& toks) {
    return nlohmann::json{{"id", id}, {"prompt_token_ids", prompt}, {"output_token_ids", toks}}
               .dump() +
           "\n";
  };
  RunResult r = compare(with_prompt("a", {5, 6, 7}, {1, 2}) + with_prompt("b", {8}, {3}),
                        with_prompt("a", {5, 9, 7}, {4, 4}) + with_prompt("b", {8}, {3}));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("\"a\": OTHER PROMPT: prompt_token_ids differ at position 1: expected "
                       "token 6, got 9"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("DIVERGED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 errors, 1 with another prompt -> FAIL"), std::string::npos) << r.out;
  // One file without prompts: the tokens are compared as before.
  RunResult plain = compare(with_prompt("a", {5, 6, 7}, {1, 2}), line("a", {1, 2}));
  EXPECT_EQ(plain.status, 0) << plain.out;
  // A prompt that is a prefix of the other.
  RunResult shorter = compare(with_prompt("a", {5, 6}, {1}), with_prompt("a", {5, 6, 7}, {1}));
  EXPECT_NE(shorter.out.find("expected 2 prompt tokens, got 3"), std::string::npos) << shorter.out;
}

TEST(Compare, LengthMismatchIsADivergence) {
  RunResult r = compare(line("a", {1, 2, 3}, {1, 1, 1}), line("a", {1, 2}));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("expected 3 tokens, got 2"), std::string::npos) << r.out;
  // A near-tie before the end excuses no length difference (another budget
  // or stop id, not a flip, made it), whichever file is shorter.
  for (const auto& [x, a] :
       {std::pair{line("a", {1, 2, 3, 4}, {1, 5e-4, 1, 1}), line("a", {1, 2, 3})},
        std::pair{line("a", {1, 2, 3}, {1, 5e-4, 1}), line("a", {1, 2, 3, 4})}}) {
    RunResult t = compare(x, a);
    EXPECT_EQ(t.status, 1) << t.out;
    EXPECT_NE(t.out.find("DIVERGED at step 3"), std::string::npos) << t.out;
  }
}

TEST(Compare, AcceptsGoldenJsonAsExpected) {
  const auto golden = load_json(src("tests/data/models/qwen3-tiny/golden.json"));
  std::string actual;
  for (const auto& c : golden["cases"]) {
    actual +=
        nlohmann::json{{"id", c["id"]}, {"output_token_ids", c["output_token_ids"]}}.dump() + "\n";
  }
  const std::string a = work_dir() + "/golden_copy.jsonl";
  write_text(a, actual);
  RunResult r = run(
      fmt::format("{} {} {}", QTK_COMPARE_BIN, src("tests/data/models/qwen3-tiny/golden.json"), a));
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(fmt::format("{} identical", golden["cases"].size())), std::string::npos)
      << r.out;
}

// --only-present: a run over part of a golden file's prompts (the demo's 10
// of the sample's 20) passes on the cases it has; the others are skipped,
// not missing, and a run with no id in common is an error, not a pass.
TEST(Compare, OnlyPresentSkipsCasesMissingFromActual) {
  const std::string expected = line("a", {1, 2}, {1, 1}) + line("b", {3}, {1});
  RunResult plain = compare(expected, line("a", {1, 2}));
  EXPECT_EQ(plain.status, 1) << plain.out;
  EXPECT_NE(plain.out.find("\"b\": missing"), std::string::npos) << plain.out;
  RunResult r = compare(expected, line("a", {1, 2}), "--only-present");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("compare: 1 case: 1 identical, 0 near-tie, 0 diverged, 0 missing, 0 "
                       "errors, 1 skipped -> OK"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("\"b\""), std::string::npos) << r.out;
  // A present case still fails on a real divergence.
  RunResult d = compare(expected, line("a", {1, 9}), "--only-present");
  EXPECT_EQ(d.status, 1) << d.out;
  EXPECT_NE(d.out.find("\"a\": DIVERGED at step 1: expected 2, got 9"), std::string::npos) << d.out;
  RunResult none = compare(expected, line("z", {1}), "--only-present");
  EXPECT_EQ(none.status, 1) << none.out << none.err;
  EXPECT_NE(none.err.find("compare: --only-present: expected at least one id of "),
            std::string::npos)
      << none.err;
  EXPECT_NE(none.err.find("found none (2 expected ids, first \"a\"; 1 actual ids, first \"z\")"),
            std::string::npos)
      << none.err;
}

// Lines that are no result or error line of generate are refused, naming
// the line, the field and what was found.
TEST(Compare, MalformedLinesAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"output_token_ids\": [1]}\n", "field 'id': expected a string or an integer, found none"},
      {"{\"id\": 1.5, \"output_token_ids\": [1]}\n",
       "field 'id': expected a string or an integer, found 1.5"},
      {"{\"id\": \"a\"}\n", "field 'output_token_ids': expected an array, found none"},
      {"{\"id\": \"a\", \"output_token_ids\": \"1 2\"}\n",
       "field 'output_token_ids': expected an array, found string"},
      {"{\"id\": \"a\", \"output_token_ids\": [1, -1]}\n",
       "field 'output_token_ids': expected token ids >= 0, found -1"},
      {"{\"id\": \"a\", \"error\": 5}\n", "field 'error': expected a string, found 5"},
      {"{\"id\": \"a\", \"error\": \"x\", \"output_token_ids\": [1]}\n",
       "an error line with output_token_ids"},
  };
  for (const auto& [text, needle] : cases) {
    for (const bool in_actual : {true, false}) {
      RunResult r = in_actual ? compare(line("a", {1}), text) : compare(text, line("a", {1}));
      EXPECT_EQ(r.status, 1) << text;
      EXPECT_NE(r.err.find("line 1: " + needle), std::string::npos) << text << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
  }
}

TEST(Compare, MalformedInputIsOneErrorLine) {
  RunResult r = compare(line("a", {1}), "{\"id\": \"a\", \"output_token_ids\": [1\n");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.rfind("compare: ", 0), 0u) << r.err;
  EXPECT_NE(
      r.err.find("line 1: invalid JSON at byte 34 (column 35): expected ',' or ']', found the end"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// Two results for one id (in either file) are refused, naming both lines;
// an error line beside a result (generate's answer to a reused id) is not.
TEST(Compare, SecondResultForAnIdIsRefused) {
  const std::string err_line = "{\"id\": \"a\", \"error\": \"id reused\"}\n";
  for (const bool in_actual : {true, false}) {
    const std::string twice = line("a", {1}) + line("b", {2}) + line("a", {3});
    RunResult r = in_actual ? compare(line("a", {1}) + line("b", {2}), twice)
                            : compare(twice, line("a", {1}) + line("b", {2}));
    EXPECT_EQ(r.status, 1) << r.out << r.err;
    EXPECT_NE(r.err.find(in_actual ? "actual.jsonl: line 3: id \"a\"" : "expected.jsonl: line 3"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("a second one (the first at line 1)"), std::string::npos) << r.err;
  }
  RunResult ok = compare(line("a", {1}), line("a", {1}) + err_line);
  EXPECT_EQ(ok.status, 0) << ok.out << ok.err;
}

// A margin decides whether a divergence is excused: a malformed one (not a
// number, negative, or not one per token) is refused, naming the field,
// rather than read as a near-tie or skipped.
TEST(Compare, MalformedMarginsAreRefused) {
  const std::string tail = ", \"output_token_ids\": [1, 2, 3]}\n";
  for (const auto& [margins, says] : std::vector<std::pair<std::string, std::string>>{
           {"[1, null, 1]", "expected margins >= 0, found null at index 1"},
           {"[1, -0.5, 1]", "expected margins >= 0, found -0.5 at index 1"},
           {"[1, 1]", "expected one margin per output token (3), found 2"},
           {"0.5", "expected an array, found number"}}) {
    const std::string bad = "{\"id\": \"a\", \"top1_margin\": " + margins + tail;
    RunResult r = compare(bad, line("a", {1, 9, 3}));
    EXPECT_EQ(r.status, 1) << margins << r.out << r.err;
    EXPECT_NE(r.err.find("expected.jsonl: line 1: field 'top1_margin': " + says), std::string::npos)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// A file with nothing to compare, or a directory, is an error naming it,
// not a report of every case missing.
TEST(Compare, NothingToCompareIsAnError) {
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"", "found an empty file"}, {"\n \n", "found blank lines only"}}) {
    RunResult r = compare(line("a", {1}), text);
    EXPECT_EQ(r.status, 1) << r.out << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  }
  RunResult d = run(fmt::format("{} {} {}", QTK_COMPARE_BIN, work_dir(), work_dir()));
  EXPECT_EQ(d.status, 1) << d.out << d.err;
  EXPECT_NE(d.err.find("is a directory"), std::string::npos) << d.err;
}

// A report that cannot be written (a full device) is a failure naming
// stdout, whatever the verdict: exit 1, not 0 with the report lost.
TEST(Compare, FullStdoutIsAnError) {
  const std::string e = work_dir() + "/full.expected.jsonl";
  write_text(e, line("a", {1, 2}) + line("b", {3}));
  for (const char* flags : {"", "-v", "--help"}) {
    SCOPED_TRACE(flags);
    RunResult r = run(fmt::format("( {} {} {} {} >/dev/full )", QTK_COMPARE_BIN, e, e, flags));
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "compare: cannot write to standard output: No space left on device\n");
  }
}

}  // namespace
}  // namespace qtk::rt_test
