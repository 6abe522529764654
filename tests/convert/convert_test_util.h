// Helpers for convert/pack tests: temp dirs, running the CLI, reading
// source tensors independently of the converter.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace qtk::testing {

inline std::string source_path(const std::string& rel) {
  return std::string(QTK_SOURCE_DIR) + "/" + rel;
}

// Every model the converter must handle (fixtures and samples).
inline std::vector<std::string> all_models() {
  return {"tests/data/models/qwen3-tiny",
          "tests/data/models/qwen3-tiny-sharded-f32",
          "tests/data/models/qwen3.5-tiny",
          "tests/data/models/qwen3.5-tiny-vlm",
          "samples/qwen3-sample",
          "samples/qwen3.5-sample",
          "tests/data/models/qwen3-moe-tiny",
          "tests/data/models/qwen3.5-moe-tiny-vlm"};
}

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("qtk-convert-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }
  // Names of the entries in the directory (hidden ones included).
  std::set<std::string> listing() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      out.insert(e.path().filename().string());
    return out;
  }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

struct RunResult {
  int status = -1;  // exit status, or 128 + signal
  std::string err;  // stderr
  std::string out;  // stdout
};

// Runs a shell command line, capturing stdout and stderr.
inline RunResult run_shell(const std::string& cmd) {
  TempDir io;
  const std::string full =
      "(" + cmd + ") >" + quote(io.file("out")) + " 2>" + quote(io.file("err"));
  const int rc = std::system(full.c_str());
  RunResult r;
  if (rc != -1 && WIFEXITED(rc))
    r.status = WEXITSTATUS(rc);
  else if (rc != -1 && WIFSIGNALED(rc))
    r.status = 128 + WTERMSIG(rc);
  r.out = read_file(io.file("out"));
  r.err = read_file(io.file("err"));
  return r;
}

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const qtk::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a qtk::Error, none was thrown";
  return "";
}

// Copies a directory's regular files (flat).
inline void copy_dir(const std::string& from, const std::string& to) {
  std::filesystem::create_directories(to);
  for (const auto& e : std::filesystem::directory_iterator(from))
    if (e.is_regular_file())
      std::filesystem::copy_file(e.path(), to + "/" + e.path().filename().string());
}

}  // namespace qtk::testing
