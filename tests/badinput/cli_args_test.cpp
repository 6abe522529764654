// loaders/cli_args.h on its own: the value parsers at their edges, and
// parse_flags on argument lists built here (no child processes).
#include "loaders/cli_args.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace qtk::cli {
namespace {

// The qtk::Error message of `f()`, or "" when it did not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const qtk::Error& e) {
    return e.what();
  }
  return "";
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(CliArgs, IntAcceptsDecimalHexAndTheBounds) {
  EXPECT_EQ(parse_int_flag("--n", "1", 1, 10, "x"), 1);
  EXPECT_EQ(parse_int_flag("--n", "10", 1, 10, "x"), 10);
  EXPECT_EQ(parse_int_flag("--n", "007", 1, 10, "x"), 7);
  EXPECT_EQ(parse_int_flag("--n", "0x1F", 0, 100, "x"), 31);
  EXPECT_EQ(parse_int_flag("--n", "-5", -10, 10, "x"), -5);
  EXPECT_EQ(parse_int_flag("--n", "9223372036854775807", 0, kMax, "x"), kMax);
  EXPECT_EQ(parse_int_flag("--n", "-9223372036854775808", kMin, 0, "x"), kMin);
  EXPECT_EQ(parse_int_flag("--n", "0x7fffffffffffffff", 0, kMax, "x"), kMax);
}

TEST(CliArgs, IntRefusesWithTheFlagTheExpectationAndTheText) {
  EXPECT_EQ(error_of([] { parse_int_flag("--max-num-seqs", "abc", 1, 100, "a positive integer"); }),
            "--max-num-seqs: expected a positive integer, found \"abc\"");
  EXPECT_EQ(error_of([] { parse_int_flag("--n", "0", 1, 100, "a positive integer"); }),
            "--n: expected a positive integer, found \"0\"");
  EXPECT_EQ(error_of([] { parse_int_flag("--n", "101", 1, 100, "a positive integer"); }),
            "--n: expected a positive integer no larger than 100, found \"101\"");
  // Past uint64, past int64, and past int64 below zero.
  EXPECT_EQ(error_of([] { parse_int_flag("--n", "99999999999999999999", 1, kMax, "a count"); }),
            "--n: expected a count no larger than 9223372036854775807, found "
            "\"99999999999999999999\"");
  EXPECT_EQ(error_of([] { parse_int_flag("--n", "9223372036854775808", 1, kMax, "a count"); }),
            "--n: expected a count no larger than 9223372036854775807, found "
            "\"9223372036854775808\"");
  EXPECT_EQ(error_of([] { parse_int_flag("--n", "-9223372036854775809", kMin, kMax, "a count"); }),
            "--n: expected a count, found \"-9223372036854775809\"");
  for (const char* bad :
       {"", "-", "0x", "-0x", "+1", " 1", "1 ", "1.0", "1e3", "0x1g", "1_000", "\xff", "--1"}) {
    EXPECT_NE(error_of([&] { parse_int_flag("--n", bad, kMin, kMax, "a count"); }), "") << bad;
  }
}

TEST(CliArgs, MessagesStayOneLine) {
  const std::string e = error_of([] { parse_int_flag("--n", "1\n2\r\"3\"\\", 0, 10, "a count"); });
  // A newline, tab and carriage return as \n, \t, \r (as in every other
  // message), other control bytes as \xHH.
  EXPECT_EQ(e, "--n: expected a count, found \"1\\n2\\r\\\"3\\\"\\\\\"");
  EXPECT_EQ(error_of([] { parse_int_flag("--n", "1\t\x01", 0, 10, "a count"); }),
            "--n: expected a count, found \"1\\t\\x01\"");
  const std::string long_text(500, '9');
  const std::string e2 =
      error_of([&] { parse_int_flag("--n", "x" + long_text, 0, 10, "a count"); });
  EXPECT_LT(e2.size(), 120u) << e2;
  EXPECT_NE(e2.find("...\""), std::string::npos) << e2;
}

TEST(CliArgs, Real) {
  EXPECT_DOUBLE_EQ(parse_real_flag("--t", "1e-3", 0, 1, "x"), 1e-3);
  EXPECT_DOUBLE_EQ(parse_real_flag("--t", "0", 0, 1, "x"), 0.0);
  for (const char* bad : {"", "abc", "1e-3x", " 1", "nan", "inf", "-inf", "1e999", "-0.1", "2"})
    EXPECT_EQ(error_of([&] { parse_real_flag("--t", bad, 0, 1, "a number in [0, 1]"); }),
              std::string("--t: expected a number in [0, 1], found \"") + bad + "\"")
        << bad;
}

TEST(CliArgs, Size) {
  EXPECT_EQ(parse_size_flag("--s", "0"), 0u);
  EXPECT_EQ(parse_size_flag("--s", "100000"), 100000u);
  EXPECT_EQ(parse_size_flag("--s", "4k"), 4096u);
  EXPECT_EQ(parse_size_flag("--s", "256G"), uint64_t{256} << 30);
  EXPECT_EQ(parse_size_flag("--s", "16777215T"), uint64_t{16777215} << 40);
  EXPECT_EQ(parse_size_flag("--s", "18446744073709551615"), std::numeric_limits<uint64_t>::max());
  for (const char* bad : {"", "-1", "+1", "1.5G", "1GB", "G", "0x10", " 1"})
    EXPECT_NE(error_of([&] { parse_size_flag("--s", bad); }).find("--s: expected a count such as"),
              std::string::npos)
        << bad;
  for (const char* big : {"18446744073709551616", "16777216T", "99999999999999999999K"})
    EXPECT_NE(error_of([&] { parse_size_flag("--s", big); }).find("below 2^64"), std::string::npos)
        << big;
  EXPECT_EQ(error_of([] { parse_size_flag("--s", "5", 10); }),
            "--s: expected at least 10, found \"5\"");
}

TEST(CliArgs, Choice) {
  EXPECT_EQ(parse_choice_flag("--device", "cuda", {"cpu", "cuda"}), "cuda");
  EXPECT_EQ(error_of([] {
              parse_choice_flag("--device", "gpu", {"cpu", "cuda"});
            }),
            "--device: expected cpu or cuda, found \"gpu\"");
  EXPECT_EQ(error_of([] {
              parse_choice_flag("--d", "x", {"a", "b", "c"});
            }),
            "--d: expected a, b or c, found \"x\"");
}

// A small option set like the programs': two value flags, two switches, a
// short-only-with-long switch, one positional.
class ParseFlags : public ::testing::Test {
 protected:
  ParseFlags() : options_("prog", "test") {
    options_.add_options()("model", "the .pack file", cxxopts::value<std::string>())(
        "threads", "worker threads", cxxopts::value<std::string>()->default_value("0"))(
        "force", "replace")("v,verbose", "more output")("h,help", "help")(
        "input", "the input", cxxopts::value<std::string>());
    options_.parse_positional({"input"});
  }

  // The parse error for `args` ("" when it parses).
  std::string error(std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    return error_of([&] { parse_flags(options_, static_cast<int>(args.size()), argv.data()); });
  }

  cxxopts::Options options_;
};

TEST_F(ParseFlags, ValidListsParse) {
  EXPECT_EQ(error({}), "");
  EXPECT_EQ(error({"in", "--model", "m.pack", "--threads=4", "--force", "-v"}), "");
  EXPECT_EQ(error({"--model", "-m.pack"}), "") << "a value may start with '-'";
  EXPECT_EQ(error({"--threads", "-1"}), "") << "values are checked later, by parse_int_flag";
  EXPECT_EQ(error({"-vh"}), "");
  EXPECT_EQ(error({"--", "--not-a-flag"}), "") << "after --, words are positional";
  EXPECT_EQ(error({"-"}), "") << "a lone - is a positional argument";
}

TEST_F(ParseFlags, UnknownFlags) {
  EXPECT_EQ(error({"--thread", "4"}),
            "--thread: unknown flag (did you mean --threads?; see --help)");
  EXPECT_EQ(error({"--frobnicate"}), "--frobnicate: unknown flag (see --help)");
  EXPECT_EQ(error({"--verbose-x"}).substr(0, 27), "--verbose-x: unknown flag (");
  EXPECT_EQ(error({"-x"}), "-x: unknown flag (see --help)");
  EXPECT_EQ(error({"-vx"}), "-x: unknown flag (see --help)");
  EXPECT_EQ(error({"--h"}), "--h: unknown flag (see --help)") << "short names take one dash";
  EXPECT_EQ(error({"--"}), "");
  EXPECT_EQ(error({"---model", "m"}).substr(0, 26), "---model: unknown flag (di");
  EXPECT_EQ(error({"--=3"}), "--: unknown flag (see --help)");
  EXPECT_EQ(error({"--a\nb"}), "--a\\nb: unknown flag (see --help)") << "one line";
  EXPECT_EQ(error({std::string("-\x01")}), "-\\x01: unknown flag (see --help)");
}

// A value flag given twice with different values is refused (cxxopts kept
// the last); the same value twice, and a switch twice, are fine.
TEST_F(ParseFlags, AValueGivenTwice) {
  EXPECT_EQ(error({"--model", "a.pack", "--model", "b.pack"}),
            "--model: given twice, as \"a.pack\" and \"b.pack\"; expected one value");
  EXPECT_EQ(error({"--threads=2", "--threads", "3"}),
            "--threads: given twice, as \"2\" and \"3\"; expected one value");
  EXPECT_EQ(error({"--model", "a.pack", "--model=a.pack"}), "");
  EXPECT_EQ(error({"--force", "--force", "-v", "-v"}), "");
}

TEST_F(ParseFlags, MissingValues) {
  EXPECT_EQ(error({"--model"}),
            "--model: expected a value after the flag, found the end of the arguments");
  EXPECT_EQ(error({"--model", "--force"}),
            "--model: expected a value after the flag, found the flag --force");
  EXPECT_EQ(error({"--threads", "--model=x"}),
            "--threads: expected a value after the flag, found the flag --model");
  EXPECT_EQ(error({"--model="}), "") << "an explicit empty value is a value (checked later)";
}

TEST_F(ParseFlags, SwitchesTakeNoValue) {
  EXPECT_EQ(error({"--force=yes"}), "--force: takes no value, found \"yes\"");
  EXPECT_EQ(error({"--force=false"}), "--force: takes no value, found \"false\"");
  EXPECT_EQ(error({"--verbose="}), "--verbose: takes no value, found \"\"");
}

TEST_F(ParseFlags, RequiredAndExtra) {
  std::vector<std::string> args = {"prog", "in", "extra"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  const auto parsed = parse_flags(options_, static_cast<int>(args.size()), argv.data());
  EXPECT_EQ(error_of([&] { require_flag(options_, parsed, "model"); }),
            "--model: required flag missing (the .pack file; see --help)");
  EXPECT_EQ(error_of([&] { require_flag(options_, parsed, "input"); }), "");
  EXPECT_EQ(error_of([&] { no_extra_arguments(parsed); }),
            "unexpected argument \"extra\" (see --help)");
}

}  // namespace
}  // namespace qtk::cli
