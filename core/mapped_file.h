// A read-only memory mapping of a whole file (RAII).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qtk {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only. Throws qtk::Error naming the path on failure.
  // An empty file maps to data() == nullptr, size() == 0.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace qtk
