// Helpers for loader tests: a private temp dir and writers of (possibly
// malformed) files.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "core/error.h"

namespace qtk::testing {

inline std::string source_path(const std::string& rel) {
  return std::string(QTK_SOURCE_DIR) + "/" + rel;
}

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("qtk-loaders-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

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

// The 8-byte little-endian length, the header text, then `data_bytes` bytes
// of data (a counting pattern).
inline std::string safetensors_bytes(const std::string& header, uint64_t data_bytes,
                                     uint64_t declared_length = UINT64_MAX) {
  const uint64_t n = declared_length == UINT64_MAX ? header.size() : declared_length;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  for (uint64_t i = 0; i < data_bytes; ++i) out += static_cast<char>(i & 0xFF);
  return out;
}

// Runs `f`, expects a qtk::Error, and returns its message ("" and a test
// failure when nothing was thrown).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const qtk::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a qtk::Error, none was thrown";
  return "";
}

}  // namespace qtk::testing
