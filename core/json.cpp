#include "core/json.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/read_file.h"
#include "core/utf8.h"

namespace qtk {
namespace {

using nlohmann::json;

std::string describe_char(std::string_view text, size_t pos) {
  if (pos >= text.size()) return "the end of the file";
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  if (c >= 0x20 && c < 0x7F) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("byte 0x{:02X}", c);
}

// "line L, column C" of byte `pos`, both counted from 1; "column C" in a
// text of one line (a JSON Lines line: "line 1" would contradict the file
// line its caller names).
// note: computed only for a message, so the reader never tracks lines.
std::string line_and_column(std::string_view text, size_t pos) {
  pos = std::min(pos, text.size());
  if (text.find('\n') == std::string_view::npos) return fmt::format("column {}", pos + 1);
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') ++line, line_start = i + 1;
  }
  return fmt::format("line {}, column {}", line, pos - line_start + 1);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

// The JSON pointer of the value being read, as a chain on the C++ stack:
// `key` for an object member, `index` for an array element; the root has
// no parent.
struct JsonReader::PathNode {
  const PathNode* parent;
  const std::string* key;
  size_t index;
};

JsonReader::JsonReader(std::string_view text, std::string source, WideIntegers wide)
    : text_(text), source_(std::move(source)), wide_(wide) {}

void JsonReader::fail_here(std::string_view expected) const {
  fail("{}: invalid JSON at byte {} ({}): expected {}, found {}", source_, pos_,
       line_and_column(text_, pos_), expected, describe_char(text_, pos_));
}

void JsonReader::skip_space() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
    ++pos_;
  }
}

char JsonReader::peek() {
  skip_space();
  return pos_ < text_.size() ? text_[pos_] : '\0';
}

void JsonReader::open_container(char bracket, std::string_view what) {
  if (peek() != bracket)
    fail_here(fmt::format("{} for {}", bracket == '{' ? "an object" : "an array", what));
  if (first_stack_.size() >= kMaxJsonDepth) {
    fail("{}: expected JSON nested at most {} levels deep, found deeper nesting at byte {} ({})",
         source_, kMaxJsonDepth, pos_, line_and_column(text_, pos_));
  }
  ++pos_;
  first_stack_.push_back(1);
}

void JsonReader::begin_object(std::string_view what) { open_container('{', what); }

bool JsonReader::next_member(std::string& key) {
  const bool first = first_stack_.back() != 0;
  char c = peek();
  if (c == '}') {
    ++pos_;
    first_stack_.pop_back();
    return false;
  }
  if (!first) {
    if (c != ',') fail_here("',' or '}'");
    ++pos_;
    c = peek();
  }
  first_stack_.back() = 0;
  if (c != '"') fail_here("a member name in quotes");
  key.clear();
  read_string(key, "a member name");
  if (peek() != ':') fail_here("':'");
  ++pos_;
  return true;
}

void JsonReader::begin_array(std::string_view what) { open_container('[', what); }

bool JsonReader::next_element() {
  const bool first = first_stack_.back() != 0;
  const char c = peek();
  if (c == ']') {
    ++pos_;
    first_stack_.pop_back();
    return false;
  }
  if (!first) {
    if (c != ',') fail_here("',' or ']'");
    ++pos_;
  }
  first_stack_.back() = 0;
  return true;
}

void JsonReader::read_literal(std::string_view word) {
  if (text_.substr(pos_, word.size()) != word) {
    // note: the word as written ("not json"), not just its first letter: the
    // reader was not expecting `word` in particular, only some value.
    size_t end = pos_;
    while (end < text_.size() && end - pos_ < 24 &&
           (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_'))
      ++end;
    fail(
        "{}: invalid JSON at byte {} ({}): expected a JSON value, found '{}' (the only value "
        "starting with '{}' is {})",
        source_, pos_, line_and_column(text_, pos_), text_.substr(pos_, end - pos_), word[0], word);
  }
  pos_ += word.size();
}

uint32_t JsonReader::read_hex4() {
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) {
    if (pos_ >= text_.size()) fail_here("4 hex digits after \\u");
    const char c = text_[pos_];
    uint32_t d;
    if (c >= '0' && c <= '9')
      d = static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = static_cast<uint32_t>(c - 'A' + 10);
    else
      fail_here("4 hex digits after \\u");
    v = v * 16 + d;
    ++pos_;
  }
  return v;
}

void JsonReader::read_string(std::string& out, std::string_view what) {
  if (peek() != '"') fail_here(fmt::format("a string for {}", what));
  ++pos_;
  const char* s = text_.data();
  const size_t n = text_.size();
  for (;;) {
    // Copy the plain run up to the next quote, backslash or control byte.
    // note: UTF-8 is checked here, inside strings, where the bytes are read
    // anyway; outside strings any non-ASCII byte is a syntax error.
    size_t run = pos_;
    while (run < n) {
      const unsigned char c = static_cast<unsigned char>(s[run]);
      if (c >= 0x80) {
        const size_t len =
            utf8_sequence_length(reinterpret_cast<const unsigned char*>(s) + run, n - run);
        if (len == 0) {
          fail("{}: invalid JSON: byte {} is not valid UTF-8 (found byte 0x{:02X})", source_, run,
               c);
        }
        run += len;
        continue;
      }
      if (c == '"' || c == '\\' || c < 0x20) break;
      ++run;
    }
    out.append(s + pos_, run - pos_);
    pos_ = run;
    if (pos_ >= n) fail_here("the closing '\"' of a string");
    const char c = s[pos_];
    if (c == '"') {
      ++pos_;
      return;
    }
    if (c != '\\')
      fail_here("an escaped control character (raw control bytes are not allowed in strings)");
    ++pos_;
    if (pos_ >= n) fail_here("an escape character");
    const char e = s[pos_++];
    switch (e) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        uint32_t cp = read_hex4();
        if (cp >= 0xDC00 && cp <= 0xDFFF) fail_here("a high surrogate before a low surrogate");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (text_.substr(pos_, 2) != "\\u") fail_here("a low surrogate after a high surrogate");
          pos_ += 2;
          const uint32_t low = read_hex4();
          if (low < 0xDC00 || low > 0xDFFF) fail_here("a low surrogate after a high surrogate");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        append_utf8(out, cp);
        break;
      }
      default:
        --pos_;
        fail_here("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
    }
  }
}

// The end of the number at pos_ (RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?),
// or pos_ itself when no number starts there; `is_integer` is set when it has
// neither fraction nor exponent. Fails on a malformed number.
size_t JsonReader::scan_number(bool& is_integer) {
  const size_t n = text_.size();
  size_t p = pos_;
  if (p < n && text_[p] == '-') ++p;
  if (p >= n || !is_digit(text_[p])) {
    if (p == pos_) return pos_;
    pos_ = p;
    fail_here("a digit after '-'");
  }
  if (text_[p] == '0') {
    ++p;
    if (p < n && is_digit(text_[p])) {
      pos_ = p;
      fail_here("no digit after a leading 0 (JSON numbers have no leading zeros)");
    }
  } else {
    while (p < n && is_digit(text_[p])) ++p;
  }
  is_integer = true;
  if (p < n && text_[p] == '.') {
    is_integer = false;
    ++p;
    if (p >= n || !is_digit(text_[p])) {
      pos_ = p;
      fail_here("a digit after the decimal point");
    }
    while (p < n && is_digit(text_[p])) ++p;
  }
  if (p < n && (text_[p] == 'e' || text_[p] == 'E')) {
    is_integer = false;
    ++p;
    if (p < n && (text_[p] == '+' || text_[p] == '-')) ++p;
    if (p >= n || !is_digit(text_[p])) {
      pos_ = p;
      fail_here("a digit in the exponent");
    }
    while (p < n && is_digit(text_[p])) ++p;
  }
  return p;
}

int64_t JsonReader::read_integer(std::string_view what) {
  skip_space();
  bool is_integer = false;
  const size_t end = scan_number(is_integer);
  int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text_.data() + pos_, text_.data() + end, value);
  if (end == pos_ || !is_integer || ec != std::errc())
    fail_here(fmt::format("an integer for {}", what));
  pos_ = end;
  return value;
}

// note: the values nlohmann's parser makes: unsigned for a non-negative
// integer, signed for a negative one, double past 64 bits or with a fraction
// or exponent (safetensors offsets are checked with is_number_unsigned()).
json JsonReader::read_number() {
  bool is_integer = false;
  const size_t end = scan_number(is_integer);
  if (end == pos_) fail_here("a JSON value");
  const char* first = text_.data() + pos_;
  const char* last = text_.data() + end;
  if (is_integer) {
    if (*first == '-') {
      int64_t v = 0;
      if (std::from_chars(first, last, v).ec == std::errc()) {
        pos_ = end;
        return v;
      }
    } else {
      uint64_t v = 0;
      if (std::from_chars(first, last, v).ec == std::errc()) {
        pos_ = end;
        return v;
      }
    }
  }
  if (is_integer && wide_ == WideIntegers::kRefuse)
    fail(
        "{}: invalid JSON at byte {} ({}): the integer {} does not fit 64 bits (integers in a "
        "request must; write a string for a larger number)",
        source_, pos_, line_and_column(text_, pos_),
        std::string_view(first, std::min<size_t>(static_cast<size_t>(last - first), 40)));
  double v = 0;
  if (std::from_chars(first, last, v).ec == std::errc::result_out_of_range) {
    // note: from_chars refuses a value that rounds to zero; strtod (what
    // nlohmann uses) gives 0 or a subnormal, and an infinity when too large.
    v = std::strtod(std::string(first, last).c_str(), nullptr);
  }
  if (!std::isfinite(v)) fail_here("a number within the range of a double");
  pos_ = end;
  return v;
}

void JsonReader::fail_duplicate_key(const std::string& key, const PathNode& at) const {
  std::vector<std::string> parts;
  for (const PathNode* node = &at; node->parent != nullptr; node = node->parent)
    parts.push_back(node->key != nullptr ? *node->key : std::to_string(node->index));
  std::string path(base_path_);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    path += '/';
    path += *it;
  }
  if (path.empty()) path.push_back('/');
  fail("{}: duplicate JSON key '{}' in object {} (each key may appear once)", source_, key, path);
}

void JsonReader::read_object_into(json& out, const PathNode& at) {
  begin_object("a value");
  out = json::object();
  auto& members = out.get_ref<json::object_t&>();
  std::string key;
  while (next_member(key)) {
    const auto [it, inserted] = members.emplace(key, nullptr);
    if (!inserted) fail_duplicate_key(key, at);
    read_value_into(it->second, PathNode{&at, &it->first, 0});
  }
}

// note: recursion is bounded by kMaxJsonDepth (open_container refuses
// deeper input), so a hostile file cannot overflow the stack.
void JsonReader::read_value_into(json& out, const PathNode& at) {
  switch (peek()) {
    case '{':
      read_object_into(out, at);
      return;
    case '[': {
      begin_array("a value");
      out = json::array();
      for (size_t i = 0; next_element(); ++i) {
        out.push_back(nullptr);
        read_value_into(out.back(), PathNode{&at, nullptr, i});
      }
      return;
    }
    case '"': {
      std::string s;
      read_string(s, "a value");
      out = std::move(s);
      return;
    }
    case 't':
      read_literal("true");
      out = true;
      return;
    case 'f':
      read_literal("false");
      out = false;
      return;
    case 'n':
      read_literal("null");
      out = nullptr;
      return;
    default:
      out = read_number();
  }
}

json JsonReader::read_value(std::string_view path) {
  base_path_ = path;
  json out;
  read_value_into(out, PathNode{nullptr, nullptr, 0});
  base_path_ = {};
  return out;
}

void JsonReader::expect_end() {
  if (peek() != '\0' || pos_ < text_.size())
    fail_here("the end of the file after the top-level value");
}

json parse_json_strict(std::string_view text, const std::string& source, WideIntegers wide) {
  const size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    fail("{}: expected UTF-8 JSON, found an invalid UTF-8 byte sequence at byte {}", source, bad);
  JsonReader reader(text, source, wide);
  json root = reader.read_value();
  reader.expect_end();
  return root;
}

json load_json_file(const std::string& path) {
  // note: JSON side files (config, index, generation config) are small; the
  // cap keeps a wrong path (a weights file) from being read into memory.
  constexpr uint64_t kMaxJsonBytes = 64ull << 20;
  return parse_json_strict(read_file_text(path, "a JSON file", kMaxJsonBytes), path);
}

}  // namespace qtk
