#include "runtime/prompt_jsonl.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/json.h"
#include "core/mapped_file.h"  // describe_file_type
#include "runtime/request_fields.h"
#include "tokenizer/chat/chat_request.h"
#include "tokenizer/tokenizer.h"

namespace qtk {

namespace {

const char* type_name(const nlohmann::json& j) { return j.type_name(); }

// A user value for an error message: scalars as written (strings cut at 40
// bytes), containers by type only. note: never dump() a user container —
// nlohmann's dump recurses, and a line nested a million levels deep would
// overflow the stack.
std::string describe(const nlohmann::json& j) {
  if (j.is_number() || j.is_boolean() || j.is_null()) return j.dump();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    return nlohmann::json(s.size() > 40 ? s.substr(0, 40) + "..." : s)
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return type_name(j);
}

// Reads an integer token id list; returns an error message or "".
std::string read_ids(const nlohmann::json& j, const char* field, int64_t vocab,
                     std::vector<int32_t>& out) {
  if (!j.is_array())
    return fmt::format("field '{}': expected an array of token ids, found {}", field, type_name(j));
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    if (!e.is_number_integer()) {
      return fmt::format("field '{}'[{}]: expected an integer token id, found {}", field, i,
                         describe(e));
    }
    // note: an id past INT64_MAX is an unsigned JSON number; get<int64_t>
    // would wrap it to a negative one.
    const bool in_vocab = e.is_number_unsigned()
                              ? e.get<uint64_t>() < static_cast<uint64_t>(vocab)
                              : e.get<int64_t>() >= 0 && e.get<int64_t>() < vocab;
    if (!in_vocab) {
      return fmt::format("field '{}'[{}]: unknown token id {} (the vocabulary has ids 0..{})",
                         field, i, e.dump(), vocab - 1);
    }
    out.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return {};
}

// max_tokens, or its synonym max_new_tokens (the fixtures' and
// transformers' name); both given must agree.
std::string read_max_tokens(const nlohmann::json& doc, const PromptDefaults& d, int64_t& out) {
  out = d.max_tokens;
  const nlohmann::json* given = nullptr;
  for (const char* name : {"max_tokens", "max_new_tokens"}) {
    auto it = doc.find(name);
    if (it == doc.end()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 1)
      return fmt::format("field '{}': expected a positive integer, found {}", name, describe(*it));
    if (given != nullptr && *given != *it) {
      return fmt::format(
          "fields 'max_tokens' ({}) and 'max_new_tokens' ({}) differ; expected one of them, or "
          "the same value in both",
          describe(*given), describe(*it));
    }
    given = &*it;
    out = it->get<int64_t>();
  }
  return {};
}

// An error for the first field not in kRequestFields (or, with
// allow_unknown_fields, their names in `ignored`).
std::string check_fields(const nlohmann::json& doc, const PromptDefaults& d,
                         std::vector<std::string>& ignored) {
  const bool chat = doc.contains("messages");
  for (const auto& [key, value] : doc.items()) {
    // note: a chat field on a 'prompt' or 'prompt_token_ids' line would be
    // ignored without a word (no template renders that line).
    const bool chat_only = !chat && is_chat_field(key);
    if (!chat_only && is_request_field(key)) continue;
    if (d.allow_unknown_fields) {
      ignored.push_back(key);
      continue;
    }
    if (chat_only) {
      return fmt::format(
          "field '{}' is for chat requests ('messages'), and this line has none; it would be "
          "ignored (pass --allow-unknown-fields to ignore such fields)",
          key);
    }
    return fmt::format(
        "unknown field '{}' (generate does greedy decoding and knows only: {}; chat requests: {}); "
        "pass --allow-unknown-fields to ignore such fields",
        printable_message(key.size() > 40 ? key.substr(0, 40) + "..." : key),
        fmt::join(kRequestFields, ", "), fmt::join(chat::kChatRequestFields, ", "));
  }
  return {};
}

std::string parse_body(const nlohmann::json& doc, const PromptDefaults& d, PromptLine& out) {
  SequenceRequest& r = out.request;
  const bool has_text = doc.contains("prompt") || out.is_chat;
  const bool has_ids = doc.contains("prompt_token_ids");
  if (has_text == has_ids) {
    return has_text ? "both 'prompt' and 'prompt_token_ids' given; expected exactly one"
                    : "missing 'prompt', 'prompt_token_ids' or 'messages'";
  }
  if (has_text) {
    // a chat request's rendered text is tokenized like a prompt
    const char* field = out.is_chat ? "messages" : "prompt";
    if (!out.is_chat && !doc["prompt"].is_string())
      return fmt::format("field 'prompt': expected a string, found {}", type_name(doc["prompt"]));
    if (d.tokenizer == nullptr) {
      return fmt::format(
          "field '{}': this pack has no tokenizer.json; give 'prompt_token_ids' instead", field);
    }
    try {
      r.prompt = d.tokenizer->encode(out.is_chat ? out.chat_prompt
                                                 : doc["prompt"].get_ref<const std::string&>());
    } catch (const Error& e) {
      return fmt::format("field '{}': {}", field, e.what());
    }
    for (int32_t id : r.prompt) {
      if (id < 0 || id >= d.vocab_size) {
        return fmt::format(
            "field '{}': the tokenizer produced id {} outside the model's "
            "vocabulary of {}",
            field, id, d.vocab_size);
      }
    }
  } else {
    if (auto e = read_ids(doc["prompt_token_ids"], "prompt_token_ids", d.vocab_size, r.prompt);
        !e.empty()) {
      return e;
    }
  }
  if (r.prompt.empty()) {
    return out.is_chat ? "empty prompt: the chat template rendered these messages as no text"
                       : "empty prompt: expected at least one token";
  }
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (n + 1 > d.max_context) {
    return fmt::format(
        "prompt has {} tokens; over the context length of {} (prompt plus one "
        "generated token must fit)",
        n, d.max_context);
  }

  if (auto e = read_max_tokens(doc, d, r.max_tokens); !e.empty()) return e;
  bool ignore_eos = d.ignore_eos;
  if (auto it = doc.find("ignore_eos"); it != doc.end()) {
    if (!it->is_boolean())
      return fmt::format("field 'ignore_eos': expected true or false, found {}", describe(*it));
    ignore_eos = ignore_eos || it->get<bool>();
  }
  if (!ignore_eos) r.stop_ids = d.eos_ids;
  if (auto it = doc.find("stop_token_ids"); it != doc.end()) {
    std::vector<int32_t> stops;
    if (auto e = read_ids(*it, "stop_token_ids", d.vocab_size, stops); !e.empty()) return e;
    r.stop_ids.insert(r.stop_ids.end(), stops.begin(), stops.end());
  }
  if (auto it = doc.find("mrope_position_ids"); it != doc.end()) {
    if (!d.allow_mrope) return "field 'mrope_position_ids': this model does not use M-RoPE";
    const auto& m = *it;
    if (!m.is_array() || m.size() != 3) {
      return fmt::format(
          "field 'mrope_position_ids': expected 3 arrays (temporal, height, width), "
          "found {}",
          m.is_array() ? std::to_string(m.size()) + " entries" : type_name(m));
    }
    r.mrope_positions.resize(3 * n);
    for (size_t a = 0; a < 3; ++a) {
      if (!m[a].is_array() || static_cast<int64_t>(m[a].size()) != n) {
        return fmt::format(
            "field 'mrope_position_ids'[{}]: expected {} positions (one per prompt "
            "token), found {}",
            a, n, m[a].is_array() ? std::to_string(m[a].size()) : type_name(m[a]));
      }
      for (int64_t i = 0; i < n; ++i) {
        const auto& e = m[a][i];
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= d.max_context) {
          return fmt::format(
              "field 'mrope_position_ids'[{}][{}]: expected an integer in 0..{}, found {}", a, i,
              d.max_context - 1, describe(e));
        }
        r.mrope_positions[a * n + i] = static_cast<int32_t>(e.get<int64_t>());
      }
    }
  }
  return {};
}

// ---- chat requests (issue 25) ----
// Renders a "messages" line into `rendered`; returns "" or the line's error.
std::string render_chat_line(std::string_view text, const nlohmann::json& doc,
                             const PromptDefaults& d, std::string& rendered) {
  for (const char* other : {"prompt", "prompt_token_ids"}) {
    if (doc.contains(other))
      return fmt::format("both 'messages' and '{}' given; expected exactly one", other);
  }
  if (d.chat_template == nullptr)
    return fmt::format("field 'messages': {}", d.chat_template_missing);
  // note: parsed again with key order kept (the strict parse above sorts
  // keys, and tojson must print tool schemas in the order given); the
  // strict parse already bounded its depth and checked its UTF-8.
  nlohmann::ordered_json line;
  try {
    line = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return fmt::format("malformed JSON: {}", e.what());
  }
  chat::ChatRequest req;
  if (auto e = chat::read_chat_request(line, req); !e.empty()) return e;
  try {
    rendered = chat::render_chat(*d.chat_template, req, d.chat_special_tokens);
  } catch (const jinja::TemplateError& e) {
    return chat::describe_template_error(e);
  }
  return {};
}
// ---- end chat requests ----

}  // namespace

namespace {

// The line's request, or its error (the JSON parser's opens with the line
// number; parse_prompt_line adds it to the others).
PromptLine parse_line_fields(std::string_view text, int64_t line_no, const PromptDefaults& d) {
  // note: compare and tokenize skip the byte order mark too.
  if (line_no == 1) text = without_byte_order_mark(text);
  PromptLine out;
  out.line_no = line_no;
  out.id = line_no;
  // note: a blank line keeps its place (an error line of its own, so that
  // output line N is input line N), named as what it is.
  if (text.find_first_not_of(" \t\r") == std::string_view::npos) {
    out.error = "blank line; expected a JSON object (a prompt line)";
    return out;
  }
  // note: a raw NUL byte is never valid JSON (inside a string it must be
  // written \u0000); the JSON parser would stop at it and silently drop the
  // rest of the line.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    out.error = fmt::format(
        "malformed JSON: a raw NUL byte at byte {} (JSON text never contains one; inside a "
        "string write \\u0000)",
        nul + 1);
    return out;
  }
  nlohmann::json doc;
  try {
    // note: the strict parser validates UTF-8 first, refuses duplicate keys
    // and nesting deeper than 128 levels (a bounded DOM for what follows).
    doc = parse_json_strict(text, fmt::format("line {}", line_no), WideIntegers::kRefuse);
  } catch (const Error& e) {
    out.error = e.what();
    return out;
  }
  if (!doc.is_object()) {
    out.error = fmt::format("expected a JSON object, found {}", type_name(doc));
    return out;
  }
  if (auto it = doc.find("id"); it != doc.end()) {
    if (!it->is_string() && !it->is_number_integer()) {
      out.error =
          fmt::format("field 'id': expected a string or an integer, found {}", describe(*it));
      return out;
    }
    out.id = *it;
    out.id_given = true;
  }
  // note: before a chat line is rendered, so that an unknown field is
  // reported as such on chat and plain lines alike.
  out.error = check_fields(doc, d, out.ignored_fields);
  if (!out.error.empty()) return out;
  // ---- chat requests (issue 25): "messages" rendered with the chat template ----
  if (doc.contains("messages")) {
    out.is_chat = true;
    out.error = render_chat_line(text, doc, d, out.chat_prompt);
    if (!out.error.empty()) return out;
  }
  // ---- end chat requests ----
  out.error = parse_body(doc, d, out);
  return out;
}

}  // namespace

// note: every error opens with "line N: ", whatever found it: output line N
// is input line N, but an error is often read away from its file (a log, a
// summary), where the line number is what finds the culprit.
PromptLine parse_prompt_line(std::string_view text, int64_t line_no, const PromptDefaults& d) {
  PromptLine out = parse_line_fields(text, line_no, d);
  const std::string prefix = fmt::format("line {}: ", line_no);
  if (!out.error.empty() && out.error.rfind(prefix, 0) != 0) out.error = prefix + out.error;
  return out;
}

std::string result_line(const nlohmann::json& id, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, bool stopped, const std::string* text,
                        const std::vector<float>* margins, const std::string* prompt_text) {
  std::string s = fmt::format("{{\"id\": {}", id.dump());
  if (prompt_text != nullptr) {
    s += ", \"prompt\": ";
    s +=
        nlohmann::json(*prompt_text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  s += fmt::format(
      ", \"prompt_token_ids\": [{}], \"output_token_ids\": [{}], \"finish_reason\": \"{}\"",
      fmt::join(prompt, ", "), fmt::join(output, ", "), stopped ? "stop" : "length");
  if (text != nullptr) {
    // note: replace, not throw, on invalid UTF-8 (a decode may cut a
    // character in half at the length limit; the tokenizer already maps
    // that to U+FFFD, this is a second guard).
    s += ", \"output_text\": " +
         nlohmann::json(*text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (margins != nullptr) {
    s += ", \"top1_margin\": [";
    for (size_t i = 0; i < margins->size(); ++i) {
      if (i) s += ", ";
      const float m = (*margins)[i];
      // note: {} prints the shortest text that reads back to the same float.
      s += std::isfinite(m) ? fmt::format("{}", m) : std::string("null");
    }
    s += "]";
  }
  s += "}";
  return s;
}

void append_logprobs(std::string& line, const std::vector<int32_t>& ids,
                     const std::vector<float>& logprobs, int k) {
  line.pop_back();  // the closing '}'
  line += ", \"logprobs\": [";
  const size_t steps = k > 0 ? ids.size() / static_cast<size_t>(k) : 0;
  for (size_t s = 0; s < steps; ++s) {
    line += s ? ", [" : "[";
    for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
      const size_t at = s * static_cast<size_t>(k) + j;
      const float lp = logprobs[at];
      // note: {} prints the shortest text that reads back to the same float;
      // a logit of -inf gives a logprob of -inf, written null as in margins.
      line += fmt::format("{}[{}, {}]", j ? ", " : "", ids[at],
                          std::isfinite(lp) ? fmt::format("{}", lp) : std::string("null"));
    }
    line += "]";
  }
  line += "]}";
}

bool reads_once(const std::string& path) {
  if (path == "-") return true;
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

std::string read_input_text(const std::string& path, const char* what, InputFile accept) {
  const bool from_stdin = path == "-";
  const std::string name = from_stdin ? "stdin" : path;
  const bool regular_only = accept == InputFile::kRegularOnly;
  auto refuse_kind = [&](mode_t mode) {
    fail("{}: expected a regular file for {}, found {}", name, what, describe_file_type(mode));
  };
  int fd = STDIN_FILENO;
  if (!from_stdin) {
    // note: checked before the open too: a socket cannot be opened (ENXIO).
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) fail("{}: is a directory; expected {}", path, what);
      if (regular_only && !S_ISREG(st.st_mode)) refuse_kind(st.st_mode);
    }
    // note: O_NONBLOCK: a blocking open of a FIFO waits for a writer, and
    // generate's signals restart it (core/interrupt.h); the waiting is done
    // in wait_for_input instead. The open file description is ours alone.
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail_errno(fmt::format("{}: cannot open {} for reading", path, what));
  }
  const std::unique_ptr<int, void (*)(int*)> closer(from_stdin ? nullptr : &fd,
                                                    [](int* f) { ::close(*f); });
  std::string text;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("{}: is a directory; expected {}", name, what);
    if (regular_only && !S_ISREG(st.st_mode)) refuse_kind(st.st_mode);
    if (S_ISREG(st.st_mode) && st.st_size > 0) text.reserve(static_cast<size_t>(st.st_size));
  } else if (regular_only) {
    fail_errno(fmt::format("{}: cannot stat {}", name, what));
  }
  std::vector<char> buf(size_t{1} << 20);
  while (true) {
    // note: also for a regular file (it never waits there): a signal that
    // came while the model loaded stops the run before a long read.
    if (!wait_for_input(fd))
      fail("{}: interrupted by {} while reading {}; nothing was written", name,
           signal_name(interrupt_signal()), what);
    // note: for a FIFO opened O_NONBLOCK, 0 before any writer came would
    // read as its end; wait_for_input returns only once one has written or
    // gone (POLLIN, POLLHUP).
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n > 0) {
      text.append(buf.data(), static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR && errno != EAGAIN) {
      fail_errno(fmt::format("{}: cannot read {}", name, what));
    }
  }
  return text;
}

std::string error_line(const nlohmann::json& id, const std::string& error) {
  return fmt::format(
      "{{\"id\": {}, \"error\": {}}}", id.dump(),
      nlohmann::json(error).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace qtk
