// Bad prompt lines for the real `generate`, and bad input for `tokenize`:
// a bad line becomes that line's {"id", "error"} output naming the problem,
// the other lines still run, and the results keep input order.
#include <filesystem>
#include <string>
#include <vector>

#include "tests/badinput/checkpoint_fixture.h"

namespace qtk::testing {
namespace {

class BadPrompts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const RunResult r = run_program(
        {program("convert"), source_path("samples/qwen3-sample"), *dir_ / "sample.pack"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
};
TempDir* BadPrompts::dir_ = nullptr;

struct Line {
  std::string text;
  nlohmann::json id;  // the id the output line must carry
  std::string error;  // "" = must succeed; else a word the error must contain
};

std::string ids_line(size_t n) {
  std::string s = "{\"id\": \"long\", \"prompt_token_ids\": [";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(5 + i % 50);
  return s + "]}";
}

TEST_F(BadPrompts, EachBadLineGetsItsOwnErrorAndTheRestRun) {
  // note: line ids default to the 1-based line number.
  const std::vector<Line> lines = {
      {R"({"id": "ok1", "prompt": "def f(x):", "max_tokens": 2})", "ok1", ""},
      {R"({"id": "unk", "prompt_token_ids": [1, 999999], "max_tokens": 2})", "unk", "999999"},
      {R"({"id": "neg", "prompt_token_ids": [-3], "max_tokens": 2})", "neg", "-3"},
      {R"({"id": "empty_text", "prompt": ""})", "empty_text", "empty"},
      {R"({"id": "empty_ids", "prompt_token_ids": []})", "empty_ids", "empty"},
      {ids_line(5000), "long", "context"},
      {"{\"id\": \"bad_utf8\", \"prompt\": \"abc\xff\xfe\"}", 7, "utf-8"},
      {R"({"id": "trunc", "prompt": )", 8, "json"},
      {R"(not json at all)", 9, "json"},
      {R"([1, 2, 3])", 10, "object"},
      {R"({"id": "type", "prompt": 5})", "type", "prompt"},
      {R"({"id": "both", "prompt": "a", "prompt_token_ids": [1]})", "both", "exactly one"},
      {R"({"id": "mt", "prompt_token_ids": [1], "max_tokens": 0})", "mt", "max_tokens"},
      {R"({"id": "float", "prompt_token_ids": [1.5]})", "float", "integer"},
      {R"({"id": {"nested": 1}, "prompt_token_ids": [1]})", 15, "id"},
      {R"({"id": "mrope", "prompt_token_ids": [1], "mrope_position_ids": [[0], [0], [0]]})",
       "mrope", "m-rope"},
      // numbers past INT64_MAX are named as written, not wrapped
      {R"({"id": "huge", "prompt_token_ids": [18446744073709551615]})", "huge",
       "unknown token id 18446744073709551615"},
      {R"({"id": "huge_stop", "prompt_token_ids": [1], "stop_token_ids": [9223372036854775808]})",
       "huge_stop", "unknown token id 9223372036854775808"},
      {R"({"id": 7.5, "prompt_token_ids": [1]})", 19, "expected a string or an integer, found 7.5"},
      {"", 20, "line 20: blank line; expected a JSON object"},
      {R"({"id": "ok2", "prompt_token_ids": [10, 11, 12], "max_tokens": 2})", "ok2", ""},
  };
  TempDir t;
  std::string input;
  for (const Line& l : lines) input += l.text + "\n";
  write_file(t / "prompts.jsonl", input);
  const RunResult r = run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch",
                                   t / "prompts.jsonl", "--out", t / "out.jsonl", "--threads", "1",
                                   "--ignore-eos"});
  ASSERT_EQ(r.signal, 0) << r.err;
  ASSERT_EQ(r.exit_code, 3) << r.err;  // some lines failed
  bool partial = true;
  const auto out = split_lines(read_file(t / "out.jsonl"), &partial);
  EXPECT_FALSE(partial);
  ASSERT_EQ(out.size(), lines.size()) << "one output line per input line";
  for (size_t i = 0; i < lines.size(); ++i) {
    SCOPED_TRACE("line " + std::to_string(i + 1) + ": " + lines[i].text.substr(0, 80));
    const auto j = nlohmann::json::parse(out[i]);
    EXPECT_EQ(j["id"], lines[i].id) << out[i];
    if (lines[i].error.empty()) {
      EXPECT_FALSE(j.contains("error")) << out[i];
      ASSERT_TRUE(j.contains("output_token_ids")) << out[i];
      EXPECT_EQ(j["output_token_ids"].size(), 2u) << out[i];
    } else {
      ASSERT_TRUE(j.contains("error")) << out[i];
      EXPECT_FALSE(j.contains("output_token_ids")) << out[i];
      EXPECT_NE(lower(j["error"].get<std::string>()).find(lower(lines[i].error)), std::string::npos)
          << out[i];
    }
  }
}

// Errors that need the line number to be found: a reused id names the line
// that used it first, a raw NUL byte and a chat message without a role name
// their line (and the message's field) like the JSON parser's errors do.
TEST_F(BadPrompts, LineErrorsNameTheLine) {
  struct Case {
    std::string text;
    nlohmann::json id;
    std::string error;  // "" = must succeed; else the whole error
  };
  const std::vector<Case> cases = {
      {R"({"id": "a", "prompt_token_ids": [1, 2], "max_tokens": 1})", "a", ""},
      {R"({"id": "a", "prompt_token_ids": [3], "max_tokens": 1})", "a",
       "line 2: id \"a\" already used on line 1 (ids must be unique within a batch)"},
      {std::string("{\"id\": \"n\", \"prompt_token_ids\": [1]}\0{}", 39), 3,
       "line 3: malformed JSON: a raw NUL byte at byte 37 (JSON text never contains one; inside "
       "a string write \\u0000)"},
      {R"({"id": "c", "messages": [{"role": "user", "content": "hi"}, {"content": "x"}]})", "c",
       "line 4: field 'messages[1].role': missing; expected a string such as \"user\" or "
       "\"assistant\""},
      {R"({"id": "d", "messages": [{"role": 7, "content": "hi"}]})", "d",
       "line 5: field 'messages[0].role': expected a string, found number"},
      {R"({"prompt_token_ids": [4], "max_tokens": 1})", 6, ""},
      {R"({"id": 6, "prompt_token_ids": [4], "max_tokens": 1})", 6,
       "line 7: id 6 already used on line 6 (it has no \"id\", so its line number is its id) "
       "(ids must be unique within a batch)"},
      {R"({"id": "ok", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})", "ok",
       ""},
  };
  TempDir t;
  std::string input;
  for (const Case& c : cases) input += c.text + "\n";
  write_file(t / "prompts.jsonl", input);
  write_file(t / "chat.jinja",
             "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:");
  const RunResult r = run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch",
                                   t / "prompts.jsonl", "--out", t / "out.jsonl", "--threads", "1",
                                   "--chat-template", t / "chat.jinja"});
  ASSERT_EQ(r.signal, 0) << r.err;
  ASSERT_EQ(r.exit_code, 3) << r.err;  // some lines failed
  const auto out = split_lines(read_file(t / "out.jsonl"));
  ASSERT_EQ(out.size(), cases.size()) << "one output line per input line";
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("line " + std::to_string(i + 1));
    const auto j = nlohmann::json::parse(out[i]);
    EXPECT_EQ(j["id"], cases[i].id) << out[i];
    if (cases[i].error.empty())
      EXPECT_TRUE(j.contains("output_token_ids")) << out[i];
    else
      EXPECT_EQ(j.value("error", ""), cases[i].error) << out[i];
  }
}

// A UTF-8 byte order mark opening the batch (Windows editors write one) is
// skipped, as compare and tokenize skip it; one anywhere else is an error.
TEST_F(BadPrompts, ByteOrderMarkOpeningTheBatchIsSkipped) {
  TempDir t;
  const std::string bom = "\xEF\xBB\xBF";
  write_file(t / "prompts.jsonl",
             bom + R"({"id": "a", "prompt_token_ids": [1, 2], "max_tokens": 1})" + "\n" + bom +
                 R"({"id": "b", "prompt_token_ids": [3]})" + "\n");
  const RunResult r =
      run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch",
                   t / "prompts.jsonl", "--out", t / "out.jsonl", "--threads", "1"});
  ASSERT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.err;  // line 2's mark is an error
  const auto out = split_lines(read_file(t / "out.jsonl"));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(nlohmann::json::parse(out[0]).contains("output_token_ids")) << out[0];
  EXPECT_NE(nlohmann::json::parse(out[1]).value("error", "").find("line 2"), std::string::npos)
      << out[1];
}

// A batch holding only the mark (and blank lines) is an empty batch: exit 1,
// nothing written, as for a file of blank lines.
TEST_F(BadPrompts, ByteOrderMarkAloneIsAnEmptyBatch) {
  TempDir t;
  for (const std::string text : {"\xEF\xBB\xBF", "\xEF\xBB\xBF\n", "\xEF\xBB\xBF \r\n\n"}) {
    write_file(t / "prompts.jsonl", text);
    const RunResult r =
        run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch",
                     t / "prompts.jsonl", "--out", t / "out.jsonl", "--threads", "1"});
    expect_clean_failure(r, "generate", {"prompts.jsonl", "expected at least one prompt line"});
    EXPECT_FALSE(file_exists(t / "out.jsonl"));
    EXPECT_FALSE(file_exists(t / "out.jsonl.meta.json"));
  }
}

TEST_F(BadPrompts, UnreadableBatchOrOutputFailsCleanly) {
  TempDir t;
  // Missing batch file: exit 1, nothing written.
  RunResult r = run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch",
                             t / "missing.jsonl", "--out", t / "out.jsonl"});
  expect_clean_failure(r, "generate", {"missing.jsonl"});
  EXPECT_FALSE(file_exists(t / "out.jsonl"));
  // Output into a directory that does not exist.
  write_file(t / "p.jsonl", "{\"prompt_token_ids\": [1]}\n");
  r = run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch", t / "p.jsonl",
                   "--out", t / "no/such/dir/out.jsonl"});
  expect_clean_failure(r, "generate", {"out.jsonl"});
  // A missing pack.
  r = run_program({program("generate"), "--model", t / "nope.pack", "--batch", t / "p.jsonl",
                   "--out", t / "out.jsonl"});
  expect_clean_failure(r, "generate", {"nope.pack"});
  EXPECT_FALSE(file_exists(t / "out.jsonl"));
}

TEST_F(BadPrompts, DeeplyNestedLine) {
  // note: a value nested a million levels deep must give that line an error,
  // not a stack overflow while the message shows the value.
  TempDir t;
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  write_file(t / "p.jsonl",
             "{\"id\": \"ok\", \"prompt_token_ids\": [1, 2], \"max_tokens\": 1}\n"
             "{\"id\": \"deep\", \"prompt_token_ids\": [1], \"max_tokens\": " +
                 deep +
                 "}\n"
                 "{\"id\": \"deep2\", \"prompt_token_ids\": " +
                 deep + "}\n");
  const RunResult r = run_program({program("generate"), "--model", *dir_ / "sample.pack", "--batch",
                                   t / "p.jsonl", "--out", t / "out.jsonl", "--threads", "1"});
  ASSERT_EQ(r.signal, 0) << "generate died of a signal on a deeply nested line";
  ASSERT_EQ(r.exit_code, 3) << r.err;  // two lines failed
  const auto out = split_lines(read_file(t / "out.jsonl"));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(nlohmann::json::parse(out[0]).contains("output_token_ids")) << out[0];
  EXPECT_TRUE(nlohmann::json::parse(out[1]).contains("error")) << out[1].substr(0, 200);
  EXPECT_TRUE(nlohmann::json::parse(out[2]).contains("error")) << out[2].substr(0, 200);
}

TEST(BadTokenizerInput, UnusableTokenizerFailsWithOneLineAndNoOutput) {
  TempDir t;
  write_file(t / "in.jsonl", "{\"text\": \"hello\"}\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"model\": {\"type\": \"WordPiece\"}}", "tokenizer.json"},
      {"{\"model\": ", "tokenizer.json"},
      {"\xff\xfe{}", "tokenizer.json"},
      {"[]", "tokenizer.json"},
  };
  for (const auto& [text, needle] : cases) {
    SCOPED_TRACE(text);
    write_file(t / "tokenizer.json", text);
    const RunResult r =
        run_program({program("tokenize"), "--tokenizer", t / "tokenizer.json"}, t / "in.jsonl");
    expect_clean_failure(r, "tokenize", {needle});
    EXPECT_EQ(r.out, "") << "tokenize wrote output for an unusable tokenizer";
  }
}

TEST(BadTokenizerInput, DeeplyNestedIdsLine) {
  TempDir t;
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  write_file(t / "in.jsonl", "{\"ids\": [" + deep + "]}\n{\"ids\": [5, 6]}\n");
  const RunResult r = run_program({program("tokenize"), "--tokenizer",
                                   source_path("samples/qwen3-sample/tokenizer.json"), "--decode"},
                                  t / "in.jsonl");
  ASSERT_EQ(r.signal, 0) << "tokenize died of a signal on a deeply nested line";
  EXPECT_EQ(r.exit_code, 3) << r.err;
  const auto out = split_lines(r.out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(nlohmann::json::parse(out[0]).contains("error")) << out[0].substr(0, 200);
  EXPECT_TRUE(nlohmann::json::parse(out[1]).contains("text")) << out[1];
}

TEST(BadTokenizerInput, BadLinesGetPerLineErrors) {
  TempDir t;
  write_file(t / "in.jsonl",
             "{\"text\": \"hello\"}\n{\"text\": \"a\xff\"}\nnot json\n{\"text\": 5}\n{\"text\": "
             "\"bye\"}\n");
  const RunResult r = run_program(
      {program("tokenize"), "--tokenizer", source_path("samples/qwen3-sample/tokenizer.json")},
      t / "in.jsonl");
  ASSERT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  const auto out = split_lines(r.out);
  ASSERT_EQ(out.size(), 5u) << r.out;
  EXPECT_NE(out[0].find("\"ids\""), std::string::npos);
  for (int i : {1, 2, 3}) {
    const auto j = nlohmann::json::parse(out[i]);
    EXPECT_TRUE(j.contains("error")) << out[i];
    EXPECT_EQ(j["line"], i + 1) << out[i];
  }
  EXPECT_NE(out[4].find("\"ids\""), std::string::npos);
}

// tokenize reads a file opened by a byte order mark as generate does: the
// mark is not part of line 1's JSON; one on a later line is that line's error.
TEST(BadTokenizerInput, ByteOrderMarkOpeningTheFileIsSkipped) {
  TempDir t;
  const std::string bom = "\xEF\xBB\xBF";
  write_file(t / "in.jsonl", bom + "{\"id\": \"a\", \"text\": \"hello\"}\n" + bom +
                                 "{\"id\": \"b\", \"text\": \"hello\"}\n");
  const std::string tok = source_path("samples/qwen3-sample/tokenizer.json");
  const RunResult r = run_program({program("tokenize"), "--tokenizer", tok, t / "in.jsonl"});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const auto out = split_lines(r.out);
  ASSERT_EQ(out.size(), 2u) << r.out;
  const auto a = nlohmann::json::parse(out[0]);
  EXPECT_EQ(a["id"], "a") << out[0];
  EXPECT_TRUE(a.contains("ids")) << out[0];
  const auto b = nlohmann::json::parse(out[1]);
  ASSERT_TRUE(b.contains("error")) << out[1];
  EXPECT_NE(b["error"].get<std::string>().find("line 2"), std::string::npos) << out[1];
  // The same from stdin.
  const RunResult d = run_program({program("tokenize"), "--tokenizer", tok}, t / "in.jsonl");
  EXPECT_EQ(d.out, r.out);
}

// Issue 20 item 14: tokenize reads a file argument (or - for stdin) and
// passes each line's "id" through; item 13: a raw NUL hides no rest of line.
TEST(BadTokenizerInput, FileArgumentIdsAndRawNul) {
  TempDir t;
  write_file(t / "in.jsonl",
             std::string("{\"id\": \"a\", \"text\": \"hello\"}\n{\"id\": 7, \"text\": 5}\n") +
                 std::string("{\"text\": \"x\"}\0{\"text\": \"y\"}\n", 28));
  const std::string tok = source_path("samples/qwen3-sample/tokenizer.json");
  const RunResult r = run_program({program("tokenize"), "--tokenizer", tok, t / "in.jsonl"});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const auto out = split_lines(r.out);
  ASSERT_EQ(out.size(), 3u) << r.out;
  const auto a = nlohmann::json::parse(out[0]);
  EXPECT_EQ(a["id"], "a") << out[0];
  EXPECT_TRUE(a.contains("ids")) << out[0];
  const auto b = nlohmann::json::parse(out[1]);
  EXPECT_EQ(b["id"], 7) << out[1];
  EXPECT_TRUE(b.contains("error")) << out[1];
  const auto c = nlohmann::json::parse(out[2]);
  ASSERT_TRUE(c.contains("error")) << out[2];
  EXPECT_NE(c["error"].get<std::string>().find("NUL"), std::string::npos) << out[2];
  // "-" is stdin, as without an argument.
  const RunResult d = run_program({program("tokenize"), "--tokenizer", tok, "-"}, t / "in.jsonl");
  EXPECT_EQ(d.exit_code, 3) << d.err;
  EXPECT_EQ(d.out, r.out);
  const RunResult missing =
      run_program({program("tokenize"), "--tokenizer", tok, t / "nope.jsonl"});
  expect_clean_failure(missing, "tokenize", {"nope.jsonl"});
  const RunResult dir = run_program({program("tokenize"), "--tokenizer", tok, t.path()});
  expect_clean_failure(dir, "tokenize", {"is a directory", "expected a JSONL file"});
}

// An "id" that is not a string or an integer is an error, not dropped; a
// key given twice is malformed JSON (as for generate); output that cannot
// be written is a failure, not exit 0.
TEST(BadTokenizerInput, BadIdsDuplicateKeysAndUnwritableOutput) {
  TempDir t;
  write_file(t / "in.jsonl",
             "{\"id\": 1.5, \"text\": \"a\"}\n{\"id\": null, \"ids\": [5]}\n"
             "{\"text\": \"a\", \"text\": \"b\"}\n{\"id\": \"ok\", \"text\": \"a\"}\n");
  const std::string tok = source_path("samples/qwen3-sample/tokenizer.json");
  const RunResult r = run_program({program("tokenize"), "--tokenizer", tok, t / "in.jsonl"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  const auto out = split_lines(r.out);
  ASSERT_EQ(out.size(), 4u) << r.out;
  EXPECT_NE(out[0].find("line 1: field 'id': expected a string or an integer, found 1.5"),
            std::string::npos)
      << out[0];
  EXPECT_NE(out[1].find("field 'id': expected a string or an integer, found null"),
            std::string::npos)
      << out[1];
  EXPECT_NE(out[2].find("duplicate JSON key 'text'"), std::string::npos) << out[2];
  EXPECT_NE(out[3].find("\"id\":\"ok\""), std::string::npos) << out[3];
  // stdout on a full device: exit 1 and one line saying so.
  std::string many;
  for (int i = 0; i < 20000; ++i) many += "{\"text\": \"hello world\"}\n";
  write_file(t / "many.jsonl", many);
  const RunResult full =
      run_program({"/bin/sh", "-c", "exec \"$0\" --tokenizer \"$1\" \"$2\" > /dev/full",
                   program("tokenize"), tok, t / "many.jsonl"});
  expect_clean_failure(full, "tokenize", {"cannot write the output"});
}

}  // namespace
}  // namespace qtk::testing
