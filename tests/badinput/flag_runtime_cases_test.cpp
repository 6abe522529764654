// Bad command-line flags for the real `generate` and `compare` (see
// flag_cases_test.cpp for the contract). Every other argument is valid: a
// real pack converted from samples/qwen3-sample, a valid prompt file and a
// writable output directory, so only the flag can make the run fail; and the
// results file, its .meta.json and any temporary file must not appear.
#include <string>
#include <vector>

#include "tests/badinput/flag_cases.h"

namespace qtk::testing {
namespace {

class BadRuntimeFlags : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const RunResult r = run_program(
        {program("convert"), source_path("samples/qwen3-sample"), *dir_ / "sample.pack"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    write_file(*dir_ / "p.jsonl",
               "{\"id\": \"a\", \"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 2}\n");
    // compare's inputs: two identical result files.
    write_file(*dir_ / "r.jsonl", "{\"id\": \"a\", \"output_token_ids\": [5, 6]}\n");
  }
  static void TearDownTestSuite() { delete dir_; }

  // Runs generate with valid --model/--batch/--out plus `flags`; expects the
  // flag failure and no file in the output directory.
  static void expect_generate_rejects(const FlagCase& c) {
    SCOPED_TRACE(c.describe());
    TempDir t;
    std::vector<std::string> argv = {program("generate"), "--model",         *dir_ / "sample.pack",
                                     "--batch",           *dir_ / "p.jsonl", "--out",
                                     t / "out.jsonl"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const RunResult r = run_program(argv);
    expect_flag_failure(r, "generate", c.needles);
    expect_no_output(t.path(), "out.jsonl", {});
  }

  static TempDir* dir_;
};
TempDir* BadRuntimeFlags::dir_ = nullptr;

TEST_F(BadRuntimeFlags, GenerateBadNumbers) {
  // Every numeric flag: not a number, below its minimum, past int64, past
  // its upper bound.
  struct NumFlag {
    std::string name;
    std::string below;  // the smallest refused value under the minimum
    std::string above;  // the smallest refused value over the maximum
  };
  const std::vector<NumFlag> flags = {
      {"--threads", "-1", "1025"},      {"--max-tokens", "-1", "9223372036854775808"},
      {"--max-num-seqs", "0", "65537"}, {"--max-batched-tokens", "0", "1048577"},
      {"--block-size", "0", "65537"},   {"--kv-cache-blocks", "-1", "2147483648"},
  };
  for (const NumFlag& f : flags) {
    for (const std::string bad : {"abc", "1.5", "12k", "", "-", "0x", " 4", "4 ", "+4"})
      expect_generate_rejects({{f.name, bad}, {f.name, "expected", "found \"" + bad + "\""}});
    expect_generate_rejects({{f.name + "=x7"}, {f.name, "\"x7\""}});
    expect_generate_rejects({{f.name, f.below}, {f.name, "\"" + f.below + "\""}});
    expect_generate_rejects({{f.name, "-9223372036854775809"}, {f.name, "-9223372036854775809"}});
    expect_generate_rejects(
        {{f.name, "99999999999999999999"}, {f.name, "no larger than", "99999999999999999999"}});
    expect_generate_rejects({{f.name, f.above}, {f.name, "no larger than", "\"" + f.above + "\""}});
  }
  // The brief's example, word for word.
  TempDir t;
  const RunResult r =
      run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch",
                   *dir_ / "p.jsonl", "--out", t / "r.jsonl", "--max-num-seqs", "abc"});
  EXPECT_EQ(r.err, "generate: --max-num-seqs: expected a positive integer, found \"abc\"\n");
  // A newline in a value is shown as \n, as in every other message.
  TempDir n;
  const RunResult nl =
      run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch",
                   *dir_ / "p.jsonl", "--out", n / "r.jsonl", "--max-tokens", "1\n2"});
  EXPECT_EQ(nl.exit_code, 1) << nl.err;
  EXPECT_EQ(nl.err,
            "generate: --max-tokens: expected 0 (the pack's default) or a positive integer, "
            "found \"1\\n2\"\n");
  expect_no_output(n.path(), "r.jsonl", {});
}

TEST_F(BadRuntimeFlags, GenerateUnknownMissingAndEnumFlags) {
  const std::vector<FlagCase> cases = {
      // unknown flag
      {{"--max-num-seq", "4"}, {"--max-num-seq", "unknown flag", "did you mean --max-num-seqs"}},
      {{"--temperature", "0.7"}, {"--temperature", "unknown flag"}},
      {{"-n", "4"}, {"-n", "unknown flag"}},
      // a long flag with one dash: named whole, with its nearest long flag
      {{"-max-tokens", "4"}, {"-max-tokens", "unknown flag", "did you mean --max-tokens"}},
      {{"-max-tokens=4"}, {"-max-tokens: unknown flag", "did you mean --max-tokens"}},
      {{"---threads", "1"}, {"---threads", "unknown flag"}},
      // missing value: at the end, or followed by another flag
      {{"--threads"}, {"--threads", "expected a value", "end of the arguments"}},
      {{"--max-tokens", "--ignore-eos"}, {"--max-tokens", "expected a value", "--ignore-eos"}},
      {{"--device", "--threads=2"}, {"--device", "expected a value", "--threads"}},
      // bad enum value
      {{"--device", "gpu"}, {"--device", "cpu or cuda", "\"gpu\""}},
      {{"--device", "CPU"}, {"--device", "\"CPU\""}},
      {{"--device="}, {"--device", "\"\""}},
      // an unset variable in a job script: not a whole-batch run
      {{"--shard", ""}, {"--shard", "expected K/N or auto", "an empty value"}},
      {{"--shard="}, {"--shard", "an empty value"}},
      // a file flag with an empty value: not the default file
      {{"--chat-template", ""}, {"--chat-template", "expected a file name", "an empty value"}},
      {{"--meta="}, {"--meta", "expected a file name", "an empty value"}},
      {{"--precision", "f16"}, {"--precision", "f32 or bf16", "\"f16\""}},
      {{"--precision=fp32"}, {"--precision", "\"fp32\""}},
      // a switch given a value; a stray argument
      {{"--ignore-eos=maybe"}, {"--ignore-eos", "takes no value", "\"maybe\""}},
      {{"--resume=2"}, {"--resume", "takes no value"}},
      // note: cxxopts took --margins=false, and it meant ON (switches are
      // tested by count); now refused like any value.
      {{"--margins=false"}, {"--margins", "takes no value", "\"false\""}},
      {{"--show=true"}, {"--show", "takes no value", "\"true\""}},
      {{"prompts.jsonl"}, {"unexpected argument", "prompts.jsonl"}},
      // a value flag given twice (cxxopts kept the last without a word)
      {{"--max-tokens", "4", "--max-tokens", "8"}, {"--max-tokens", "given twice", "\"8\""}},
  };
  for (const FlagCase& c : cases) expect_generate_rejects(c);
}

TEST_F(BadRuntimeFlags, GenerateMissingRequiredFlags) {
  TempDir t;
  const std::vector<std::string> model = {"--model", *dir_ / "sample.pack"};
  const std::vector<std::string> batch = {"--batch", *dir_ / "p.jsonl"};
  const std::vector<std::string> out = {"--out", t / "out.jsonl"};
  struct Case {
    std::vector<std::vector<std::string>> given;
    std::string missing;
  };
  for (const Case& c : std::vector<Case>{
           {{batch, out}, "--model"}, {{model, out}, "--batch"}, {{model, batch}, "--out"}}) {
    SCOPED_TRACE(c.missing);
    std::vector<std::string> argv = {program("generate")};
    for (const auto& g : c.given) argv.insert(argv.end(), g.begin(), g.end());
    const RunResult r = run_program(argv);
    expect_flag_failure(r, "generate", {c.missing, "required flag missing"});
    expect_no_output(t.path(), "out.jsonl", {});
  }
  // --model or --batch with an empty value (an unset variable): named as such.
  for (const Case& c : std::vector<Case>{{{batch, out}, "--model"}, {{model, out}, "--batch"}}) {
    std::vector<std::string> argv = {program("generate"), c.missing, ""};
    for (const auto& g : c.given) argv.insert(argv.end(), g.begin(), g.end());
    expect_flag_failure(run_program(argv), "generate",
                        {c.missing, "expected a file name, found an empty value"});
    expect_no_output(t.path(), "out.jsonl", {});
  }
  // A value-taking flag swallowing the next flag's name is reported as the
  // missing value, not as the later missing flag.
  const RunResult r = run_program(
      {program("generate"), "--model", "--batch", *dir_ / "p.jsonl", "--out", t / "out.jsonl"});
  expect_flag_failure(r, "generate", {"--model", "expected a value", "--batch"});
  expect_no_output(t.path(), "out.jsonl", {});
}

TEST_F(BadRuntimeFlags, GenerateValidFlagsStillWork) {
  // Forms the checks must keep: --flag=value, 0x hex (cxxopts took it),
  // 0 for the "default" flags, the smallest --max-batched-tokens.
  TempDir t;
  const RunResult r = run_program({program("generate"),
                                   "--model=" + *dir_ / "sample.pack",
                                   "--batch",
                                   *dir_ / "p.jsonl",
                                   "--out",
                                   t / "out.jsonl",
                                   "--threads=1",
                                   "--max-num-seqs",
                                   "0x10",
                                   "--max-tokens",
                                   "0",
                                   "--kv-cache-blocks",
                                   "0",
                                   "--block-size",
                                   "32",
                                   "--max-batched-tokens",
                                   "1",
                                   "--precision",
                                   "f32",
                                   "--device=cpu",
                                   "--ignore-eos",
                                   "--margins"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = split_lines(read_file(t / "out.jsonl"));
  ASSERT_EQ(lines.size(), 1u);
  const auto j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["output_token_ids"].size(), 2u) << lines[0];
  EXPECT_TRUE(j.contains("top1_margin")) << lines[0];
}

TEST_F(BadRuntimeFlags, Compare) {
  const std::vector<FlagCase> cases = {
      // bad number
      {{"--near-tie", "abc"}, {"--near-tie", "expected a non-negative number", "\"abc\""}},
      {{"--near-tie", "1e-3x"}, {"--near-tie", "\"1e-3x\""}},
      {{"--near-tie", ""}, {"--near-tie", "\"\""}},
      {{"--near-tie", "nan"}, {"--near-tie", "\"nan\""}},
      // out of range
      {{"--near-tie", "-0.5"}, {"--near-tie", "\"-0.5\""}},
      {{"--near-tie", "1e999"}, {"--near-tie", "\"1e999\""}},
      {{"--near-tie=inf"}, {"--near-tie", "\"inf\""}},
      // unknown flag
      {{"--verbos"}, {"--verbos", "unknown flag", "did you mean --verbose"}},
      {{"--tolerance", "1"}, {"--tolerance", "unknown flag"}},
      {{"-vq"}, {"-q", "unknown flag"}},
      // missing value
      {{"--near-tie"}, {"--near-tie", "expected a value", "end of the arguments"}},
      {{"--near-tie", "--verbose"}, {"--near-tie", "expected a value", "--verbose"}},
      // a switch given a value; a stray argument
      {{"--verbose=loud"}, {"--verbose", "takes no value"}},
      {{"third.jsonl"}, {"unexpected argument", "third.jsonl"}},
  };
  for (const FlagCase& c : cases) {
    SCOPED_TRACE(c.describe());
    std::vector<std::string> argv = {program("compare"), *dir_ / "r.jsonl", *dir_ / "r.jsonl"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    expect_flag_failure(run_program(argv), "compare", c.needles);
  }
  // Valid: 0, a plain and an exponent form, the short -v.
  for (const std::string v : {"0", "0.25", "1e-3"}) {
    const RunResult r = run_program(
        {program("compare"), *dir_ / "r.jsonl", *dir_ / "r.jsonl", "--near-tie", v, "-v"});
    EXPECT_EQ(r.exit_code, 0) << v << ": " << r.err;
    EXPECT_NE(r.out.find("1 identical"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace qtk::testing
