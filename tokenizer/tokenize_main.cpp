// tokenize: JSONL text -> token ids (or ids -> text with --decode).
//
//   tokenize --tokenizer PATH [--decode | --chat [--chat-template FILE]] [--threads N]
//            [INPUT | - (stdin, the default)] > out.jsonl
//
// PATH is a tokenizer.json, a model directory holding one, or a .pack file
// (a zip whose STORED entry "tokenizer.json" is read with libzip).
// Each input line {"text": "..."} gives {"ids": [...]}; with --decode each
// {"ids": [...]} gives {"text": "..."}. A bad line gives
// {"line": N, "error": "..."} (N counts from 1) and the other lines still come
// out, in order. Exit status: 0 when every line has a result; 3 when some line
// got an error line (one summary line on stderr); 1 for bad flags or an
// unusable tokenizer (then nothing is written to stdout).
//
// With --chat, each line is a chat request ({"id", "messages", "tools",
// "add_generation_prompt", "enable_thinking", "chat_template_kwargs"})
// rendered with the model's chat template (PATH's chat_template.jinja or
// tokenizer_config.json "chat_template", or --chat-template FILE) and
// written as {"id", "text", "ids"} or {"id", "error"}.
#include <sys/stat.h>
#include <zip.h>

#include <fmt/format.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"  // describe_file_type
#include "core/read_file.h"
#include "core/stdout_check.h"
#include "core/utf8.h"
#include "loaders/cli_args.h"
#include "tokenizer/chat/chat_request.h"
#include "tokenizer/tokenize_chat.h"
#include "tokenizer/tokenizer.h"

namespace {

using qtk::fail;

std::string read_pack_entry(const std::string& path, const char* entry, bool* present = nullptr) {
  int error_code = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_RDONLY, &error_code);
  if (!archive) {
    zip_error_t error;
    zip_error_init_with_code(&error, error_code);
    const std::string message = zip_error_strerror(&error);
    zip_error_fini(&error);
    fail("{}: cannot open pack (expected a zip archive): {}", path, message);
  }
  std::string data;
  try {
    const zip_int64_t index = zip_name_locate(archive, entry, 0);
    if (present != nullptr) *present = index >= 0;
    if (index < 0 && present != nullptr) {
      zip_discard(archive);
      return {};
    }
    if (index < 0)
      fail("{}: pack has no entry '{}' (expected the model's tokenizer.json)", path, entry);
    zip_stat_t stat;
    if (zip_stat_index(archive, static_cast<zip_uint64_t>(index), 0, &stat) != 0 ||
        !(stat.valid & ZIP_STAT_SIZE)) {
      fail("{}: cannot stat pack entry '{}': {}", path, entry, zip_strerror(archive));
    }
    zip_file_t* file = zip_fopen_index(archive, static_cast<zip_uint64_t>(index), 0);
    if (!file) fail("{}: cannot open pack entry '{}': {}", path, entry, zip_strerror(archive));
    data.resize(stat.size);
    const zip_int64_t got = zip_fread(file, data.data(), stat.size);
    zip_fclose(file);
    if (got < 0 || static_cast<zip_uint64_t>(got) != stat.size) {
      fail("{}: pack entry '{}' is truncated (expected {} bytes, read {})", path, entry, stat.size,
           got);
    }
  } catch (...) {
    zip_discard(archive);
    throw;
  }
  zip_discard(archive);
  return data;
}

qtk::Tokenizer load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string json_path = (fs::path(path) / "tokenizer.json").string();
    if (!fs::exists(json_path, ec)) fail("{}: model directory has no tokenizer.json", path);
    // note: a FIFO there would block the open until a writer came, and a
    // link to /dev/zero would read without end; refuse what is not a file.
    struct stat jst {};
    if (::stat(json_path.c_str(), &jst) == 0 && !S_ISREG(jst.st_mode))
      fail("{}: expected a regular file, found {}", json_path,
           qtk::describe_file_type(jst.st_mode));
    return qtk::Tokenizer::from_file(json_path);
  }
  if (!fs::exists(path, ec))
    fail("{}: no such file or directory (expected a tokenizer.json, model directory or .pack)",
         path);
  // note: a FIFO would block the open below until a writer came, and the
  // file is read twice (its magic, then whole).
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail("{}: expected a tokenizer.json, model directory or .pack (a regular file), found {}", path,
         qtk::describe_file_type(st.st_mode));
  char magic[4] = {};
  {
    std::ifstream in(path, std::ios::binary);
    in.read(magic, 4);
  }
  if (std::string_view(magic, 4) == std::string_view("PK\x03\x04", 4)) {
    return qtk::Tokenizer::from_json_text(read_pack_entry(path, "tokenizer.json"),
                                          path + ":tokenizer.json");
  }
  return qtk::Tokenizer::from_file(path);
}

// ---- tokenize --chat (issue 25) ----
bool is_pack(const std::string& path) {
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(magic, 4);
  return std::string_view(magic, 4) == std::string_view("PK\x03\x04", 4);
}

std::optional<std::string> read_if_exists(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
  return qtk::read_file_text(p.string(), "it");
}

// The chat template and special tokens for --chat: --chat-template FILE, or
// the chat_template.jinja / tokenizer_config.json beside PATH's
// tokenizer.json (in the directory, the pack, or next to the file).
qtk::ChatLineContext load_chat(const std::string& path, const std::string& template_file,
                               std::optional<qtk::jinja::Template>& tmpl) {
  namespace fs = std::filesystem;
  std::optional<std::string> config_text, jinja_text;
  std::string where;
  std::error_code ec;
  if (is_pack(path) && !fs::is_directory(path, ec)) {
    bool present = false;
    std::string t = read_pack_entry(path, "tokenizer_config.json", &present);
    if (present) config_text = std::move(t);
    t = read_pack_entry(path, "chat_template.jinja", &present);
    if (present) jinja_text = std::move(t);
    where = path + ":";
  } else {
    const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
    config_text = read_if_exists(dir / "tokenizer_config.json");
    jinja_text = read_if_exists(dir / "chat_template.jinja");
    where = (dir / "").string();
  }
  std::optional<nlohmann::json> config;
  if (config_text) {
    config = nlohmann::json::parse(*config_text, nullptr, false);
    if (config->is_discarded() || !config->is_object()) {
      fail("{}tokenizer_config.json: malformed JSON (expected an object)", where);
    }
  }
  qtk::ChatLineContext c;
  c.special_tokens = qtk::chat::special_tokens_from_config(config ? &*config : nullptr);
  std::optional<std::string> text;
  std::string source;
  if (!template_file.empty()) {
    // note: stat, not open, first: a FIFO would block the open until a
    // writer came; a device or directory is named, not "no such file".
    struct stat tst {};
    if (::stat(template_file.c_str(), &tst) != 0) {
      if (errno == ENOENT) fail("--chat-template {}: no such file", template_file);
      fail("--chat-template {}: {}", template_file, std::strerror(errno));
    }
    if (!S_ISREG(tst.st_mode))
      fail("--chat-template {}: expected a regular file, found {}", template_file,
           qtk::describe_file_type(tst.st_mode));
    text = read_if_exists(template_file);
    if (!text) fail("--chat-template {}: no such file", template_file);
    source = template_file;
  } else {
    text = qtk::chat::template_from_config(config ? &*config : nullptr,
                                           where + "tokenizer_config.json", jinja_text);
    source = jinja_text ? where + "chat_template.jinja" : where + "tokenizer_config.json";
    if (!text) {
      fail(
          "{}: no chat template (no chat_template.jinja, no 'chat_template' in "
          "tokenizer_config.json); give one with --chat-template FILE",
          path);
    }
  }
  try {
    tmpl = qtk::jinja::Template::parse(*text, source);
  } catch (const qtk::jinja::TemplateError& e) {
    fail("{}", e.what());
  }
  c.tmpl = &*tmpl;
  return c;
}
// ---- end tokenize --chat ----

// Lines of stdin, read with fread in large blocks.
// note: std::getline on std::cin reads a character at a time through stdio,
// which takes a lock per character once the process has threads: it made
// --threads 2 slower than one thread.
class LineReader {
 public:
  explicit LineReader(std::FILE* in, std::string name) : in_(in), name_(std::move(name)) {}
  bool next(std::string& line) {
    line.clear();
    for (;;) {
      const size_t newline = buffer_.find('\n', pos_);
      if (newline != std::string::npos) {
        line.append(buffer_, pos_, newline - pos_);
        pos_ = newline + 1;
        return true;
      }
      line.append(buffer_, pos_, std::string::npos);
      pos_ = 0;
      buffer_.resize(kBlock);
      const size_t got = std::fread(buffer_.data(), 1, kBlock, in_);
      buffer_.resize(got);
      if (got == 0) {
        if (std::ferror(in_)) qtk::fail_errno(fmt::format("{}: cannot read", name_));
        return !line.empty();  // a last line without '\n'
      }
    }
  }

 private:
  static constexpr size_t kBlock = size_t{1} << 20;
  std::FILE* in_;
  std::string name_;
  std::string buffer_;
  size_t pos_ = 0;
};

qtk::TokenizedLine error_line(size_t line_number, const std::string& message,
                              const nlohmann::json* id = nullptr) {
  nlohmann::json j = {{"line", line_number}, {"error", message}};
  if (id != nullptr) j["id"] = *id;
  return {j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), true};
}

// An input line's "id" (a string or an integer), passed through to its
// output line so that results can be matched without counting lines.
const nlohmann::json* id_of(const nlohmann::json& input) {
  if (!input.is_object()) return nullptr;
  auto it = input.find("id");
  if (it == input.end() || !(it->is_string() || it->is_number_integer())) return nullptr;
  return &*it;
}

qtk::TokenizedLine with_id(const nlohmann::json* id, const std::string& body) {
  if (id == nullptr) return {"{" + body + "}", false};
  return {"{\"id\":" + id->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "," +
              body + "}",
          false};
}

qtk::TokenizedLine process_line(const qtk::Tokenizer& tokenizer, bool decode,
                                const std::string& line, size_t line_number) {
  // note: a raw NUL byte is never valid JSON; the parser would stop there
  // and drop the rest of the line silently.
  if (const size_t nul = line.find('\0'); nul != std::string::npos) {
    return error_line(line_number, fmt::format("line {}: invalid JSON: a raw NUL byte at byte {}",
                                               line_number, nul + 1));
  }
  nlohmann::json input;
  try {
    // note: generate's strict parse: UTF-8 checked, duplicate keys and
    // nesting past 128 levels refused, messages that say where.
    input = qtk::parse_json_strict(line, fmt::format("line {}", line_number),
                                   qtk::WideIntegers::kRefuse);
  } catch (const qtk::Error& e) {
    return error_line(line_number, e.what());
  }
  const nlohmann::json* id = id_of(input);
  try {
    if (input.is_object() && input.contains("id") && id == nullptr) {
      const nlohmann::json& v = input["id"];
      fail("line {}: field 'id': expected a string or an integer, found {}", line_number,
           v.is_number() ? v.dump() : std::string(v.type_name()));
    }
    if (!input.is_object()) {
      fail("line {}: expected a JSON object with \"{}\", found {}", line_number,
           decode ? "ids" : "text", input.type_name());
    }
    if (!decode) {
      const auto text = input.find("text");
      if (text == input.end() || !text->is_string()) {
        fail("line {}: expected a string field \"text\"", line_number);
      }
      const std::vector<int32_t> ids = tokenizer.encode(text->get_ref<const std::string&>());
      return with_id(id, fmt::format("\"ids\":[{}]", fmt::join(ids, ",")));
    }
    const auto ids_field = input.find("ids");
    if (ids_field == input.end() || !ids_field->is_array()) {
      fail("line {}: expected an array field \"ids\"", line_number);
    }
    std::vector<int32_t> ids;
    ids.reserve(ids_field->size());
    for (size_t k = 0; k < ids_field->size(); ++k) {
      const nlohmann::json& v = (*ids_field)[k];
      // note: a number past INT64_MAX is unsigned; get<int64_t> would wrap it.
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX) ||
          v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
        // note: only numbers are shown; dump() of a deeply nested value would
        // recurse until the stack overflows.
        fail("line {}: ids[{}] must be an integer token id, found {}", line_number, k,
             v.is_number() ? v.dump() : std::string(v.type_name()));
      }
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    const std::string text = nlohmann::json(tokenizer.decode(ids)).dump();
    return with_id(id, "\"text\":" + text);
  } catch (const qtk::Error& e) {
    std::string message = e.what();
    if (message.rfind("line ", 0) != 0) message = fmt::format("line {}: {}", line_number, message);
    return error_line(line_number, message, id);
  }
}

// The command line flags of tokenize.
cxxopts::Options tokenize_options() {
  cxxopts::Options options(
      "tokenize",
      "Encode JSONL {\"text\": ...} lines from INPUT (or stdin) to {\"ids\": [...]} lines on "
      "stdout, or decode\n"
      "{\"ids\": [...]} to {\"text\": ...} with --decode. Encoding adds no special tokens; "
      "decoding\n"
      "keeps them. A bad input line gives {\"line\": N, \"error\": \"...\"} and the other lines "
      "still\n"
      "come out, in input order. An input \"id\" (string or integer) is copied to its\n"
      "output line. Exit status 0 when every line has a result, 3 when some line got\n"
      "an error line (a summary on stderr), 1 for bad flags or an unusable tokenizer.");
  options.add_options()("tokenizer",
                        "tokenizer.json, a model directory holding one, or a .pack file",
                        cxxopts::value<std::string>())(
      "decode", "read {\"ids\": [...]} lines and write {\"text\": ...}")(
      "chat",
      "read chat requests {\"id\", \"messages\", ...} and write {\"id\", \"text\", \"ids\"}: the "
      "prompt the model's chat template makes of them")(
      "chat-template", "Jinja chat template file for --chat (default: the one beside PATH)",
      cxxopts::value<std::string>())("threads", "worker threads (0 = all cores)",
                                     cxxopts::value<std::string>()->default_value("1"))(
      "input", "the JSONL input file (default, or -: stdin)",
      cxxopts::value<std::string>()->default_value("-"))("h,help", "print this help");
  options.parse_positional({"input"});
  options.positional_help("[INPUT|-]");
  return options;
}

// What process_lines wrote: lines, and how many were error lines (the
// first one's number, 0 when none).
struct LineCounts {
  size_t lines = 0, errors = 0, first_error = 0;
};

// Writes process(line, line number) for every line of `input` to stdout, in
// input order, with `threads` threads (the calling thread one of them).
template <typename Process>
LineCounts process_lines(std::FILE* input, const std::string& input_name, size_t threads,
                         const Process& process) {
  // note: lines are processed in blocks so memory stays bounded on huge inputs
  // while threads share the work; output keeps the input order.
  constexpr size_t kBlockLines = 8192;
  std::vector<std::string> lines;
  std::vector<qtk::TokenizedLine> outputs;
  LineCounts counts;
  size_t first_line_number = 1;
  std::atomic<size_t> next{0};
  // note: lines are taken 64 at a time: one atomic per line and neighbouring
  // outputs written by different threads (false sharing) made threads slower.
  constexpr size_t kChunk = 64;
  auto work = [&] {
    for (size_t begin; (begin = next.fetch_add(kChunk)) < lines.size();) {
      const size_t end = std::min(begin + kChunk, lines.size());
      for (size_t i = begin; i < end; ++i) {
        outputs[i] = process(lines[i], first_line_number + i);
      }
    }
  };
  // note: the workers live for the whole run (each keeps its warm word
  // cache); two barriers per block hand them the block and collect it. The
  // main thread reads, works as one of the workers, and writes.
  const auto workers = static_cast<std::ptrdiff_t>(threads);
  std::barrier start(workers), finish(workers);
  bool stop = false;
  std::vector<std::thread> pool;
  for (std::ptrdiff_t t = 1; t < workers; ++t) {
    pool.emplace_back([&] {
      for (;;) {
        start.arrive_and_wait();
        if (stop) return;
        work();
        finish.arrive_and_wait();
      }
    });
  }
  LineReader reader(input, input_name);
  std::string line;
  for (bool more = true; more;) {
    lines.clear();
    while (lines.size() < kBlockLines && (more = reader.next(line))) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(std::move(line));
    }
    if (lines.empty()) break;
    outputs.assign(lines.size(), qtk::TokenizedLine());
    next.store(0);
    start.arrive_and_wait();
    work();
    finish.arrive_and_wait();
    std::string block;
    for (size_t i = 0; i < outputs.size(); ++i) {
      block += outputs[i].json;
      block += '\n';
      if (outputs[i].error && counts.errors++ == 0) counts.first_error = first_line_number + i;
    }
    std::fwrite(block.data(), 1, block.size(), stdout);
    first_line_number += lines.size();
    counts.lines += lines.size();
  }
  stop = true;
  start.arrive_and_wait();
  for (std::thread& t : pool) t.join();
  return counts;
}

int run(int argc, char** argv) {
  cxxopts::Options options = tokenize_options();
  const cxxopts::ParseResult args = qtk::cli::parse_flags(options, argc, argv);
  if (args.count("help")) {
    qtk::write_stdout(options.help() + "\n");
    return 0;
  }
  qtk::cli::no_extra_arguments(args);
  qtk::cli::require_flag(options, args, "tokenizer");
  // note: 1024 is far above any useful count; a huge one would only spend
  // the run starting threads.
  const int64_t threads_flag = qtk::cli::parse_int_flag(
      "--threads", args["threads"].as<std::string>(), 0, 1024, "0 (all cores) or a thread count");
  const bool decode = args.count("decode") > 0;
  const bool chat = args.count("chat") > 0;
  if (chat && decode) fail("--chat and --decode: expected at most one of them");
  const std::string template_flag =
      args.count("chat-template") ? args["chat-template"].as<std::string>() : "";
  // note: an empty value (an unset variable) would read as no flag: the
  // default template instead of the one meant.
  if (args.count("chat-template") && template_flag.empty())
    fail("--chat-template: expected a file name, found an empty value");
  if (!chat && !template_flag.empty()) fail("--chat-template: only used with --chat");
  const qtk::Tokenizer tokenizer = load_tokenizer(args["tokenizer"].as<std::string>());
  std::optional<qtk::jinja::Template> chat_template;
  qtk::ChatLineContext chat_context;
  if (chat) {
    chat_context = load_chat(args["tokenizer"].as<std::string>(), template_flag, chat_template);
    chat_context.tokenizer = &tokenizer;
  }
  const std::string input_path = args["input"].as<std::string>();
  std::FILE* input = stdin;
  if (input_path != "-") {
    input = std::fopen(input_path.c_str(), "rb");
    if (input == nullptr) fail("{}: cannot open the input: {}", input_path, std::strerror(errno));
    // note: fopen opens a directory for reading; the first read then fails.
    struct stat st {};
    if (::fstat(::fileno(input), &st) == 0 && S_ISDIR(st.st_mode)) {
      std::fclose(input);
      fail("{}: is a directory; expected a JSONL file (or - for stdin)", input_path);
    }
  }
  struct Closer {
    std::FILE* f;
    ~Closer() {
      if (f != stdin) std::fclose(f);
    }
  } closer{input};
  const size_t threads = threads_flag == 0 ? std::max(1u, std::thread::hardware_concurrency())
                                           : static_cast<size_t>(threads_flag);

  const std::string input_name = input_path == "-" ? std::string("stdin") : input_path;
  const LineCounts counts =
      process_lines(input, input_name, threads, [&](const std::string& raw, size_t line_number) {
        // note: a byte order mark opening the file is not part of its first
        // line's JSON (generate reads such a file the same way).
        const std::string stripped =
            line_number == 1 ? std::string(qtk::without_byte_order_mark(raw)) : std::string();
        const std::string& line = line_number == 1 ? stripped : raw;
        return chat ? qtk::chat_tokenize_line(chat_context, line, line_number)
                    : process_line(tokenizer, decode, line, line_number);
      });
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    fail("cannot write the output to stdout: {}", std::strerror(errno));
  // note: as generate and merge: 3 when some line got an error line, with
  // one summary line on stderr, so a script sees the failure.
  if (counts.errors == 0) return 0;
  std::fprintf(stderr, "tokenize: %s: %zu of %zu lines failed (the first: line %zu)\n",
               input_name.c_str(), counts.errors, counts.lines, counts.first_error);
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  qtk::ignore_file_size_signal();
  try {
    const int status = run(argc, argv);
    // note: output lost to a full disk or /dev/full is an error, not exit 0.
    qtk::finish_stdout();
    return status;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "tokenize: %s\n", e.what());
    return 1;
  }
}
