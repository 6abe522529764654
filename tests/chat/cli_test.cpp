// Chat requests through the programs: tokenize --chat against the reference
// renderings, convert packing chat_template.jinja, and generate running
// "messages" lines (template from the pack or --chat-template, per-line
// errors when there is none or the template raises).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qtk {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string data_path(const std::string& rel) { return std::string(QTK_SOURCE_DIR) + "/" + rel; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<ojson> read_jsonl(const std::string& path) {
  std::vector<ojson> rows;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(ojson::parse(line));
  return rows;
}

std::string work_dir() {
  static const std::string dir = [] {
    const fs::path d = fs::path(QTK_TEST_WORK_DIR) / ("chat_cli_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

struct RunResult {
  int status = -1;
  std::string out, err;
};

RunResult run(const std::string& command_line, const std::string& input = "") {
  static std::atomic<int> n{0};
  const std::string base = work_dir() + "/cmd" + std::to_string(n++);
  write_text(base + ".in", input);
  const std::string cmd =
      command_line + " < '" + base + ".in' > '" + base + ".out' 2> '" + base + ".err'";
  const int raw = std::system(cmd.c_str());
  RunResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_text(base + ".out");
  r.err = read_text(base + ".err");
  return r;
}

std::vector<ojson> lines_of(const std::string& text) {
  std::vector<ojson> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(ojson::parse(line));
  return rows;
}

const std::vector<ojson>& cases() {
  static const std::vector<ojson> c = [] {
    std::vector<ojson> out;
    for (auto& e : ojson::parse(read_text(data_path("tests/data/chat/cases.json"))))
      out.push_back(e);
    return out;
  }();
  return c;
}

// reference.jsonl rows of one template, by case id.
std::map<std::string, ojson> reference_of(const std::string& tmpl) {
  std::map<std::string, ojson> out;
  for (const ojson& r : read_jsonl(data_path("tests/data/chat/reference.jsonl")))
    if (r["template"] == tmpl) out[r["id"].get<std::string>()] = r;
  return out;
}

// The request lines of every case: id, messages, tools, add_generation_prompt, enable_thinking.
std::string request_lines() {
  std::string s;
  for (const ojson& c : cases()) {
    ojson line;
    for (const char* k : {"id", "messages", "tools", "add_generation_prompt", "enable_thinking"})
      if (c.contains(k)) line[k] = c[k];
    s += line.dump() + "\n";
  }
  return s;
}

// tokenize's exit status for every case under `tmpl`: 3 when the template
// refuses some case (that line is an error line), else 0.
int status_for(const std::string& tmpl) {
  for (const auto& [id, r] : reference_of(tmpl))
    if (r.contains("error")) return 3;
  return 0;
}

const std::string kQwen3Tokenizer = data_path("tests/data/tokenizer/qwen3/tokenizer.json");

void expect_matches_reference(const std::vector<ojson>& out, const std::string& tmpl) {
  const auto ref = reference_of(tmpl);
  ASSERT_EQ(out.size(), cases().size());
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string id = cases()[i]["id"].get<std::string>();
    SCOPED_TRACE(tmpl + " " + id);
    EXPECT_EQ(out[i]["id"], id);
    const ojson& r = ref.at(id);
    if (r.contains("error")) {
      ASSERT_TRUE(out[i].contains("error")) << out[i].dump();
      // the exception as transformers printed it, e.g. "TemplateError: <message>"
      EXPECT_NE(out[i]["error"].get<std::string>().find(r["error"].get<std::string>()),
                std::string::npos)
          << out[i]["error"];
    } else {
      ASSERT_TRUE(out[i].contains("text")) << out[i].dump();
      EXPECT_EQ(out[i]["text"], r["text"]);
      EXPECT_EQ(out[i]["ids"], r["ids"]);
    }
  }
}

TEST(TokenizeChat, EveryReferenceCaseWithChatTemplateFlag) {
  for (const char* tmpl : {"qwen3", "qwen3_5", "qwen3_thinking_2507"}) {
    const RunResult r = run(std::string(TOKENIZE_BIN) + " --tokenizer '" + kQwen3Tokenizer +
                                "' --chat --chat-template '" +
                                data_path(std::string("tests/data/chat/") + tmpl + ".jinja") + "'",
                            request_lines());
    ASSERT_EQ(r.status, status_for(tmpl)) << r.err;
    if (r.status == 0) {
      EXPECT_EQ(r.err, "");
    }
    expect_matches_reference(lines_of(r.out), tmpl);
  }
}

TEST(TokenizeChat, TemplateOfTheQwen3TokenizerConfig) {
  // tests/data/tokenizer/qwen3/tokenizer_config.json carries Qwen3's own template
  const RunResult r = run(
      std::string(TOKENIZE_BIN) + " --tokenizer '" + kQwen3Tokenizer + "' --chat", request_lines());
  ASSERT_EQ(r.status, status_for("qwen3")) << r.err;
  expect_matches_reference(lines_of(r.out), "qwen3");
}

TEST(TokenizeChat, InputFileArgument) {
  // main's INPUT argument works with --chat as stdin does
  const std::string in = work_dir() + "/chat_requests.jsonl";
  write_text(in, request_lines());
  const RunResult r = run(
      std::string(TOKENIZE_BIN) + " --tokenizer '" + kQwen3Tokenizer + "' --chat '" + in + "'", "");
  ASSERT_EQ(r.status, status_for("qwen3")) << r.err;
  expect_matches_reference(lines_of(r.out), "qwen3");
}

TEST(TokenizeChat, TemplateFromTheModelDirectory) {
  // tokenizer_config.json's "chat_template" (as older checkpoints carry it)
  const std::string dir = work_dir() + "/model_config_template";
  fs::create_directories(dir);
  fs::copy_file(kQwen3Tokenizer, dir + "/tokenizer.json");
  write_text(dir + "/tokenizer_config.json",
             ojson{{"chat_template", read_text(data_path("tests/data/chat/qwen3.jinja"))}}.dump());
  RunResult r =
      run(std::string(TOKENIZE_BIN) + " --tokenizer '" + dir + "' --chat", request_lines());
  ASSERT_EQ(r.status, status_for("qwen3")) << r.err;
  expect_matches_reference(lines_of(r.out), "qwen3");
  // chat_template.jinja beside it wins, as in transformers
  fs::copy_file(data_path("tests/data/chat/qwen3_5.jinja"), dir + "/chat_template.jinja");
  r = run(std::string(TOKENIZE_BIN) + " --tokenizer '" + dir + "/tokenizer.json' --chat",
          request_lines());
  ASSERT_EQ(r.status, status_for("qwen3_5")) << r.err;
  expect_matches_reference(lines_of(r.out), "qwen3_5");
}

TEST(TokenizeChat, BadLinesAndMissingTemplate) {
  const RunResult r =
      run(std::string(TOKENIZE_BIN) + " --tokenizer '" + kQwen3Tokenizer +
              "' --chat --chat-template '" + data_path("tests/data/chat/qwen3.jinja") + "'",
          "{\"id\": \"a\", \"messages\": 5}\n"
          "{\"id\": \"b\", \"prompt\": \"x\"}\n"
          "not json\n"
          "{\"id\": \"c\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
          "\"tools\": [\"not a schema\"]}\n"
          "{\"id\": \"d\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
          "\"chat_template_kwargs\": {\"enable_thinking\": false}}\n");
  ASSERT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(r.err, "tokenize: stdin: 4 of 5 lines failed (the first: line 1)\n");
  const auto out = lines_of(r.out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_NE(out[0]["error"].get<std::string>().find("field 'messages'"), std::string::npos)
      << out[0];
  EXPECT_NE(out[1]["error"].get<std::string>().find("messages"), std::string::npos) << out[1];
  EXPECT_EQ(out[2]["id"], 3);
  EXPECT_NE(out[2]["error"].get<std::string>().find("line 3: invalid JSON at byte"),
            std::string::npos)
      << out[2];
  EXPECT_EQ(out[2]["error"].get<std::string>().find("json.exception"), std::string::npos) << out[2];
  EXPECT_NE(out[3]["error"].get<std::string>().find("field 'tools'[0]"), std::string::npos)
      << out[3];
  // chat_template_kwargs reach the template: the same text as the reference's enable_thinking=false
  // case
  const auto ref = reference_of("qwen3");
  ASSERT_TRUE(out[4].contains("text")) << out[4];
  EXPECT_NE(out[4]["text"].get<std::string>().find("<think>\n\n</think>\n\n"), std::string::npos);

  // no template anywhere: one line on stderr, exit 1, nothing on stdout
  const std::string bare = work_dir() + "/bare_tokenizer";
  fs::create_directories(bare);
  fs::copy_file(kQwen3Tokenizer, bare + "/tokenizer.json", fs::copy_options::overwrite_existing);
  const RunResult none =
      run(std::string(TOKENIZE_BIN) + " --tokenizer '" + bare + "' --chat", "{\"messages\": []}\n");
  EXPECT_EQ(none.status, 1);
  EXPECT_EQ(none.out, "");
  EXPECT_NE(none.err.find("no chat template"), std::string::npos) << none.err;
  // a template that does not parse: its file, line and column
  write_text(work_dir() + "/bad.jinja", "ok\n{% if x %}\n{% endfor %}");
  const RunResult bad = run(std::string(TOKENIZE_BIN) + " --tokenizer '" + kQwen3Tokenizer +
                                "' --chat --chat-template '" + work_dir() + "/bad.jinja'",
                            "{\"messages\": []}\n");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("bad.jinja line 3"), std::string::npos) << bad.err;
}

// Integers in a chat request are printed by the template as Python prints
// them: every digit of a 64-bit signed one; a larger one (Python's are
// unbounded, ours would print as a float: another prompt) is the line's
// error, as it would be in generate.
TEST(TokenizeChat, IntegersPastSixtyFourBitsAreTheLinesError) {
  auto call = [](const std::string& v) {
    return "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
           "\"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\", "
           "\"function\": {\"name\": \"f\", \"arguments\": {\"v\": " +
           v + "}}}]}], \"add_generation_prompt\": false}\n";
  };
  const RunResult r =
      run(std::string(TOKENIZE_BIN) + " --tokenizer '" + kQwen3Tokenizer +
              "' --chat --chat-template '" + data_path("tests/data/chat/qwen3.jinja") + "'",
          call("9223372036854775807") + call("-9223372036854775808") + call("9223372036854775808") +
              call("18446744073709551616") + call("-9223372036854775809") + call("1e26"));
  ASSERT_EQ(r.status, 3) << r.err;
  const auto out = lines_of(r.out);
  ASSERT_EQ(out.size(), 6u);
  for (const auto& [i, digits] : {std::pair{0, "9223372036854775807"},
                                  std::pair{1, "-9223372036854775808"}, std::pair{5, "1e+26"}}) {
    ASSERT_TRUE(out[i].contains("text")) << out[i];
    EXPECT_NE(out[i]["text"].get<std::string>().find(std::string("{\"v\": ") + digits + "}"),
              std::string::npos)
        << out[i];
  }
  EXPECT_NE(out[2]["error"].get<std::string>().find(
                "integer 9223372036854775808 is past the template engine's 64-bit signed integers"),
            std::string::npos)
      << out[2];
  for (const auto& [i, digits] :
       {std::pair{3, "18446744073709551616"}, std::pair{4, "-9223372036854775809"}}) {
    ASSERT_TRUE(out[i].contains("error")) << out[i];
    EXPECT_NE(out[i]["error"].get<std::string>().find(std::string("the integer ") + digits +
                                                      " does not fit 64 bits"),
              std::string::npos)
        << out[i];
  }
}

TEST(TokenizeChat, DeeplyNestedLineIsRefused) {
  // a million levels: refused by its depth before any recursive copy
  const std::string deep = "{\"id\": \"deep\", \"messages\": " + std::string(1000000, '[') +
                           std::string(1000000, ']') + "}\n";
  const RunResult r =
      run(std::string(TOKENIZE_BIN) + " --tokenizer '" + kQwen3Tokenizer + "' --chat", deep);
  ASSERT_EQ(r.status, 3) << r.err;
  const auto out = lines_of(r.out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(out[0]["error"].get<std::string>().find("nested at most 128 levels deep"),
            std::string::npos)
      << out[0];
}

TEST(TokenizeChat, BadFlags) {
  const std::string tok = std::string(TOKENIZE_BIN) + " --tokenizer '" + kQwen3Tokenizer + "'";
  const struct {
    std::string flags, needle;
  } cases[] = {
      {" --chat --decode", "--chat and --decode"},
      {" --chat-template x.jinja", "only used with --chat"},
      {" --chat --chat-template /nonexistent/t.jinja", "/nonexistent/t.jinja"},
      {" --chat --chat-template ''", "--chat-template: expected a file name, found an empty value"},
      // An existing non-file is named, never "no such file"; a FIFO is not
      // opened (that would wait for a writer).
      {" --chat --chat-template '" + work_dir() + "/t.fifo'",
       "t.fifo: expected a regular file, found a FIFO (named pipe)"},
      {" --chat --chat-template /dev/null",
       "--chat-template /dev/null: expected a regular file, found a character device"},
      {" --chat --chat-template '" + work_dir() + "'",
       "expected a regular file, found a directory"},
  };
  std::filesystem::remove(work_dir() + "/t.fifo");
  ASSERT_EQ(::mkfifo((work_dir() + "/t.fifo").c_str(), 0600), 0);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.flags);
    const RunResult r = run(tok + c.flags, "{\"messages\": []}\n");
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// --- generate ---

std::string convert_dir(const std::string& dir, const std::string& name) {
  const std::string pack = work_dir() + "/" + name + ".pack";
  const RunResult r = run(std::string(QTK_CONVERT_BIN) + " '" + dir + "' '" + pack + "'");
  EXPECT_EQ(r.status, 0) << r.err;
  return pack;
}

// samples/qwen3-sample with qwen3.jinja as chat_template.jinja.
const std::string& sample_pack_with_template() {
  static const std::string pack = [] {
    const std::string dir = work_dir() + "/qwen3-sample-chat";
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(data_path("samples/qwen3-sample")))
      fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
    fs::copy_file(data_path("tests/data/chat/qwen3.jinja"), dir + "/chat_template.jinja");
    return convert_dir(dir, "qwen3-sample-chat");
  }();
  return pack;
}

RunResult generate(const std::string& pack, const std::string& lines, const std::string& out,
                   const std::string& extra = "") {
  const std::string in = out + ".in.jsonl";
  write_text(in, lines);
  return run(std::string(QTK_GENERATE_BIN) + " --model '" + pack + "' --batch '" + in +
             "' --out '" + out + "' --threads 1 --max-tokens 3 " + extra);
}

ojson case_line(const std::string& id, const std::string& new_id) {
  for (const ojson& c : cases()) {
    if (c["id"] != id) continue;
    ojson line;
    line["id"] = new_id;
    for (const char* k : {"messages", "tools", "add_generation_prompt", "enable_thinking"})
      if (c.contains(k)) line[k] = c[k];
    return line;
  }
  throw std::runtime_error("no case " + id);
}

TEST(GenerateChat, MessagesRenderedWithThePacksTemplate) {
  const std::string& pack = sample_pack_with_template();
  const auto ref = reference_of("qwen3");
  // each chat line next to a plain prompt line holding the reference text:
  // both must give the same prompt ids and the same greedy tokens
  std::string lines;
  const std::vector<std::string> ids = {"multi_turn", "tool_call_dict_args", "unicode_cjk_emoji"};
  for (const std::string& id : ids) {
    lines += case_line(id, "chat_" + id).dump() + "\n";
    lines += ojson{{"id", "text_" + id}, {"prompt", ref.at(id)["text"]}}.dump() + "\n";
  }
  const std::string out = work_dir() + "/gen_chat.jsonl";
  const RunResult r = generate(pack, lines, out);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto res = read_jsonl(out);
  ASSERT_EQ(res.size(), 2 * ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const ojson& chat = res[2 * i];
    const ojson& text = res[2 * i + 1];
    SCOPED_TRACE(ids[i]);
    ASSERT_FALSE(chat.contains("error")) << chat;
    EXPECT_EQ(chat["prompt"], ref.at(ids[i])["text"]);
    EXPECT_EQ(chat["prompt_token_ids"], text["prompt_token_ids"]);
    EXPECT_EQ(chat["output_token_ids"], text["output_token_ids"]);
    EXPECT_FALSE(text.contains("prompt"));  // only chat lines echo the rendered prompt
  }
  const ojson meta = ojson::parse(read_text(out + ".meta.json"));
  EXPECT_NE(
      meta["settings"]["chat_template"]["source"].get<std::string>().find("chat_template.jinja"),
      std::string::npos)
      << meta.dump();
}

TEST(GenerateChat, NoTemplateIsAPerLineErrorAndTheFlagSuppliesOne) {
  const std::string pack = convert_dir(data_path("samples/qwen3-sample"), "qwen3-sample-plain");
  const std::string lines = case_line("system_user", "chat").dump() + "\n" +
                            ojson{{"id", "plain"}, {"prompt", "Hello"}}.dump() + "\n";
  const std::string out = work_dir() + "/gen_plain.jsonl";
  RunResult r = generate(pack, lines, out);
  ASSERT_EQ(r.status, 3) << r.err;  // completed, with a failed line
  auto res = read_jsonl(out);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_NE(res[0]["error"].get<std::string>().find("no chat template"), std::string::npos)
      << res[0];
  EXPECT_FALSE(res[1].contains("error")) << res[1];

  const std::string out2 = work_dir() + "/gen_flag.jsonl";
  r = generate(pack, lines, out2,
               "--chat-template '" + data_path("tests/data/chat/qwen3_thinking_2507.jinja") + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  res = read_jsonl(out2);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0]["prompt"], reference_of("qwen3_thinking_2507").at("system_user")["text"]);
}

TEST(GenerateChat, TemplateErrorsArePerLine) {
  const std::string& pack = sample_pack_with_template();
  const std::string out = work_dir() + "/gen_raise.jsonl";
  // qwen3_5's own raise_exception, through --chat-template over the pack's one
  const std::string lines = case_line("system_not_first", "raises").dump() + "\n" +
                            case_line("user_single", "fine").dump() + "\n" +
                            "{\"id\": \"both\", \"messages\": [], \"prompt\": \"x\"}\n";
  RunResult r = generate(pack, lines, out,
                         "--chat-template '" + data_path("tests/data/chat/qwen3_5.jinja") + "'");
  ASSERT_EQ(r.status, 3) << r.err;  // completed, with failed lines
  const auto res = read_jsonl(out);
  ASSERT_EQ(res.size(), 3u);
  EXPECT_NE(res[0]["error"].get<std::string>().find(
                reference_of("qwen3_5").at("system_not_first")["error"].get<std::string>()),
            std::string::npos)
      << res[0];
  EXPECT_EQ(res[1]["prompt"], reference_of("qwen3_5").at("user_single")["text"]);
  EXPECT_NE(res[2]["error"].get<std::string>().find("both 'messages' and 'prompt'"),
            std::string::npos)
      << res[2];

  // a template that renders no text says so (not only "empty prompt")
  write_text(work_dir() + "/empty.jinja", "{% if false %}x{% endif %}");
  const std::string out_empty = work_dir() + "/gen_empty.jsonl";
  r = generate(pack, case_line("user_single", "e").dump() + "\n", out_empty,
               "--chat-template '" + work_dir() + "/empty.jinja'");
  ASSERT_EQ(r.status, 3) << r.err;
  EXPECT_NE(read_jsonl(out_empty).at(0)["error"].get<std::string>().find(
                "the chat template rendered these messages as no text"),
            std::string::npos)
      << read_text(out_empty);

  // a --chat-template that does not parse stops the run: one line, no output
  write_text(work_dir() + "/broken.jinja", "{{ x");
  const std::string out2 = work_dir() + "/gen_broken.jsonl";
  r = generate(pack, lines, out2, "--chat-template '" + work_dir() + "/broken.jinja'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("broken.jinja line 1"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out2));
  // one that does not exist: the same
  r = generate(pack, lines, out2, "--chat-template /nonexistent/t.jinja");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent/t.jinja"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out2));
}

// With main's request contract (issue 20): every chat field is known, other
// fields are still refused; a chat line's output keeps its "prompt" with
// --margins and --logprobs; --resume checks the template.
TEST(GenerateChat, FieldContractOutputFlagsAndResume) {
  const std::string& pack = sample_pack_with_template();
  ojson chat = case_line("user_single", "chat");
  chat["add_vision_id"] = false;  // a chat field beyond the common ones
  chat["chat_template_kwargs"] = ojson::object();
  ojson unknown = case_line("user_single", "unknown");
  unknown["temperature"] = 0.5;
  const std::string lines = chat.dump() + "\n" + unknown.dump() + "\n" +
                            ojson{{"id", "plain"}, {"prompt", "Hello"}}.dump() + "\n";
  const std::string out = work_dir() + "/gen_contract.jsonl";
  RunResult r = generate(pack, lines, out, "--margins --logprobs 2");
  ASSERT_EQ(r.status, 3) << r.err;  // the unknown field fails its line
  auto res = read_jsonl(out);
  ASSERT_EQ(res.size(), 3u);
  ASSERT_FALSE(res[0].contains("error")) << res[0];
  EXPECT_EQ(res[0]["prompt"], reference_of("qwen3").at("user_single")["text"]);
  EXPECT_EQ(res[0]["top1_margin"].size(), res[0]["output_token_ids"].size()) << res[0];
  EXPECT_EQ(res[0]["logprobs"].size(), res[0]["output_token_ids"].size()) << res[0];
  EXPECT_NE(res[1]["error"].get<std::string>().find("'temperature'"), std::string::npos) << res[1];
  EXPECT_FALSE(res[2].contains("prompt")) << res[2];
  const ojson meta = ojson::parse(read_text(out + ".meta.json"));
  ASSERT_TRUE(meta["settings"]["chat_template"].is_object()) << meta.dump();
  const std::string before = read_text(out);

  // the same run resumes (nothing left to do); another template is refused
  r = generate(pack, lines, out, "--margins --logprobs 2 --resume");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(read_text(out), before);
  r = generate(pack, lines, out,
               "--margins --logprobs 2 --resume --chat-template '" +
                   data_path("tests/data/chat/qwen3_5.jinja") + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("setting 'chat_template'"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(out), before);
  // one template named by another path (a copy of it) is the same template
  const std::string copy_a = work_dir() + "/tmpl_a.jinja", copy_b = work_dir() + "/tmpl_b.jinja";
  fs::copy_file(data_path("tests/data/chat/qwen3.jinja"), copy_a,
                fs::copy_options::overwrite_existing);
  fs::copy_file(copy_a, copy_b, fs::copy_options::overwrite_existing);
  const std::string out3 = work_dir() + "/gen_contract_paths.jsonl";
  r = generate(pack, lines, out3, "--chat-template '" + copy_a + "'");
  ASSERT_EQ(r.status, 3) << r.err;
  const std::string first = read_text(out3);
  r = generate(pack, lines, out3, "--resume --chat-template '" + copy_b + "'");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(read_text(out3), first);

  // a batch without chat lines records no template, and resumes as before
  const std::string plain_out = work_dir() + "/gen_contract_plain.jsonl";
  const std::string plain = ojson{{"id", "plain"}, {"prompt", "Hello"}}.dump() + "\n";
  r = generate(pack, plain, plain_out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(
      ojson::parse(read_text(plain_out + ".meta.json"))["settings"]["chat_template"].is_null());
  r = generate(pack, plain, plain_out,
               "--resume --chat-template '" + data_path("tests/data/chat/qwen3_5.jinja") + "'");
  EXPECT_EQ(r.status, 0) << r.err;
}

}  // namespace
}  // namespace qtk
