// Helpers shared by the tokenizer tests.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qtk::test {

inline std::string data_path(const std::string& relative) { return std::string(QTK_SOURCE_DIR) + "/" + relative; }

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

inline const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_file(data_path("tests/data/tokenizer/qwen3/tokenizer.json"));
  return tokenizer;
}

inline const std::string& sample_tokenizer_text() {
  static const std::string text = read_text(data_path("samples/qwen3-sample/tokenizer.json"));
  return text;
}

}  // namespace qtk::test
