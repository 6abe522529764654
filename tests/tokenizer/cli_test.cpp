// End-to-end tests of the `tokenize` program: run the binary, check its lines.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zip.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "tests/tokenizer/test_util.h"

namespace qtk {
namespace {

using nlohmann::json;
using test::data_path;

struct RunResult {
  int status = -1;
  std::vector<std::string> out_lines;
  std::string err;
};

std::string temp_path(const std::string& name) {
  static std::atomic<int> counter{0};
  return (std::filesystem::path(::testing::TempDir()) /
          ("tokenize_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
           name))
      .string();
}

RunResult run_tokenize(const std::string& args, const std::string& input) {
  const std::string in = temp_path("in.jsonl"), out = temp_path("out.jsonl"),
                    err = temp_path("err.txt");
  std::ofstream(in, std::ios::binary) << input;
  const std::string command =
      std::string(TOKENIZE_BIN) + " " + args + " < '" + in + "' > '" + out + "' 2> '" + err + "'";
  const int raw = std::system(command.c_str());
  RunResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream o(out, std::ios::binary);
  for (std::string line; std::getline(o, line);) r.out_lines.push_back(line);
  r.err = test::read_text(err);
  return r;
}

const std::string kQwen3 = data_path("tests/data/tokenizer/qwen3/tokenizer.json");

TEST(Cli, EncodesLinesAndReportsBadOnesInPlace) {
  const std::string input =
      "{\"text\": \"Hello, world!\"}\n"
      "{\"text\": \"unterminated\n"
      "{\"ids\": [1, 2]}\n"
      "\n"
      "{\"text\": \"<|im_start|>user\\nHello!<|im_end|>\"}\n";
  const RunResult r = run_tokenize("--tokenizer '" + kQwen3 + "'", input);
  // Exit status 3 and one summary line: some lines got an error line.
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(r.err, "tokenize: stdin: 3 of 5 lines failed (the first: line 2)\n");
  ASSERT_EQ(r.out_lines.size(), 5u);
  EXPECT_EQ(json::parse(r.out_lines[0]),
            json::parse(R"({"ids":[9707,11,1879,0]})"));  // reference fixture
  for (size_t i : {1u, 2u, 3u}) {
    const json e = json::parse(r.out_lines[i]);
    EXPECT_EQ(e["line"], i + 1) << r.out_lines[i];
    EXPECT_NE(e["error"].get<std::string>().find("line " + std::to_string(i + 1)),
              std::string::npos)
        << r.out_lines[i];
  }
  EXPECT_NE(r.out_lines[2].find("expected a string field \\\"text\\\""), std::string::npos)
      << r.out_lines[2];
  // The JSON error says where, in the project's words (no library prefix).
  EXPECT_NE(r.out_lines[1].find("line 2: invalid JSON at byte"), std::string::npos)
      << r.out_lines[1];
  EXPECT_EQ(r.out_lines[1].find("json.exception"), std::string::npos) << r.out_lines[1];
  const auto rows =
      test::read_jsonl(data_path("tests/data/tokenizer/qwen3/reference_encodings.jsonl"));
  for (const auto& row : rows) {
    if (row["text"] == "<|im_start|>user\nHello!<|im_end|>") {
      EXPECT_EQ(json::parse(r.out_lines[4])["ids"], row["ids"]);
    }
  }
}

TEST(Cli, DecodesAndNamesUnknownIds) {
  const RunResult r =
      run_tokenize("--decode --tokenizer '" + kQwen3 + "'",
                   "{\"ids\": [9707, 11, 1879, 0]}\n{\"ids\": [5, 999999]}\n{\"ids\": [\"x\"]}\n"
                   "{\"ids\": []}\n");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(r.err, "tokenize: stdin: 2 of 4 lines failed (the first: line 2)\n");
  ASSERT_EQ(r.out_lines.size(), 4u);
  EXPECT_EQ(json::parse(r.out_lines[0]), json::parse(R"({"text":"Hello, world!"})"));
  EXPECT_EQ(json::parse(r.out_lines[1])["line"], 2);
  EXPECT_NE(r.out_lines[1].find("999999"), std::string::npos) << r.out_lines[1];
  EXPECT_NE(r.out_lines[2].find("ids[0] must be an integer"), std::string::npos) << r.out_lines[2];
  EXPECT_EQ(json::parse(r.out_lines[3]), json::parse(R"({"text":""})"));
}

TEST(Cli, AllReferenceEncodingsWithThreads) {
  const auto rows =
      test::read_jsonl(data_path("tests/data/tokenizer/qwen3/reference_encodings.jsonl"));
  std::string input;
  for (const auto& row : rows) input += json{{"text", row["text"]}}.dump() + "\n";
  for (const char* threads : {"1", "3"}) {
    const RunResult r =
        run_tokenize(std::string("--threads ") + threads + " --tokenizer '" + kQwen3 + "'", input);
    EXPECT_EQ(r.status, 0) << r.err;
    ASSERT_EQ(r.out_lines.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(json::parse(r.out_lines[i])["ids"], rows[i]["ids"]) << i;
  }
}

TEST(Cli, ReadsModelDirectoryAndPack) {
  const json golden = json::parse(test::read_text(data_path("samples/qwen3-sample/golden.json")));
  const json& c = golden["cases"][0];
  const std::string input = json{{"text", c["prompt"]}}.dump() + "\n";

  const RunResult dir =
      run_tokenize("--tokenizer '" + data_path("samples/qwen3-sample") + "'", input);
  EXPECT_EQ(dir.status, 0) << dir.err;
  ASSERT_EQ(dir.out_lines.size(), 1u);
  EXPECT_EQ(json::parse(dir.out_lines[0])["ids"], c["prompt_token_ids"]);

  // A pack is a zip with STORED entries; build a small one here.
  const std::string pack = temp_path("model.pack");
  const std::string tokenizer_text =
      test::read_text(data_path("samples/qwen3-sample/tokenizer.json"));
  const std::string other = "{}";
  int error = 0;
  zip_t* z = zip_open(pack.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  ASSERT_NE(z, nullptr);
  for (const auto& [name, data] :
       {std::pair<const char*, const std::string*>{"manifest.json", &other},
        {"tokenizer.json", &tokenizer_text}}) {
    zip_source_t* src = zip_source_buffer(z, data->data(), data->size(), 0);
    ASSERT_NE(src, nullptr);
    const zip_int64_t index = zip_file_add(z, name, src, ZIP_FL_OVERWRITE);
    ASSERT_GE(index, 0);
    ASSERT_EQ(zip_set_file_compression(z, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0), 0);
  }
  ASSERT_EQ(zip_close(z), 0);
  const RunResult packed = run_tokenize("--tokenizer '" + pack + "'", input);
  EXPECT_EQ(packed.status, 0) << packed.err;
  ASSERT_EQ(packed.out_lines.size(), 1u);
  EXPECT_EQ(json::parse(packed.out_lines[0])["ids"], c["prompt_token_ids"]);
}

void expect_fatal(const RunResult& r, const std::string& part) {
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out_lines.empty()) << "no partial output";
  EXPECT_EQ(r.err.rfind("tokenize: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  EXPECT_NE(r.err.find(part), std::string::npos) << r.err;
}

TEST(Cli, FatalErrorsGiveOneLineAndExitOne) {
  const std::string input = "{\"text\": \"a\"}\n";
  expect_fatal(run_tokenize("--tokenizer /nonexistent/tok.json", input), "/nonexistent/tok.json");
  expect_fatal(run_tokenize("", input), "--tokenizer: required flag missing");
  expect_fatal(run_tokenize("--tokenizer '" + kQwen3 + "' --bogus", input), "bogus");
  expect_fatal(run_tokenize("--tokenizer '" + kQwen3 + "' --threads -2", input), "--threads");
  const std::string bad = temp_path("bad.json");
  std::ofstream(bad) << R"({"model": {"type": "Unigram"}})";
  expect_fatal(run_tokenize("--tokenizer '" + bad + "'", input),
               "model type 'Unigram' is not supported");
  const std::string not_pack = temp_path("empty.pack");
  std::ofstream(not_pack) << "PK\x03\x04 not really a zip";
  expect_fatal(run_tokenize("--tokenizer '" + not_pack + "'", input), "empty.pack");
  // A FIFO (nobody writing to it) is refused at once instead of waiting
  // for a writer.
  const std::string fifo = temp_path("tok.fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_fatal(run_tokenize("--tokenizer '" + fifo + "'", input),
               "expected a tokenizer.json, model directory or .pack (a regular file), found a "
               "FIFO (named pipe)");
  expect_fatal(run_tokenize("--tokenizer /dev/null", input), "found a character device");
  // A model directory whose tokenizer.json is a FIFO or a link to a device
  // is refused alike, naming the file.
  const std::string fifo_dir = temp_path("fifo_model");
  std::filesystem::remove_all(fifo_dir);
  std::filesystem::create_directories(fifo_dir);
  ASSERT_EQ(::mkfifo((fifo_dir + "/tokenizer.json").c_str(), 0600), 0);
  expect_fatal(run_tokenize("--tokenizer '" + fifo_dir + "'", input),
               fifo_dir + "/tokenizer.json: expected a regular file, found a FIFO (named pipe)");
  const std::string zero_dir = temp_path("zero_model");
  std::filesystem::remove_all(zero_dir);
  std::filesystem::create_directories(zero_dir);
  std::filesystem::create_symlink("/dev/zero", zero_dir + "/tokenizer.json");
  expect_fatal(run_tokenize("--tokenizer '" + zero_dir + "'", input),
               "expected a regular file, found a character device");
}

TEST(Cli, HelpDescribesTheProgram) {
  const RunResult r = run_tokenize("--help", "");
  EXPECT_EQ(r.status, 0);
  std::string all;
  for (const auto& l : r.out_lines) all += l + "\n";
  EXPECT_NE(all.find("--tokenizer"), std::string::npos) << all;
  EXPECT_NE(all.find("--decode"), std::string::npos) << all;
  EXPECT_NE(all.find("Exit status"), std::string::npos) << all;
}

// Help lost to a full device is an error (exit 1, one line), not exit 0.
// note: the subshell makes /dev/full stdout; run_tokenize's own redirection
// would otherwise come after it and win.
TEST(Cli, HelpToFullStdoutIsAnError) {
  const std::string err = temp_path("help_err.txt");
  std::string command = "(";
  command += TOKENIZE_BIN;
  command += " --help > /dev/full) 2> '" + err + "'";
  const int raw = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) == 1) << raw;
  EXPECT_EQ(test::read_text(err),
            "tokenize: cannot write to standard output: No space left on device\n");
}

}  // namespace
}  // namespace qtk
