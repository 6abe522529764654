// A read-only memory mapping of a whole file (RAII).
//
// A file truncated (or rewritten in place) while it is mapped makes the next
// read of a page past its new end raise SIGBUS. Each mapping is registered
// with its file name, and a SIGBUS handler (installed with the first mapping)
// turns a fault inside a registered mapping into one line on stderr
// ("PROGRAM: the file PATH changed while it was being read ..."; where the
// file still covers the page, "PROGRAM: cannot read the file PATH: ... (an
// I/O error, or ...)"), unlinks the
// files registered for emergencies (core/interrupt.h: generate's lock file,
// convert's temporary pack) and ends the process with exit status 1. A fault
// anywhere else keeps its previous disposition (the default: a core dump).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace qtk {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only. Throws qtk::Error naming the path on failure, and
  // for anything but a regular file (never waits for a FIFO's writer).
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
  int fault_slot_ = -1;  // its entry in the SIGBUS handler's registry, or -1
  std::string path_;
};

// What kind of file `mode` (st_mode) is, for messages: "a regular file",
// "a directory", "a symbolic link" (from lstat), "a FIFO (named pipe)", "a
// socket", "a character device", "a block device".
const char* describe_file_type(mode_t mode);

// The registry the SIGBUS handler reads (MappedFile uses it; exposed for
// mappings made elsewhere). Registers [begin, begin + bytes) as a read-only
// mapping of `path`; returns its slot, or -1 when the registry is full (1024
// mappings at once; a fault there then keeps the default behaviour).
int register_file_mapping(const void* begin, size_t bytes, const std::string& path);
void unregister_file_mapping(int slot);

}  // namespace qtk
