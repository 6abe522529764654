#include "tokenizer/json_reader.h"

#include <charconv>
#include <cstring>

#include "core/error.h"
#include "tokenizer/unicode_classes.h"

namespace qtk {
namespace {
constexpr int kMaxDepth = 128;

std::string describe_char(std::string_view text, size_t pos) {
  if (pos >= text.size()) return "the end of the file";
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  if (c >= 0x20 && c < 0x7F) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("byte 0x{:02X}", c);
}
}  // namespace

JsonReader::JsonReader(std::string_view text, std::string source)
    : text_(text), source_(std::move(source)) {}

void JsonReader::fail_here(std::string_view expected) const {
  fail("{}: invalid JSON at byte {}: expected {}, found {}", source_, pos_, expected,
       describe_char(text_, pos_));
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

void JsonReader::begin_object(std::string_view what) {
  if (peek() != '{') fail_here(fmt::format("an object for {}", what));
  ++pos_;
  first_stack_.push_back(1);
}

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

void JsonReader::begin_array(std::string_view what) {
  if (peek() != '[') fail_here(fmt::format("an array for {}", what));
  ++pos_;
  first_stack_.push_back(1);
}

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

bool JsonReader::read_null_if_present() {
  if (peek() != 'n') return false;
  read_literal("null");
  return true;
}

void JsonReader::read_literal(std::string_view word) {
  if (text_.substr(pos_, word.size()) != word) fail_here(fmt::format("'{}'", word));
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
            unicode::utf8_sequence_length(reinterpret_cast<const unsigned char*>(s) + run, n - run);
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
        unicode::append_utf8(out, cp);
        break;
      }
      default:
        --pos_;
        fail_here("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
    }
  }
}

int64_t JsonReader::read_integer(std::string_view what) {
  skip_space();
  size_t end = pos_;
  if (end < text_.size() && text_[end] == '-') ++end;
  while (end < text_.size() && text_[end] >= '0' && text_[end] <= '9') ++end;
  int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text_.data() + pos_, text_.data() + end, value);
  if (ec != std::errc() || ptr == text_.data() + pos_ ||
      (end < text_.size() && (text_[end] == '.' || text_[end] == 'e' || text_[end] == 'E'))) {
    fail_here(fmt::format("an integer for {}", what));
  }
  pos_ = end;
  return value;
}

nlohmann::json JsonReader::read_value() { return read_value(0); }

nlohmann::json JsonReader::read_value(int depth) {
  if (depth > kMaxDepth) fail_here(fmt::format("at most {} levels of nesting", kMaxDepth));
  const char c = peek();
  switch (c) {
    case '{': {
      begin_object("a value");
      nlohmann::json obj = nlohmann::json::object();
      std::string key;
      while (next_member(key)) obj[key] = read_value(depth + 1);
      return obj;
    }
    case '[': {
      begin_array("a value");
      nlohmann::json arr = nlohmann::json::array();
      while (next_element()) arr.push_back(read_value(depth + 1));
      return arr;
    }
    case '"': {
      std::string s;
      read_string(s, "a value");
      return s;
    }
    case 't':
      read_literal("true");
      return true;
    case 'f':
      read_literal("false");
      return false;
    case 'n':
      read_literal("null");
      return nullptr;
    default:
      break;
  }
  // A number: integers stay integers, anything else is parsed as double.
  const size_t start = pos_;
  size_t end = pos_;
  bool is_float = false;
  while (end < text_.size()) {
    const char d = text_[end];
    if ((d >= '0' && d <= '9') || d == '-' || d == '+') {
    } else if (d == '.' || d == 'e' || d == 'E') {
      is_float = true;
    } else {
      break;
    }
    ++end;
  }
  if (end == start) fail_here("a JSON value");
  if (!is_float) {
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(text_.data() + start, text_.data() + end, v);
    if (ec == std::errc() && ptr == text_.data() + end) {
      pos_ = end;
      return v;
    }
  }
  double v = 0;
  const auto [ptr, ec] = std::from_chars(text_.data() + start, text_.data() + end, v);
  if (ec != std::errc() || ptr != text_.data() + end) fail_here("a JSON number");
  pos_ = end;
  return v;
}

void JsonReader::expect_end() {
  if (peek() != '\0' || pos_ < text_.size())
    fail_here("the end of the file after the top-level object");
}

}  // namespace qtk
