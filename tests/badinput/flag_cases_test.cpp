// Bad command-line flags for the real programs (convert, inspect, tokenize
// here; generate and compare in flag_runtime_cases_test.cpp): a non-numeric
// or out-of-range number, an unknown flag, a flag without its value, a bad
// enum value, a missing required flag, a value given to a switch, a stray
// argument. Each: exit status 1, ONE stderr line "<program>: --flag: ..."
// naming the flag, nothing on stdout, no output file.
//
// Every other argument in a case is valid (real inputs, a writable output
// directory), so the flag is the only thing that can make the run fail.
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/badinput/flag_cases.h"

namespace qtk::testing {
namespace {

// convert INPUT OUT.pack: the input is the real sample checkpoint.
TEST(BadFlags, Convert) {
  const std::vector<FlagCase> cases = {
      // bad number
      {{"--max-entries", "abc"}, {"--max-entries", "\"abc\""}},
      {{"--max-unpacked-bytes", "12Q"}, {"--max-unpacked-bytes", "\"12Q\""}},
      {{"--max-unpacked-bytes=1.5G"}, {"--max-unpacked-bytes", "\"1.5G\""}},
      {{"--max-entries", ""}, {"--max-entries", "expected"}},
      // out of range
      {{"--max-entries", "-1"}, {"--max-entries", "\"-1\""}},
      {{"--max-unpacked-bytes", "99999999999999999999"},
       {"--max-unpacked-bytes", "2^64", "99999999999999999999"}},
      {{"--max-unpacked-bytes", "16777216T"}, {"--max-unpacked-bytes", "2^64", "16777216T"}},
      // unknown flag (a near miss gets a suggestion)
      {{"--dtyp", "bf16"}, {"--dtyp", "unknown flag", "did you mean --dtype"}},
      {{"--frobnicate"}, {"--frobnicate", "unknown flag"}},
      {{"-x"}, {"-x", "unknown flag"}},
      // missing value: at the end, or followed by another flag
      {{"--dtype"}, {"--dtype", "expected a value", "end of the arguments"}},
      {{"--max-entries", "--force"}, {"--max-entries", "expected a value", "--force"}},
      // bad enum value
      {{"--dtype", "f8"}, {"--dtype", "keep, bf16, f16 or f32", "\"f8\""}},
      {{"--dtype", "BF16"}, {"--dtype", "\"BF16\""}},
      // a switch given a value
      {{"--force=yes"}, {"--force", "takes no value", "\"yes\""}},
  };
  for (const FlagCase& c : cases) {
    SCOPED_TRACE(c.describe());
    TempDir t;
    std::vector<std::string> argv = {program("convert"), source_path("samples/qwen3-sample"),
                                     t / "out.pack"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const RunResult r = run_program(argv);
    expect_flag_failure(r, "convert", c.needles);
    expect_no_output(t.path(), "out.pack", {});
  }
  // A stray third positional argument.
  TempDir t;
  const RunResult r = run_program(
      {program("convert"), source_path("samples/qwen3-sample"), t / "out.pack", t / "third"});
  expect_flag_failure(r, "convert", {"unexpected argument", "third"});
  expect_no_output(t.path(), "out.pack", {});
}

// The same valid flags still convert (the checks refuse nothing valid).
TEST(BadFlags, ConvertValidFlagsStillWork) {
  TempDir t;
  const RunResult ok =
      run_program({program("convert"), source_path("samples/qwen3-sample"), t / "out.pack",
                   "--dtype=keep", "--max-entries", "100K", "--max-unpacked-bytes=1k", "--force"});
  // note: the byte cap applies to archive input only, so 1k passes here.
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(file_exists(t / "out.pack"));
}

// inspect PATH [--verify]: no numeric or enum flags; the rest of the classes.
TEST(BadFlags, Inspect) {
  const std::string dir = model_fixture("qwen3-tiny");
  const std::vector<FlagCase> cases = {
      {{"--verfy"}, {"--verfy", "unknown flag", "did you mean --verify"}},
      {{"--max-num-seqs", "4"}, {"--max-num-seqs", "unknown flag"}},
      {{"-q"}, {"-q", "unknown flag"}},
      {{"--verify=3"}, {"--verify", "takes no value", "\"3\""}},
      {{"--help=please"}, {"--help", "takes no value"}},
      {{"--path"}, {"--path", "expected a value"}},
      {{"extra"}, {"unexpected argument", "\"extra\""}},
  };
  for (const FlagCase& c : cases) {
    SCOPED_TRACE(c.describe());
    std::vector<std::string> argv = {program("inspect"), dir};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const RunResult r = run_program(argv);
    expect_flag_failure(r, "inspect", c.needles);
  }
}

// tokenize --tokenizer PATH [--decode] [--threads N] < in.jsonl
TEST(BadFlags, Tokenize) {
  TempDir t;
  write_file(t / "in.jsonl", "{\"text\": \"hello\"}\n");
  const std::string tok = source_path("samples/qwen3-sample/tokenizer.json");
  const std::vector<FlagCase> cases = {
      // bad number
      {{"--threads", "abc"}, {"--threads", "\"abc\""}},
      {{"--threads", "2.5"}, {"--threads", "\"2.5\""}},
      {{"--threads=4x"}, {"--threads", "\"4x\""}},
      {{"--threads", ""}, {"--threads", "\"\""}},
      // out of range
      {{"--threads", "-1"}, {"--threads", "\"-1\""}},
      {{"--threads", "99999999999999999999"},
       {"--threads", "no larger than", "99999999999999999999"}},
      {{"--threads", "100000"}, {"--threads", "no larger than 1024", "\"100000\""}},
      // unknown flag
      {{"--decod"}, {"--decod", "unknown flag", "did you mean --decode"}},
      {{"--encode"}, {"--encode", "unknown flag"}},
      // missing value
      {{"--threads"}, {"--threads", "expected a value", "end of the arguments"}},
      {{"--threads", "--decode"}, {"--threads", "expected a value", "--decode"}},
      // a switch given a value
      {{"--decode=sure"}, {"--decode", "takes no value"}},
      // note: one positional argument is the input file (- for stdin); a
      // second one is stray.
      {{"-", "stray"}, {"unexpected argument", "\"stray\""}},
  };
  for (const FlagCase& c : cases) {
    SCOPED_TRACE(c.describe());
    std::vector<std::string> argv = {program("tokenize"), "--tokenizer", tok};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const RunResult r = run_program(argv, t / "in.jsonl");
    expect_flag_failure(r, "tokenize", c.needles);
  }
  // Missing required --tokenizer; and --tokenizer without its value.
  RunResult r = run_program({program("tokenize"), "--threads", "1"}, t / "in.jsonl");
  expect_flag_failure(r, "tokenize", {"--tokenizer", "required flag missing"});
  r = run_program({program("tokenize"), "--tokenizer"}, t / "in.jsonl");
  expect_flag_failure(r, "tokenize", {"--tokenizer", "expected a value"});
  r = run_program({program("tokenize"), "--tokenizer", "--threads", "1"}, t / "in.jsonl");
  expect_flag_failure(r, "tokenize", {"--tokenizer", "expected a value", "--threads"});
}

TEST(BadFlags, TokenizeValidFlagsStillWork) {
  TempDir t;
  write_file(t / "in.jsonl", "{\"text\": \"hello\"}\n");
  const std::string tok = source_path("samples/qwen3-sample/tokenizer.json");
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--threads", "0"}, {"--threads=2"}, {"--threads", "0x2"}}) {
    std::vector<std::string> argv = {program("tokenize"), "--tokenizer=" + tok};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const RunResult r = run_program(argv, t / "in.jsonl");
    EXPECT_EQ(r.exit_code, 0) << flags.front() << ": " << r.err;
    EXPECT_EQ(split_lines(r.out).size(), 1u) << r.out;
    EXPECT_NE(r.out.find("\"ids\""), std::string::npos) << r.out;
  }
}

// --help lost to a full device is an error (exit 1, one line), not exit 0.
// note: the subshell makes /dev/full stdout; a redirection by the runner
// after it would otherwise win.
TEST(BadFlags, HelpToFullStdoutIsAnError) {
  for (const std::string name : {"convert", "merge", "tokenize"}) {
    SCOPED_TRACE(name);
    const std::string err = ::testing::TempDir() + "/help_full_" + name + ".err";
    std::string cmd = "(";
    cmd += program(name);
    cmd += " --help > /dev/full) 2> '" + err + "'";
    const int raw = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) == 1) << raw;
    EXPECT_EQ(read_file(err),
              name + ": cannot write to standard output: No space left on device\n");
  }
}

}  // namespace
}  // namespace qtk::testing
