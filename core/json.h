// The one JSON reader of qtk: config.json, the shard index, generation
// config, safetensors headers, the pack manifest, prompt lines and
// tokenizer.json all go through JsonReader.
//
// note: nlohmann::json::parse keeps the last value of a duplicated key, so a
// crafted header could show one tensor to one reader and another to us;
// read_value() refuses a duplicated key in any object, naming the key and
// its path. Numbers become the nlohmann values nlohmann's own parser makes
// (a non-negative integer unsigned, a negative one signed, either one a
// double when it does not fit 64 bits; anything with a fraction or exponent
// a double).
//
// note: a pull parser rather than nlohmann's SAX interface: tokenizer.json
// (11 MB) streams its vocabulary and merges straight into the tokenizer's
// tables, and every syntax error can say what the caller expected at that
// point ("an integer for the id of a model.vocab token"). nlohmann's parser
// alone, with a SAX handler that does nothing (json::accept), takes ~45 ms
// on the Qwen3 tokenizer.json; the whole tokenizer load with this reader,
// tables included, takes ~34 ms.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.h"  // find_invalid_utf8, for callers that validate text themselves

namespace qtk {

// Containers open at once; deeper input is refused.
// note: nlohmann's dump() and the DOM's users recurse; a few MB of '[' would
// overflow the stack when a message shows the value. No file we read nests
// deeper than ~6 levels.
constexpr size_t kMaxJsonDepth = 128;

// A JSON value shown in a message: invalid UTF-8 replaced, cut to 80 bytes.
// note: values come from parsers that cap the nesting, so dump() cannot
// recurse deep.
inline std::string shown_json(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// A value as the text of a file we write (indent as nlohmann's dump()).
// note: strings that are not valid UTF-8 (a file name with a byte like 0xff,
// which Linux allows, recorded in a run header or a manifest) get U+FFFD
// for each bad byte instead of nlohmann's type_error.316, which ended the
// run with a library message naming nothing.
inline std::string json_file_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// What the reader does with an integer literal past 64 bits (neither an
// int64 nor a uint64): a double, as nlohmann's parser makes it, or an error.
// note: request lines refuse them: a chat template prints a tool's argument
// with Python's unbounded integers (transformers), and a double would print
// 12345678901234567890123 as 1.2345678901234568e+22, a different prompt.
enum class WideIntegers { kAsDouble, kRefuse };

class JsonReader {
 public:
  // `source` names the text in error messages (a file, "line 3", ...).
  JsonReader(std::string_view text, std::string source,
             WideIntegers wide = WideIntegers::kAsDouble);

  // Object iteration: begin_object(); while (next_member(key)) { read value }
  void begin_object(std::string_view what);
  bool next_member(std::string& key);
  // Array iteration: begin_array(); while (next_element()) { read value }
  void begin_array(std::string_view what);
  bool next_element();

  char peek();  // next non-space character, '\0' at the end
  void read_string(std::string& out, std::string_view what);
  int64_t read_integer(std::string_view what);
  // Any value as a DOM. `path` is the value's JSON pointer ("" for the
  // root), for the message about a duplicated key.
  nlohmann::json read_value(std::string_view path = "");
  void expect_end();

  // Throws qtk::Error: "<source>: invalid JSON at byte N (line L, column C):
  // expected <expected>, found <what is there>".
  [[noreturn]] void fail_here(std::string_view expected) const;
  const std::string& source() const { return source_; }

 private:
  struct PathNode;
  void skip_space();
  void open_container(char bracket, std::string_view what);
  void read_value_into(nlohmann::json& out, const PathNode& at);
  void read_object_into(nlohmann::json& out, const PathNode& at);
  nlohmann::json read_number();
  size_t scan_number(bool& is_integer);
  void read_literal(std::string_view word);
  uint32_t read_hex4();
  [[noreturn]] void fail_duplicate_key(const std::string& key, const PathNode& at) const;

  std::string_view text_;
  std::string source_;
  size_t pos_ = 0;
  // One flag per open container: true until its first member/element.
  std::string first_stack_;
  std::string_view base_path_;  // the read_value() in progress
  WideIntegers wide_ = WideIntegers::kAsDouble;
};

// Parses `text` as one JSON document (UTF-8 validated first). `source` names
// the file in error messages. Throws qtk::Error on invalid UTF-8, a syntax
// error, nesting deeper than kMaxJsonDepth or a duplicated object key.
nlohmann::json parse_json_strict(std::string_view text, const std::string& source,
                                 WideIntegers wide = WideIntegers::kAsDouble);

// Reads and parses a whole JSON file (at most 64 MiB) with parse_json_strict.
nlohmann::json load_json_file(const std::string& path);

}  // namespace qtk
