// A small pull parser for tokenizer.json.
//
// note: nlohmann::json builds a DOM of the 11 MB Qwen3 file in ~200 ms, most
// of it allocating 300k small objects for the vocabulary and merges. This
// reader streams those two sections straight into the tokenizer's tables and
// builds nlohmann::json values only for the small configuration objects.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace qtk {

class JsonReader {
 public:
  // `source` names the file in error messages.
  JsonReader(std::string_view text, std::string source);

  // Object iteration: begin_object(); while (next_member(key)) { read value }
  void begin_object(std::string_view what);
  bool next_member(std::string& key);
  // Array iteration: begin_array(); while (next_element()) { read value }
  void begin_array(std::string_view what);
  bool next_element();

  char peek();  // next non-space character, '\0' at the end
  bool read_null_if_present();
  void read_string(std::string& out, std::string_view what);
  int64_t read_integer(std::string_view what);
  nlohmann::json read_value();
  void expect_end();

  [[noreturn]] void fail_here(std::string_view expected) const;
  const std::string& source() const { return source_; }

 private:
  void skip_space();
  nlohmann::json read_value(int depth);
  void read_literal(std::string_view word);
  uint32_t read_hex4();

  std::string_view text_;
  std::string source_;
  size_t pos_ = 0;
  // One flag per open container: true until its first member/element.
  std::string first_stack_;
};

}  // namespace qtk
